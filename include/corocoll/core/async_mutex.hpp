#pragma once

#include <corocoll/version.hpp>

#include <coroutine>
#include <mutex>

COROCOLL_BEGIN_NAMESPACE

/// A mutex for coroutines: `co_await m.lock()` suspends instead of blocking the thread, and
/// the waiters get the lock in the order they asked for it. `unlock()` hands the lock straight
/// to the next waiter and resumes it on the unlocking thread. `co_await m.scoped_lock()`
/// yields a guard that unlocks when destroyed. Thread-safe. Cost: an uncontended lock and
/// unlock take one short critical section each, and nothing is allocated: waiters live in
/// their coroutine frames.
class async_mutex {
public:
    async_mutex() = default;
    async_mutex(const async_mutex&) = delete;
    async_mutex& operator=(const async_mutex&) = delete;

    /// Awaitable of `lock()`: takes the mutex at once when free, else queues the coroutine (no
    /// allocation) until `unlock` hands it over.
    class lock_awaiter {
    public:
        /// Waits for `m`.
        explicit lock_awaiter(async_mutex& m) noexcept : mutex_(m) {}
        bool await_ready() noexcept { return mutex_.try_lock(); }
        bool await_suspend(std::coroutine_handle<> h) noexcept;
        void await_resume() const noexcept {}

    private:
        friend class async_mutex;
        async_mutex& mutex_;
        std::coroutine_handle<> handle_;
        lock_awaiter* next_ = nullptr;
    };

    /// Unlocks when destroyed.
    class [[nodiscard]] guard {
    public:
        /// Holds `m`, which the caller has locked; unlocks it when destroyed.
        explicit guard(async_mutex& m) noexcept : mutex_(&m) {}
        /// Takes over `o`'s lock; `o` holds none.
        guard(guard&& o) noexcept : mutex_(o.mutex_) { o.mutex_ = nullptr; }
        guard(const guard&) = delete;
        guard& operator=(const guard&) = delete;
        guard& operator=(guard&&) = delete;
        ~guard() {
            if (mutex_ != nullptr) mutex_->unlock();
        }

    private:
        async_mutex* mutex_;
    };

    /// Awaitable: acquires the lock.
    [[nodiscard]] lock_awaiter lock() noexcept { return lock_awaiter(*this); }

    /// Awaitable: acquires the lock and yields a guard that releases it.
    [[nodiscard]] auto scoped_lock() noexcept {
        struct awaiter : lock_awaiter {
            explicit awaiter(async_mutex& m) noexcept : lock_awaiter(m), owner_(m) {}
            guard await_resume() noexcept { return guard(owner_); }
            async_mutex& owner_;
        };
        return awaiter(*this);
    }

    /// Takes the lock if it is free; never waits.
    bool try_lock() noexcept;

    /// Releases the lock, handing it to the first waiter if there is one.
    void unlock() noexcept;

private:
    // True when the awaiter must suspend; false when the lock came free meanwhile.
    bool enqueue(lock_awaiter& w) noexcept;

    std::mutex state_;
    bool locked_ = false;
    lock_awaiter* head_ = nullptr;
    lock_awaiter* tail_ = nullptr;
};

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

COROCOLL_DECL bool async_mutex::lock_awaiter::await_suspend(std::coroutine_handle<> h) noexcept {
    handle_ = h;
    return mutex_.enqueue(*this);
}

COROCOLL_DECL bool async_mutex::try_lock() noexcept {
    std::lock_guard lock(state_);
    if (locked_) return false;
    locked_ = true;
    return true;
}

COROCOLL_DECL void async_mutex::unlock() noexcept {
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

COROCOLL_DECL bool async_mutex::enqueue(lock_awaiter& w) noexcept {
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

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
