#pragma once

// `offload`: runs a function on a thread pool and resumes the awaiting coroutine on its own
// thread's event loop.

#include <corocoll/core/awaitable_traits.hpp>
#include <corocoll/core/event_loop.hpp>
#include <corocoll/core/thread_pool.hpp>
#include <corocoll/version.hpp>

#include <coroutine>
#include <exception>
#include <functional>
#include <stop_token>
#include <system_error>
#include <type_traits>
#include <utility>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

template <class F>
using offload_result_t = typename std::conditional_t<std::is_invocable_v<F&, std::stop_token>,
                                                     std::invoke_result<F&, std::stop_token>,
                                                     std::invoke_result<F&>>::type;

/// The awaiter behind `offload`. It lives in the awaiting coroutine's frame and is itself the
/// work item: first queued on the pool, then posted back to the awaiting thread's event loop.
template <class F>
class offload_awaiter : private work_item {
public:
    using result_type = offload_result_t<F>;

    offload_awaiter(thread_pool& pool, F fn, std::stop_token stop)
        : pool_(pool), fn_(std::move(fn)), stop_(std::move(stop)) {}
    offload_awaiter(const offload_awaiter&) = delete;
    offload_awaiter& operator=(const offload_awaiter&) = delete;

    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) {
        continuation_ = h;
        loop_ = event_loop::current();
        run_ = &on_pool;
        pool_.submit(*this);
    }
    result_type await_resume() { return result_.take(); }

private:
    static void on_pool(work_item* item) noexcept {
        auto* self = static_cast<offload_awaiter*>(item);
        self->call();
        if (self->loop_ != nullptr) {
            self->run_ = &on_loop;
            self->loop_->post(*self);
        } else {
            self->continuation_.resume();
        }
    }
    static void on_loop(work_item* item) noexcept {
        static_cast<offload_awaiter*>(item)->continuation_.resume();
    }

    void call() noexcept {
        try {
            if (stop_.stop_requested()) {
                throw std::system_error(std::make_error_code(std::errc::operation_canceled),
                                        "corocoll: offload cancelled before it started");
            }
            if constexpr (std::is_void_v<result_type>) {
                invoke();
                result_.set_value();
            } else {
                result_.set_value(invoke());
            }
        } catch (...) {
            result_.set_exception(std::current_exception());
        }
    }
    result_type invoke() {
        if constexpr (std::is_invocable_v<F&, std::stop_token>) {
            return std::invoke(fn_, stop_);
        } else {
            return std::invoke(fn_);
        }
    }

    thread_pool& pool_;
    F fn_;
    std::stop_token stop_;
    event_loop* loop_ = nullptr;
    std::coroutine_handle<> continuation_;
    result_slot<result_type> result_;
};

}  // namespace detail

/// Runs `fn` on a worker of `pool` and resumes the awaiting coroutine on the thread it was
/// awaited from, through that thread's event loop, which keeps driving communication while
/// `fn` computes. Without an event loop on the awaiting thread the coroutine resumes on the
/// worker. `fn` may take a `std::stop_token` to watch; if `stop` is already requested when a
/// worker picks the job up, `fn` is not called and the await throws `std::system_error` with
/// `std::errc::operation_canceled`. An exception from `fn` is rethrown in the awaiter.
/// Cost: no allocation; one pool hand-off and one event-loop post.
template <class F>
[[nodiscard]] auto offload(thread_pool& pool, F fn, std::stop_token stop = {}) {
    return detail::offload_awaiter<F>(pool, std::move(fn), std::move(stop));
}

/// `offload` on `thread_pool::default_pool()`.
template <class F>
[[nodiscard]] auto offload(F fn, std::stop_token stop = {}) {
    return detail::offload_awaiter<F>(thread_pool::default_pool(), std::move(fn), std::move(stop));
}

COROCOLL_END_NAMESPACE
