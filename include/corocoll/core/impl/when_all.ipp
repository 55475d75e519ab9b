// The bodies of the non-template functions declared in <corocoll/core/when_all.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/when_all.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL bool when_all_latch::parent_started(std::coroutine_handle<> parent) noexcept {
    parent_ = parent;
    return count_.fetch_sub(1, std::memory_order_acq_rel) != 1;
}

COROCOLL_DECL std::coroutine_handle<> when_all_latch::child_done() noexcept {
    if (count_.fetch_sub(1, std::memory_order_acq_rel) == 1) return parent_;
    return std::noop_coroutine();
}

}  // namespace detail

COROCOLL_END_NAMESPACE
