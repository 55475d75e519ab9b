#pragma once

// `work<T>`: an operation already running (torch's `Work`), to await or wait for.

#include <corocoll/core/awaitable_traits.hpp>
#include <corocoll/core/frame_pool.hpp>
#include <corocoll/core/sync_wait.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/version.hpp>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <exception>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

template <class T>
struct work_state {
    // Two owners: the running coroutine and the `work` handle; the last one frees it.
    std::atomic<int> owners{2};
    // null: running, nobody waits; done_marker(): finished; anything else: the waiter.
    std::atomic<void*> waiter{nullptr};
    result_slot<T> result;

    static void* done_marker() noexcept { return reinterpret_cast<void*>(1); }
    void release() noexcept {
        if (owners.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
    }
};

struct work_runner {
    struct promise_type : detail::pooled_frame {
        work_runner get_return_object() noexcept { return {}; }
        std::suspend_never initial_suspend() const noexcept { return {}; }
        std::suspend_never final_suspend() const noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { std::terminate(); }  // run_work catches all
    };
};

template <class T>
work_runner run_work(task<T> t, work_state<T>* state) {
    try {
        if constexpr (std::is_void_v<T>) {
            co_await std::move(t);
            state->result.set_value();
        } else {
            state->result.set_value(co_await std::move(t));
        }
    } catch (...) {
        state->result.set_exception(std::current_exception());
    }
    void* w = state->waiter.exchange(work_state<T>::done_marker(), std::memory_order_acq_rel);
    if (w != nullptr) std::coroutine_handle<>::from_address(w).resume();
    state->release();
}

}  // namespace detail

/// An operation that is already running, like torch's `Work`: `isend`/`irecv` return one.
/// `co_await w` (or `w.wait()` from plain code) waits for it and yields its result or rethrows
/// its error; `is_completed()` polls. Dropping a `work` does not cancel the operation: it runs
/// to its end, as in torch. Await it once. Cost: one allocation for the shared state besides
/// the operation's coroutine frame.
template <class T = void>
class [[nodiscard]] work {
public:
    work() noexcept = default;
    /// Starts `t` now (it runs until its first suspension) and keeps its result for `wait` or
    /// `co_await`. One allocation for the shared state.
    explicit work(task<T> t) : state_(new detail::work_state<T>) {
        detail::run_work(std::move(t), state_);
    }
    /// Takes over `o`'s operation; `o` holds none.
    work(work&& o) noexcept : state_(std::exchange(o.state_, nullptr)) {}
    /// Drops the operation held (as the destructor does) and takes over `o`'s.
    work& operator=(work&& o) noexcept {
        if (this != &o) {
            if (state_ != nullptr) state_->release();
            state_ = std::exchange(o.state_, nullptr);
        }
        return *this;
    }
    work(const work&) = delete;
    work& operator=(const work&) = delete;
    ~work() {
        if (state_ != nullptr) state_->release();
    }

    /// True once the operation has finished, successfully or not.
    bool is_completed() const noexcept {
        return state_ != nullptr && state_->waiter.load(std::memory_order_acquire) ==
                                        detail::work_state<T>::done_marker();
    }

    /// Awaitable: suspends until the operation ends, then yields its result or rethrows its error.
    auto operator co_await() noexcept {
        struct awaiter {
            detail::work_state<T>* state;
            bool await_ready() const noexcept {
                return state->waiter.load(std::memory_order_acquire) ==
                       detail::work_state<T>::done_marker();
            }
            bool await_suspend(std::coroutine_handle<> h) noexcept {
                void* expected = nullptr;
                return state->waiter.compare_exchange_strong(expected, h.address(),
                                                             std::memory_order_acq_rel);
            }
            T await_resume() { return state->result.take(); }
        };
        return awaiter{state_};
    }

    /// Blocks until the operation finishes (running the thread's reactor meanwhile) and
    /// returns its result: torch's `req.wait()`.
    T wait() { return sync_wait(*this); }

    /// torch's `Work.wait(timeout)`: blocks until the operation finishes or `timeout` passes,
    /// running the thread's reactor meanwhile. Returns its result, rethrows its error, or
    /// throws `std::system_error` (`std::errc::timed_out`) "work::wait: the operation did not
    /// finish within N ms". A timeout leaves the operation running (it has its own deadline,
    /// the group's): wait again, poll `is_completed()`, or close the group to end it. From
    /// plain code only; on a thread without a reactor it sleeps in steps of 100 µs.
    T wait(std::chrono::milliseconds timeout) {
        if (state_ == nullptr) throw std::logic_error("corocoll: work::wait: an empty work");
        auto deadline = std::chrono::steady_clock::now() + timeout;
        auto ready = [](const void* s) noexcept {
            return static_cast<const detail::work_state<T>*>(s)->waiter.load(
                       std::memory_order_acquire) == detail::work_state<T>::done_marker();
        };
        if (auto* loop = detail::event_loop::current(); loop != nullptr) {
            loop->run_until(ready, state_, deadline);
        } else {
            while (!ready(state_) && std::chrono::steady_clock::now() < deadline) {
                std::this_thread::sleep_for(std::chrono::microseconds(100));
            }
        }
        if (!ready(state_)) {
            throw std::system_error(std::make_error_code(std::errc::timed_out),
                                    "corocoll: work::wait: the operation did not finish within " +
                                        std::to_string(timeout.count()) + " ms");
        }
        return state_->result.take();
    }

private:
    detail::work_state<T>* state_ = nullptr;
};

/// Starts `t` now and returns the handle to its completion.
template <class T>
work<T> start(task<T> t) {
    return work<T>(std::move(t));
}

namespace detail {
template <class A>
task<await_result_t<A>> await_in_task(A a) {
    co_return co_await std::move(a);
}
}  // namespace detail

/// Starts any other awaitable now (through one coroutine that awaits it) and returns the
/// handle to its completion.
template <awaitable A>
work<await_result_t<A>> start(A a) {
    return work<await_result_t<A>>(detail::await_in_task(std::move(a)));
}

COROCOLL_END_NAMESPACE
