#pragma once

// What `co_await t` would use, found at compile time: the awaiter type and its result type.

#include <corocoll/version.hpp>

#include <concepts>
#include <coroutine>
#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

template <class T>
concept has_member_co_await = requires(T&& t) {
    std::forward<T>(t).operator co_await();
};

template <class T>
concept has_free_co_await = requires(T&& t) {
    operator co_await(std::forward<T>(t));
};

template <class T>
concept is_awaiter = requires(T& a, std::coroutine_handle<> h) {
    { a.await_ready() } -> std::convertible_to<bool>;
    a.await_suspend(h);
    a.await_resume();
};

/// The awaiter that `co_await t` would use: `t.operator co_await()`, a free `operator co_await`,
/// or `t` itself.
template <class T>
decltype(auto) get_awaiter(T&& t) {
    if constexpr (has_member_co_await<T>) {
        return std::forward<T>(t).operator co_await();
    } else if constexpr (has_free_co_await<T>) {
        return operator co_await(std::forward<T>(t));
    } else {
        return std::forward<T>(t);
    }
}

/// Stands in for `void` where a value is needed: a `when_all` over `task<void>`s yields these.
struct void_value {
    friend bool operator==(void_value, void_value) = default;
};

template <class T>
using non_void_t = std::conditional_t<std::is_void_v<T>, void_value, T>;

}  // namespace detail

/// A type that `co_await` accepts.
template <class T>
concept awaitable = requires(T&& t) {
    { detail::get_awaiter(std::forward<T>(t)) } -> detail::is_awaiter;
};

/// What `co_await std::declval<T>()` yields.
template <awaitable T>
using await_result_t = decltype(detail::get_awaiter(std::declval<T>()).await_resume());

namespace detail {

/// Holds the outcome of an operation: nothing yet, a value (or reference), or an exception.
template <class T>
class result_slot {
public:
    template <class... Args>
    void set_value(Args&&... args) {
        if constexpr (std::is_reference_v<T>) {
            value_ = std::addressof(args...);
        } else {
            value_.emplace(std::forward<Args>(args)...);
        }
    }
    void set_exception(std::exception_ptr e) noexcept { exception_ = std::move(e); }
    bool has_exception() const noexcept { return static_cast<bool>(exception_); }

    /// Rethrows a stored exception or moves the value out.
    T take() {
        if (exception_) std::rethrow_exception(exception_);
        if constexpr (std::is_reference_v<T>) {
            return static_cast<T>(*value_);
        } else {
            return std::move(*value_);
        }
    }
    /// Rethrows a stored exception or gives access to the value in place.
    std::add_lvalue_reference_t<T> get() {
        if (exception_) std::rethrow_exception(exception_);
        return *value_;
    }

private:
    using stored =
        std::conditional_t<std::is_reference_v<T>, std::remove_reference_t<T>*, std::optional<T>>;
    stored value_{};
    std::exception_ptr exception_;
};

template <>
class result_slot<void> {
public:
    void set_value() noexcept {}
    void set_exception(std::exception_ptr e) noexcept { exception_ = std::move(e); }
    bool has_exception() const noexcept { return static_cast<bool>(exception_); }
    void take() {
        if (exception_) std::rethrow_exception(exception_);
    }
    void get() { take(); }

private:
    std::exception_ptr exception_;
};

}  // namespace detail

COROCOLL_END_NAMESPACE
