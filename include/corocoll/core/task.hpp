#pragma once

// `task<T>`: the lazy coroutine type of every corocoll API, with symmetric transfer.

#include <corocoll/core/awaitable_traits.hpp>
#include <corocoll/core/frame_pool.hpp>
#include <corocoll/version.hpp>

#include <atomic>
#include <coroutine>
#include <exception>
#include <stdexcept>
#include <utility>

COROCOLL_BEGIN_NAMESPACE

template <class T = void>
class task;

namespace detail {

// How a task hands control back to its awaiter. The awaiter starts the task inline from
// await_suspend; when the task finishes, exactly one of the two sides — the awaiter after the
// inline start returns, or the task at final_suspend — finds `ready_` already set and
// continues the awaiting coroutine. A task that completes synchronously therefore makes
// await_suspend return false, and the awaiting coroutine continues with no frame added to the
// stack. This does not rely on symmetric transfer being a tail call: g++ 12 makes it a plain
// call at -O0/-O1 and under ASan, so a loop of a million synchronous awaits would overflow the
// stack there. A task that finishes inside its own start, on the starting thread (the thread
// notes the start it is in: `innermost_start`), says so with a plain flag instead: no other
// thread can be at its end then. Only a task that suspended, and may be resumed elsewhere,
// goes through the atomic exchange on each side. (A locked instruction waits for every store
// before it, one to a cache line that another core holds too: a collective that has just
// written for its peers would wait there, at each call.)
class task_promise_base : public pooled_frame {
public:
    struct final_awaiter {
        bool await_ready() const noexcept { return false; }
        template <class Promise>
        std::coroutine_handle<> await_suspend(std::coroutine_handle<Promise> h) noexcept {
            task_promise_base& p = h.promise();
            if (innermost_start() == &p) {
                p.finished_inline_ = true;
                return std::noop_coroutine();
            }
            if (p.ready_.exchange(true, std::memory_order_acq_rel)) return p.continuation_;
            return std::noop_coroutine();
        }
        void await_resume() const noexcept {}
    };

    std::suspend_always initial_suspend() const noexcept { return {}; }
    final_awaiter final_suspend() const noexcept { return {}; }

    /// Starts the task for `continuation`; true when the awaiter must stay suspended.
    bool start(std::coroutine_handle<> self, std::coroutine_handle<> continuation) noexcept;

private:
    // The task whose `start` this thread is in, innermost (null: none).
    static task_promise_base*& innermost_start() noexcept;

    std::coroutine_handle<> continuation_;
    std::atomic<bool> ready_{false};
    bool finished_inline_ = false;  // written and read by the starting thread only
};

template <class T>
class task_promise final : public task_promise_base {
public:
    task<T> get_return_object() noexcept;
    void unhandled_exception() noexcept { result_.set_exception(std::current_exception()); }
    template <class U>
        requires std::convertible_to<U&&, T>
    void return_value(U&& value) { result_.set_value(std::forward<U>(value)); }
    result_slot<T>& result() noexcept { return result_; }

private:
    result_slot<T> result_;
};

template <>
class task_promise<void> final : public task_promise_base {
public:
    task<void> get_return_object() noexcept;
    void unhandled_exception() noexcept { result_.set_exception(std::current_exception()); }
    void return_void() noexcept {}
    result_slot<void>& result() noexcept { return result_; }

private:
    result_slot<void> result_;
};

}  // namespace detail

/// A lazy coroutine that produces a `T` (or nothing) when awaited. It does not start until
/// awaited; awaiting it runs it on the awaiting thread until it first suspends. An exception
/// that escapes the body is rethrown in the awaiter. Move-only; destroying a task that never
/// ran frees its frame without running it. Cost: one heap-allocated frame per call (the
/// compiler may elide it); one atomic exchange on each side of an await that suspended.
template <class T>
class [[nodiscard]] task {
public:
    using promise_type = detail::task_promise<T>;
    /// What `co_await` on the task yields.
    using value_type = T;

    task() noexcept = default;
    /// Owns the coroutine `h` (what `promise_type::get_return_object` makes).
    explicit task(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
    /// Takes over `other`'s coroutine; `other` becomes empty.
    task(task&& other) noexcept : handle_(std::exchange(other.handle_, {})) {}
    /// Destroys the coroutine held, if any, and takes over `other`'s.
    task& operator=(task&& other) noexcept {
        if (this != &other) {
            if (handle_) handle_.destroy();
            handle_ = std::exchange(other.handle_, {});
        }
        return *this;
    }
    task(const task&) = delete;
    task& operator=(const task&) = delete;
    ~task() {
        if (handle_) handle_.destroy();
    }

    /// True when the task holds a coroutine that has run to completion.
    bool is_ready() const noexcept { return handle_ && handle_.done(); }
    /// True when the task holds a coroutine (it was not moved from or default-constructed).
    explicit operator bool() const noexcept { return static_cast<bool>(handle_); }

    /// Awaiting an rvalue task yields its result by value.
    auto operator co_await() && noexcept { return awaiter<true>{handle_}; }
    /// Awaiting an lvalue task yields a reference to the result kept in the task.
    auto operator co_await() & noexcept { return awaiter<false>{handle_}; }

private:
    template <bool Move>
    struct awaiter {
        std::coroutine_handle<promise_type> handle_;

        bool await_ready() const noexcept { return !handle_ || handle_.done(); }
        bool await_suspend(std::coroutine_handle<> continuation) noexcept {
            return handle_.promise().start(handle_, continuation);
        }
        decltype(auto) await_resume() {
            if (!handle_) throw std::logic_error("corocoll: awaited an empty task");
            if constexpr (Move) {
                return handle_.promise().result().take();
            } else {
                return handle_.promise().result().get();
            }
        }
    };

    std::coroutine_handle<promise_type> handle_;
};

namespace detail {

template <class T>
task<T> task_promise<T>::get_return_object() noexcept {
    return task<T>{std::coroutine_handle<task_promise<T>>::from_promise(*this)};
}

inline task<void> task_promise<void>::get_return_object() noexcept {
    return task<void>{std::coroutine_handle<task_promise<void>>::from_promise(*this)};
}

}  // namespace detail

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/core/impl/task.ipp>
#endif
