// The bodies of the non-template functions declared in <corocoll/core/async_scope.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/async_scope.hpp>

COROCOLL_BEGIN_NAMESPACE

COROCOLL_DECL std::coroutine_handle<> async_scope::child_done() noexcept {
    running_.fetch_sub(1, std::memory_order_release);
    if (count_.fetch_sub(1, std::memory_order_acq_rel) == 1) return joiner_;
    return std::noop_coroutine();
}

COROCOLL_END_NAMESPACE
