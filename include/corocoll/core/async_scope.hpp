#pragma once

// A place for detached work that can still be joined: spawn now, wait for all later.

#include <corocoll/core/awaitable_traits.hpp>
#include <corocoll/core/frame_pool.hpp>
#include <corocoll/version.hpp>

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <utility>

COROCOLL_BEGIN_NAMESPACE

/// A place for detached work: `spawn` starts an awaitable now and lets the caller go on;
/// `co_await scope.join()` waits until everything spawned has finished and then rethrows the
/// first exception any of it threw (the rest are dropped). Every scope that spawned work must
/// be joined before it is destroyed: destroying one with work still running terminates the
/// program, as destroying a joinable `std::thread` does. Cost: one coroutine frame per spawn.
class async_scope {
public:
    async_scope() = default;
    async_scope(const async_scope&) = delete;
    async_scope& operator=(const async_scope&) = delete;
    ~async_scope() {
        if (count_.load(std::memory_order_acquire) != 1) std::terminate();
    }

    /// Starts `a` on the calling thread; it runs until its first suspension before `spawn`
    /// returns. Takes the awaitable by value (move tasks in).
    template <awaitable A>
    void spawn(A a) {
        running_.fetch_add(1, std::memory_order_relaxed);
        count_.fetch_add(1, std::memory_order_relaxed);
        try {
            run(this, std::move(a));
        } catch (...) {
            // Only creating the frame can throw here (the body's exceptions are captured):
            // nothing was started, so nothing is left to wait for.
            running_.fetch_sub(1, std::memory_order_relaxed);
            count_.fetch_sub(1, std::memory_order_relaxed);
            throw;
        }
    }

    /// Number of spawned awaitables still running, also while a `join` waits for them.
    std::size_t pending() const noexcept { return running_.load(std::memory_order_acquire); }

    /// An awaitable that completes when every spawned awaitable has finished; it rethrows the
    /// first exception among them. The scope may be used again afterwards.
    [[nodiscard]] auto join() noexcept {
        struct awaiter {
            async_scope& scope_;
            bool await_ready() const noexcept {
                return scope_.count_.load(std::memory_order_acquire) == 1;
            }
            bool await_suspend(std::coroutine_handle<> h) noexcept {
                scope_.joiner_ = h;
                return scope_.count_.fetch_sub(1, std::memory_order_acq_rel) != 1;
            }
            void await_resume() {
                // Either await_ready saw no work (count 1) or the last child brought it to 0.
                scope_.count_.store(1, std::memory_order_relaxed);
                scope_.failed_.store(false, std::memory_order_relaxed);
                if (auto e = std::exchange(scope_.error_, nullptr)) std::rethrow_exception(e);
            }
        };
        return awaiter{*this};
    }

private:
    struct detached {
        struct promise_type : detail::pooled_frame {
            async_scope* scope_;

            template <class A>
            explicit promise_type(async_scope* scope, A&) noexcept : scope_(scope) {}

            detached get_return_object() noexcept { return {}; }
            std::suspend_never initial_suspend() const noexcept { return {}; }
            auto final_suspend() const noexcept {
                struct releaser {
                    bool await_ready() const noexcept { return false; }
                    std::coroutine_handle<> await_suspend(
                        std::coroutine_handle<promise_type> h) const noexcept {
                        async_scope* scope = h.promise().scope_;
                        h.destroy();
                        return scope->child_done();
                    }
                    void await_resume() const noexcept {}
                };
                return releaser{};
            }
            void return_void() noexcept {}
            void unhandled_exception() noexcept { scope_->fail(std::current_exception()); }
        };
    };

    template <class A>
    static detached run(async_scope* /*scope: read by the promise*/, A a) {
        co_await std::move(a);
    }

    std::coroutine_handle<> child_done() noexcept;
    void fail(std::exception_ptr e) noexcept {
        if (!failed_.exchange(true, std::memory_order_acq_rel)) error_ = std::move(e);
    }

    // Spawned work still running, plus one that the joiner gives up when it suspends.
    std::atomic<std::size_t> count_{1};
    // Spawned work still running, for pending(): count_ cannot tell while a joiner waits.
    std::atomic<std::size_t> running_{0};
    std::coroutine_handle<> joiner_;
    std::atomic<bool> failed_{false};
    std::exception_ptr error_;
};

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/core/impl/async_scope.ipp>
#endif
