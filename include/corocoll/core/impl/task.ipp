// The bodies of the non-template functions declared in <corocoll/core/task.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/task.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL bool task_promise_base::start(std::coroutine_handle<> self,
                                            std::coroutine_handle<> continuation) noexcept {
    continuation_ = continuation;
    self.resume();
    return !ready_.exchange(true, std::memory_order_acq_rel);
}

}  // namespace detail

COROCOLL_END_NAMESPACE
