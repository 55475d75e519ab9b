#pragma once

// An awaitable mutex: a coroutine that cannot take it suspends, and the holder's unlock
// resumes the next in line.

#include <corocoll/version.hpp>

#include <coroutine>
#include <mutex>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

/// The lock of a `basic_async_mutex` whose users never run at the same time (one thread, or
/// threads that take turns under a lock of their own): no atomic operation at all.
struct no_lock {
    void lock() noexcept {}
    void unlock() noexcept {}
};

}  // namespace detail

/// A mutex for coroutines: `co_await m.lock()` suspends instead of blocking the thread, and
/// the waiters get the lock in the order they asked for it. `unlock()` hands the lock straight
/// to the next waiter and resumes it on the unlocking thread. `co_await m.scoped_lock()`
/// yields a guard that unlocks when destroyed. `Lock` guards the mutex's own state:
/// `std::mutex` makes it thread-safe (`async_mutex`); `detail::no_lock` is for coroutines that
/// never run at the same time (`local_async_mutex`). Cost: an uncontended lock and unlock take
/// one short critical section of `Lock` each (none for `no_lock`), and nothing is allocated:
/// waiters live in their coroutine frames.
template <class Lock>
class basic_async_mutex {
public:
    basic_async_mutex() = default;
    basic_async_mutex(const basic_async_mutex&) = delete;
    basic_async_mutex& operator=(const basic_async_mutex&) = delete;

    /// Awaitable of `lock()`: takes the mutex at once when free, else queues the coroutine (no
    /// allocation) until `unlock` hands it over.
    class lock_awaiter {
    public:
        /// Waits for `m`.
        explicit lock_awaiter(basic_async_mutex& m) noexcept : mutex_(m) {}
        bool await_ready() noexcept { return mutex_.try_lock(); }
        bool await_suspend(std::coroutine_handle<> h) noexcept {
            handle_ = h;
            return mutex_.enqueue(*this);
        }
        void await_resume() const noexcept {}

    private:
        friend class basic_async_mutex;
        basic_async_mutex& mutex_;
        std::coroutine_handle<> handle_;
        lock_awaiter* next_ = nullptr;
    };

    /// Unlocks when destroyed.
    class [[nodiscard]] guard {
    public:
        /// Holds `m`, which the caller has locked; unlocks it when destroyed.
        explicit guard(basic_async_mutex& m) noexcept : mutex_(&m) {}
        /// Takes over `o`'s lock; `o` holds none.
        guard(guard&& o) noexcept : mutex_(o.mutex_) { o.mutex_ = nullptr; }
        guard(const guard&) = delete;
        guard& operator=(const guard&) = delete;
        guard& operator=(guard&&) = delete;
        ~guard() {
            if (mutex_ != nullptr) mutex_->unlock();
        }

    private:
        basic_async_mutex* mutex_;
    };

    /// Awaitable: acquires the lock.
    [[nodiscard]] lock_awaiter lock() noexcept { return lock_awaiter(*this); }

    /// Awaitable: acquires the lock and yields a guard that releases it.
    [[nodiscard]] auto scoped_lock() noexcept {
        struct awaiter : lock_awaiter {
            explicit awaiter(basic_async_mutex& m) noexcept : lock_awaiter(m), owner_(m) {}
            guard await_resume() noexcept { return guard(owner_); }
            basic_async_mutex& owner_;
        };
        return awaiter(*this);
    }

    /// Takes the lock if it is free; never waits.
    bool try_lock() noexcept {
        std::lock_guard lock(state_);
        if (locked_) return false;
        locked_ = true;
        return true;
    }

    /// Releases the lock, handing it to the first waiter if there is one.
    void unlock() noexcept {
        lock_awaiter* next = nullptr;
        {
            std::lock_guard lock(state_);
            next = head_;
            if (next == nullptr) {
                locked_ = false;
                return;
            }
            head_ = next->next_;
            if (head_ == nullptr) tail_ = nullptr;
        }
        next->handle_.resume();
    }

    /// True while coroutines wait for the lock (a snapshot: only meaningful where the users
    /// never run at the same time, as with `local_async_mutex`).
    bool has_waiters() noexcept {
        std::lock_guard lock(state_);
        return head_ != nullptr;
    }

private:
    // True when the awaiter must suspend; false when the lock came free meanwhile.
    bool enqueue(lock_awaiter& w) noexcept {
        std::lock_guard lock(state_);
        if (!locked_) {
            locked_ = true;
            return false;
        }
        w.next_ = nullptr;
        if (tail_ != nullptr) {
            tail_->next_ = &w;
        } else {
            head_ = &w;
        }
        tail_ = &w;
        return true;
    }

    Lock state_;
    bool locked_ = false;
    lock_awaiter* head_ = nullptr;
    lock_awaiter* tail_ = nullptr;
};

/// The thread-safe mutex for coroutines (see `basic_async_mutex`).
using async_mutex = basic_async_mutex<std::mutex>;
/// The mutex for coroutines of one thread, or of threads that take turns under a lock of
/// their own (a reactor's coroutines): no atomic operation (see `basic_async_mutex`).
using local_async_mutex = basic_async_mutex<detail::no_lock>;

COROCOLL_END_NAMESPACE
