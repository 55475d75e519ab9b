#pragma once

// `sync_wait`: runs an awaitable to completion from plain code, driving the thread's event
// loop meanwhile if it has one.

#include <corocoll/core/awaitable_traits.hpp>
#include <corocoll/core/event_loop.hpp>
#include <corocoll/version.hpp>

#include <atomic>
#include <condition_variable>
#include <coroutine>
#include <exception>
#include <mutex>
#include <utility>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

/// Where `sync_wait` blocks: the calling thread's event loop if it has one (so the loop keeps
/// driving I/O while we wait), otherwise a mutex and condition variable.
class sync_wait_state : private work_item {
public:
    explicit sync_wait_state(event_loop* loop) noexcept;

    void wait();

    // The waiter may return and destroy this state as soon as it sees `done_`. From another
    // thread, the loop learns of it through a posted item (the loop outlives every post in
    // progress); with no loop, `done_` is published under the mutex, which the waiter cannot
    // leave with until the notifier unlocks.
    void signal() noexcept;

private:
    event_loop* loop_;
    std::atomic<bool> done_{false};
    std::mutex mutex_;
    std::condition_variable cv_;
};

template <class T>
struct sync_wait_result {
    result_slot<T> result_;
    template <class U>
    void return_value(U&& value) {
        result_.set_value(std::forward<U>(value));
    }
};

template <>
struct sync_wait_result<void> {
    result_slot<void> result_;
    void return_void() noexcept {}
};

/// The coroutine that `sync_wait` starts: it awaits the user's awaitable and signals the
/// waiting thread from its final suspend point.
template <class T>
class sync_wait_task {
public:
    struct promise_type : sync_wait_result<T> {
        sync_wait_state* state_ = nullptr;

        sync_wait_task get_return_object() noexcept {
            return sync_wait_task{std::coroutine_handle<promise_type>::from_promise(*this)};
        }
        std::suspend_always initial_suspend() const noexcept { return {}; }
        auto final_suspend() const noexcept {
            struct signaller {
                bool await_ready() const noexcept { return false; }
                void await_suspend(std::coroutine_handle<promise_type> h) const noexcept {
                    h.promise().state_->signal();
                }
                void await_resume() const noexcept {}
            };
            return signaller{};
        }
        void unhandled_exception() noexcept {
            this->result_.set_exception(std::current_exception());
        }
    };

    explicit sync_wait_task(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
    sync_wait_task(sync_wait_task&& o) noexcept : handle_(std::exchange(o.handle_, {})) {}
    sync_wait_task(const sync_wait_task&) = delete;
    sync_wait_task& operator=(const sync_wait_task&) = delete;
    sync_wait_task& operator=(sync_wait_task&&) = delete;
    ~sync_wait_task() {
        if (handle_) handle_.destroy();
    }

    T run(sync_wait_state& state) {
        handle_.promise().state_ = &state;
        handle_.resume();
        state.wait();
        return handle_.promise().result_.take();
    }

private:
    std::coroutine_handle<promise_type> handle_;
};

template <class R, class A>
sync_wait_task<R> make_sync_wait_task(A&& awaitable) {
    // An awaiter with no operator co_await is used as an lvalue whatever the category of the
    // operand ([expr.await], CWG2472), so awaiting the named parameter means the same as
    // forwarding it. g++ 12.2 copies an operand that is an xvalue or a call, which a
    // non-copyable awaiter such as offload's cannot allow; only operator co_await needs the
    // category.
    constexpr bool has_co_await = has_member_co_await<A> || has_free_co_await<A>;
    if constexpr (std::is_void_v<R> && has_co_await) {
        co_await std::forward<A>(awaitable);
    } else if constexpr (std::is_void_v<R>) {
        co_await awaitable;
    } else if constexpr (has_co_await) {
        co_return co_await std::forward<A>(awaitable);
    } else {
        co_return co_await awaitable;
    }
}

}  // namespace detail

/// Runs `awaitable` to completion on the calling thread and returns its result (or rethrows its
/// exception). If the thread has an event loop (an `io::reactor`), the loop runs meanwhile, so
/// I/O awaited inside makes progress; otherwise the thread blocks until whichever thread
/// finishes the work wakes it. Call it from plain code, never from inside a coroutine that the
/// same loop runs. Cost: one small coroutine frame.
template <awaitable A>
decltype(auto) sync_wait(A&& awaitable) {
    using result = await_result_t<A>;
    detail::sync_wait_state state(detail::event_loop::current());
    auto t = detail::make_sync_wait_task<result>(std::forward<A>(awaitable));
    if constexpr (std::is_void_v<result>) {
        t.run(state);
    } else {
        return t.run(state);
    }
}

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/core/impl/sync_wait.ipp>
#endif
