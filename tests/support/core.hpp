#pragma once

// Helpers shared by the core tests: an event that a test resumes by hand, a type whose
// constructions and destructions are tallied, a way to start an awaitable without blocking,
// and an awaitable that moves a coroutine to a fresh thread. Test code only; not installed.

#include <corocoll/core/awaitable_traits.hpp>

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace corocoll_test {

namespace cc = corocoll;

/// A one-shot event that one coroutine at a time can await. `set()` resumes the waiting
/// coroutine, if any, inline on the calling thread; awaiting an event that is already set does
/// not suspend. Thread-safe: `set()` may race with the await.
class manual_event {
public:
    manual_event() = default;
    manual_event(const manual_event&) = delete;
    manual_event& operator=(const manual_event&) = delete;

    void set() noexcept {
        void* old = state_.exchange(set_marker(), std::memory_order_acq_rel);
        if (old != nullptr && old != set_marker())
            std::coroutine_handle<>::from_address(old).resume();
    }
    bool is_set() const noexcept { return state_.load(std::memory_order_acquire) == set_marker(); }
    bool has_waiter() const noexcept {
        void* s = state_.load(std::memory_order_acquire);
        return s != nullptr && s != set_marker();
    }

    auto operator co_await() noexcept {
        struct awaiter {
            manual_event& event_;
            bool await_ready() const noexcept { return event_.is_set(); }
            bool await_suspend(std::coroutine_handle<> h) noexcept {
                void* expected = nullptr;
                // Fails only when set() came first: then continue without suspending.
                return event_.state_.compare_exchange_strong(
                    expected, h.address(), std::memory_order_acq_rel, std::memory_order_acquire);
            }
            void await_resume() const noexcept {}
        };
        return awaiter{*this};
    }

private:
    void* set_marker() const noexcept { return const_cast<manual_event*>(this); }

    // nullptr: not set, nobody waits; this: set; anything else: the waiting coroutine.
    std::atomic<void*> state_{nullptr};
};

/// Spins (yielding) until `pred()` holds or `timeout` passes; returns `pred()`. For handing
/// control between threads in tests without sleeping for a fixed time.
template <class Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!pred()) {
        if (std::chrono::steady_clock::now() > deadline) return pred();
        std::this_thread::yield();
    }
    return true;
}

/// Runs `fn` on a new thread with a stack of `bytes` and waits for it to end; for tests whose
/// stack use must not depend on the default stack size (`ulimit -s`) or on the sanitizer.
template <class F>
void run_with_stack(std::size_t bytes, F fn) {
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) throw std::runtime_error("pthread_attr_init failed");
    pthread_attr_setstacksize(&attr, bytes);
    std::exception_ptr error;
    auto body = [&] {
        try {
            fn();
        } catch (...) {
            error = std::current_exception();
        }
    };
    pthread_t thread;
    const int rc = pthread_create(
        &thread, &attr,
        [](void* arg) -> void* {
            (*static_cast<decltype(body)*>(arg))();
            return nullptr;
        },
        &body);
    pthread_attr_destroy(&attr);
    if (rc != 0) throw std::runtime_error("pthread_create failed");
    pthread_join(thread, nullptr);
    if (error) std::rethrow_exception(error);
}

/// Tallies of `counted` objects. Reset at the start of each test that uses them.
struct lifetime_counts {
    std::atomic<int> constructed{0};
    std::atomic<int> copied{0};
    std::atomic<int> destroyed{0};
    std::atomic<int> bad_destroys{0};

    void reset() noexcept {
        constructed = 0;
        copied = 0;
        destroyed = 0;
        bad_destroys = 0;
    }
    int alive() const noexcept { return constructed.load() - destroyed.load(); }
};

inline lifetime_counts counts;

