// The bodies of the non-template functions declared in <corocoll/core/event_loop.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/event_loop.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL event_loop*& event_loop::current_ref() noexcept {
    thread_local event_loop* current = nullptr;
    return current;
}

}  // namespace detail

COROCOLL_END_NAMESPACE
