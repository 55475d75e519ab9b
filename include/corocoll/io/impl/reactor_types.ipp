// The bodies of the non-template functions declared in <corocoll/io/reactor_types.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/io/reactor_types.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace io {

COROCOLL_DECL std::chrono::microseconds reactor_options::default_busy_poll() noexcept {
    static const std::chrono::microseconds value = [] {
        const char* text = std::getenv("COROCOLL_BUSY_POLL_US");
        if (text == nullptr || *text == '\0') return std::chrono::microseconds(50);
        char* end = nullptr;
        long v = std::strtol(text, &end, 10);
        if (*end != '\0' || v < 0) return std::chrono::microseconds(50);
        return std::chrono::microseconds(v);
    }();
    return value;
}

}  // namespace io

COROCOLL_END_NAMESPACE