/// A value whose every construction (copies and moves included) and destruction is counted
/// in `counts`; a destructor that runs on an object already destroyed (or never constructed)
/// is counted in `counts.bad_destroys`.
class counted {
public:
    explicit counted(int value) noexcept : value_(value) { ++counts.constructed; }
    counted(const counted& other) noexcept : value_(other.value_) {
        ++counts.constructed;
        ++counts.copied;
    }
    counted(counted&& other) noexcept : value_(std::exchange(other.value_, -1)) {
        ++counts.constructed;
    }
    counted& operator=(const counted& other) noexcept {
        value_ = other.value_;
        ++counts.copied;
        return *this;
    }
    counted& operator=(counted&& other) noexcept {
        value_ = std::exchange(other.value_, -1);
        return *this;
    }
    ~counted() {
        if (magic_ != live_magic) ++counts.bad_destroys;
        // volatile: the store must survive dead-store elimination to catch a second destroy.
        *static_cast<volatile std::uint32_t*>(&magic_) = dead_magic;
        ++counts.destroyed;
    }

    int value() const noexcept { return value_; }

private:
    static constexpr std::uint32_t live_magic = 0xC0C0A11Du;
    static constexpr std::uint32_t dead_magic = 0xDEADDEADu;

    int value_;
    std::uint32_t magic_ = live_magic;
};

/// An exception that carries a `counted`, so that the exception object's lifetime is tallied.
struct counted_error : std::runtime_error {
    explicit counted_error(int value) : std::runtime_error("counted_error"), payload(value) {}
    counted payload;
};

/// What a detached run of an awaitable produced; `done` is published last.
template <class T>
struct outcome {
    std::atomic<bool> done{false};
    std::optional<cc::detail::non_void_t<T>> value;
    std::exception_ptr error;
};

/// A coroutine that starts at once and frees itself when it ends.
struct detached {
    struct promise_type {
        detached get_return_object() noexcept { return {}; }
        std::suspend_never initial_suspend() const noexcept { return {}; }
        std::suspend_never final_suspend() const noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { std::terminate(); }
    };
};

/// Starts awaiting `a` now, on the calling thread, and returns at its first suspension; the
/// result or exception lands in `out`. Lets a test resume children by hand and look at the
/// parent in between, which `sync_wait` (which blocks) would not.
template <class A, class T>
detached run_detached(A a, outcome<T>& out) {
    static_assert(std::is_same_v<T, cc::await_result_t<A>>);
    try {
        if constexpr (std::is_void_v<T>) {
            co_await std::move(a);
            out.value.emplace();
        } else {
            out.value.emplace(co_await std::move(a));
        }
    } catch (...) {
        out.error = std::current_exception();
    }
    out.done.store(true, std::memory_order_release);
}

/// `co_await hopper.hop()` resumes the coroutine on a new thread. The threads are joined by
/// `join()` or the destructor, so a test reaps every thread it made.
class thread_hopper {
public:
    thread_hopper() = default;
    thread_hopper(const thread_hopper&) = delete;
    thread_hopper& operator=(const thread_hopper&) = delete;
    ~thread_hopper() { join(); }

    void join() {
        for (;;) {
            std::vector<std::thread> threads;
            {
                std::lock_guard lock(mutex_);
                threads.swap(threads_);
            }
            if (threads.empty()) return;
            for (auto& t : threads) t.join();
        }
    }

    auto hop() noexcept {
        struct awaiter {
            thread_hopper& hopper_;
            bool await_ready() const noexcept { return false; }
            void await_suspend(std::coroutine_handle<> h) {
                // The new thread may resume and finish the coroutine, freeing this awaiter,
                // before emplace_back returns: use only locals from here on.
                thread_hopper& hopper = hopper_;
                std::lock_guard lock(hopper.mutex_);
                hopper.threads_.emplace_back([h] { h.resume(); });
            }
            void await_resume() const noexcept {}
        };
        return awaiter{*this};
    }

private:
    std::mutex mutex_;
    std::vector<std::thread> threads_;
};

}  // namespace corocoll_test
