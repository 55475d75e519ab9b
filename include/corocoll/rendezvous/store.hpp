#pragma once

// The key-value store interface through which ranks find each other (c10d's Store).

#include <corocoll/core/error.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/version.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {

/// The key-value store through which ranks find each other, as c10d's `Store`: every method
/// is a coroutine to await on the calling thread's reactor (`sync_wait` it from plain code).
/// Keys are strings; values are byte strings held in `std::string` (any bytes, not only text).
/// Every wait is bounded by the store's timeout; a timeout throws `std::system_error` with
/// `std::errc::timed_out` naming the keys that were missing.
class store {
public:
    /// The unit of timeouts.
    using duration = std::chrono::milliseconds;

    /// c10d's default store timeout.
    static constexpr duration default_timeout = std::chrono::minutes(5);

    virtual ~store() = default;

    /// Sets `key` to `value`, replacing an old value; wakes whoever waits for `key`.
    virtual task<> set(std::string key, std::string value) = 0;
    /// Waits (up to `timeout()`) until `key` exists and returns its value.
    virtual task<std::string> get(std::string key) = 0;
    /// Adds `delta` to the integer stored at `key` (0 if absent; stored as decimal text, as
    /// c10d does) and returns the new value.
    virtual task<std::int64_t> add(std::string key, std::int64_t delta) = 0;
    /// If `key` holds `expected` (or is absent and `expected` is empty), stores `desired`.
    /// Returns what `key` holds afterwards (for an absent key and a non-empty `expected`:
    /// `expected`, as c10d does).
    virtual task<std::string> compare_set(std::string key, std::string expected,
                                          std::string desired) = 0;
    /// Waits until every key in `keys` exists, for at most `timeout`.
    virtual task<> wait(std::vector<std::string> keys, duration timeout) = 0;
    /// True when every key in `keys` exists; never waits.
    virtual task<bool> check(std::vector<std::string> keys) = 0;
    /// Deletes `key`; true if it existed.
    virtual task<bool> delete_key(std::string key) = 0;
    /// Number of keys in the store.
    virtual task<std::int64_t> num_keys() = 0;
    /// Waits (up to `timeout`) until every key of `keys` exists and returns their values in
    /// the order of `keys`, as c10d's `multi_get`. This default waits once and gets each key;
    /// `tcp_store` asks its server for all of them in one round trip.
    COROCOLL_DECL virtual task<std::vector<std::string>> multi_get(std::vector<std::string> keys,
                                                                   duration timeout);

    /// `wait(keys, timeout())`.
    task<> wait(std::vector<std::string> keys) { return wait(std::move(keys), timeout_); }
    /// `multi_get(keys, timeout())`.
    task<std::vector<std::string>> multi_get(std::vector<std::string> keys) {
        return multi_get(std::move(keys), timeout_);
    }

    /// The timeout of `get` and of `wait` without an explicit one.
    duration timeout() const noexcept { return timeout_; }
    /// Sets how long later waits wait.
    void set_timeout(duration t) noexcept { timeout_ = t; }

protected:
    /// A store whose waits time out after `timeout`.
    explicit store(duration timeout) noexcept : timeout_(timeout) {}
    /// Copies the timeout.
    store(const store&) = default;
    /// Copies the timeout.
    store& operator=(const store&) = default;

private:
    duration timeout_;
};

namespace detail {

/// The integer an `add` finds at `key` (decimal text, as c10d stores it); anything else is an
/// error naming the key.
COROCOLL_DECL std::int64_t parse_store_int(const std::string& key, const std::string& text);

/// `old + delta` for an ADD to `key`; throws `std::system_error` (value_too_large) naming the
/// key where the sum leaves the int64 range, rather than wrap.
COROCOLL_DECL std::int64_t checked_add(const std::string& key, std::int64_t old,
                                       std::int64_t delta);

COROCOLL_DECL std::string join_keys(const std::vector<std::string>& keys);

}  // namespace detail

}  // namespace rendezvous

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/rendezvous/impl/store.ipp>
#endif
