// The bodies of the non-template functions declared in <corocoll/core/task.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/task.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL task_promise_base*& task_promise_base::innermost_start() noexcept {
    thread_local task_promise_base* current = nullptr;
    return current;
}

COROCOLL_DECL bool task_promise_base::start(std::coroutine_handle<> self,
                                            std::coroutine_handle<> continuation) noexcept {
    continuation_ = continuation;
    task_promise_base*& current = innermost_start();
    task_promise_base* const outer = std::exchange(current, this);
    self.resume();
    current = outer;
    if (finished_inline_) return false;
    return !ready_.exchange(true, std::memory_order_acq_rel);
}

}  // namespace detail

COROCOLL_END_NAMESPACE
