#pragma once

// `when_all`: awaits several awaitables at once and rethrows only after every one finished.

#include <corocoll/core/awaitable_traits.hpp>
#include <corocoll/core/frame_pool.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/version.hpp>

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <tuple>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

/// Counts the children of a `when_all` that are still running, plus one for the parent while it
/// starts them, so that the parent is resumed exactly once, by whichever finishes last.
class when_all_latch {
public:
    explicit when_all_latch(std::size_t children) noexcept : count_(children + 1) {}

    /// Called once the parent has started every child; true when it must suspend.
    bool parent_started(std::coroutine_handle<> parent) noexcept;
    /// Called by each child as it finishes; returns what to resume next.
    std::coroutine_handle<> child_done() noexcept;
    /// Keeps the exception of the first child to fail; later ones are dropped.
    void fail(std::exception_ptr e) noexcept {
        if (!failed_.exchange(true, std::memory_order_acq_rel)) error_ = std::move(e);
    }
    void rethrow_if_failed() const {
        if (error_) std::rethrow_exception(error_);
    }

private:
    std::atomic<std::size_t> count_;
    std::coroutine_handle<> parent_;
    std::atomic<bool> failed_{false};
    std::exception_ptr error_;
};

template <class T>
struct when_all_child_result {
    result_slot<T> result_;
    template <class U>
    void return_value(U&& value) {
        result_.set_value(std::forward<U>(value));
    }
};

template <>
struct when_all_child_result<void> {
    result_slot<void> result_;
    void return_void() noexcept {}
};

/// One child of a `when_all`: awaits one awaitable and reports to the latch.
template <class T>
class when_all_child {
public:
    struct promise_type : when_all_child_result<T>, pooled_frame {
        when_all_latch* latch_ = nullptr;

        when_all_child get_return_object() noexcept {
            return when_all_child{std::coroutine_handle<promise_type>::from_promise(*this)};
        }
        std::suspend_always initial_suspend() const noexcept { return {}; }
        auto final_suspend() const noexcept {
            struct reporter {
                bool await_ready() const noexcept { return false; }
                std::coroutine_handle<> await_suspend(
                    std::coroutine_handle<promise_type> h) const noexcept {
                    return h.promise().latch_->child_done();
                }
                void await_resume() const noexcept {}
            };
            return reporter{};
        }
        void unhandled_exception() noexcept { latch_->fail(std::current_exception()); }
    };

    explicit when_all_child(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
    when_all_child(when_all_child&& o) noexcept : handle_(std::exchange(o.handle_, {})) {}
    when_all_child(const when_all_child&) = delete;
    when_all_child& operator=(const when_all_child&) = delete;
    when_all_child& operator=(when_all_child&&) = delete;
    ~when_all_child() {
        if (handle_) handle_.destroy();
    }

    void start(when_all_latch& latch) noexcept {
        handle_.promise().latch_ = &latch;
        handle_.resume();
    }
    non_void_t<T> take() {
        if constexpr (std::is_void_v<T>) {
            return void_value{};
        } else {
            return handle_.promise().result_.take();
        }
    }

private:
    std::coroutine_handle<promise_type> handle_;
};

template <class A>
when_all_child<await_result_t<A>> make_when_all_child(A& awaitable) {
    if constexpr (std::is_void_v<await_result_t<A>>) {
        co_await std::move(awaitable);
    } else {
        co_return co_await std::move(awaitable);
    }
}

/// Starts every child, then suspends the parent until the last one is done.
template <class Start>
struct when_all_awaiter {
    when_all_latch& latch_;
    Start start_;

    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<> parent) noexcept {
        start_();
        return latch_.parent_started(parent);
    }
    void await_resume() const noexcept {}
};

template <class Start>
when_all_awaiter(when_all_latch&, Start) -> when_all_awaiter<Start>;

}  // namespace detail

/// Runs every awaitable concurrently and completes when all of them have; yields a tuple of
/// their results in argument order (`void` results become `detail::void_value`). If some fail,
/// it still waits for every one to finish, then rethrows the exception of the first to fail.
/// It does not cancel the others: pass them a `std::stop_token` for that. Takes the awaitables
/// by value (move tasks in). Cost: one coroutine frame per child plus one for the call.
template <awaitable... As>
task<std::tuple<detail::non_void_t<await_result_t<As>>...>> when_all(As... awaitables) {
    detail::when_all_latch latch(sizeof...(As));
    auto children = std::make_tuple(detail::make_when_all_child(awaitables)...);
    co_await detail::when_all_awaiter{
        latch,
        [&]() noexcept { std::apply([&](auto&... c) { (c.start(latch), ...); }, children); }};
    latch.rethrow_if_failed();
    co_return std::apply([](auto&... c) { return std::make_tuple(c.take()...); }, children);
}

/// The same over a vector of awaitables of one type: yields a vector of their results in the
/// same order, or nothing when they yield nothing.
template <awaitable A>
auto when_all(std::vector<A> awaitables)
    -> task<std::conditional_t<std::is_void_v<await_result_t<A>>, void,
                               std::vector<detail::non_void_t<await_result_t<A>>>>> {
    using result = await_result_t<A>;
    detail::when_all_latch latch(awaitables.size());
    std::vector<detail::when_all_child<result>> children;
    children.reserve(awaitables.size());
    for (auto& a : awaitables) children.push_back(detail::make_when_all_child(a));
    co_await detail::when_all_awaiter{latch, [&]() noexcept {
                                          for (auto& c : children) c.start(latch);
                                      }};
    latch.rethrow_if_failed();
    if constexpr (!std::is_void_v<result>) {
        std::vector<result> out;
        out.reserve(children.size());
        for (auto& c : children) out.push_back(c.take());
        co_return out;
    }
}

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/core/impl/when_all.ipp>
#endif
