// The bodies of the non-template functions declared in <corocoll/core/error.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/error.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL std::string error_category_impl::message(int code) const {
    switch (static_cast<errc>(code)) {
        case errc::connection_closed:
            return "connection closed by peer";
        case errc::message_too_large:
            return "message too large";
        case errc::protocol_error:
            return "protocol error";
    }
    return "unknown corocoll error";
}

}  // namespace detail

COROCOLL_DECL const std::error_category& error_category() noexcept {
    static const detail::error_category_impl category;
    return category;
}

namespace detail {

COROCOLL_DECL std::string context_of(const std::system_error& e) {
    std::string text = e.what();
    std::string suffix = ": " + e.code().message();
    if (text.size() >= suffix.size() &&
        text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0) {
        text.resize(text.size() - suffix.size());
    }
    return text;
}

}  // namespace detail

COROCOLL_END_NAMESPACE
