#pragma once

// The store that the set-up of a group made from another one (new_group, split) goes through:
// its waits look at the parent group between looks at the store, so that a rank of the parent
// that dies while its subgroup is being set up fails the set-up on every rank at once, naming
// it, rather than leaving the others to wait for its keys until the timeout.

#include <corocoll/core/error.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/transport/engine.hpp>
#include <corocoll/version.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

/// A store seen through the liveness of a parent group (its engine): every call first checks
/// that the parent has not failed, and a wait (or a get, which waits) looks for its keys with
/// `check` every 1-10 ms, checking the parent in between, instead of one long wait that only
/// its timeout could end. A parent that fails (a rank's connection ended: its process died)
/// makes the call throw `errc::connection_closed`, saying which group was being set up and
/// the parent's own failure, which names the rank. Costs a store round trip per look while a
/// key is missing.
class parent_watched_store final : public rendezvous::store {
public:
    /// `what` names the set-up ("new_group 'default/sub3'"); `parent` and `reactor` outlive
    /// this store's calls.
    parent_watched_store(std::shared_ptr<rendezvous::store> base, const transport::engine& parent,
                         std::string parent_name, std::string what)
        : store(base->timeout()),
          base_(std::move(base)),
          parent_(parent),
          parent_name_(std::move(parent_name)),
          what_(std::move(what)) {}

    COROCOLL_DECL task<> set(std::string key, std::string value) override;
    COROCOLL_DECL task<std::string> get(std::string key) override;
    COROCOLL_DECL task<std::int64_t> add(std::string key, std::int64_t delta) override;
    COROCOLL_DECL task<std::string> compare_set(std::string key, std::string expected,
                                                std::string desired) override;
    COROCOLL_DECL task<> wait(std::vector<std::string> keys, duration timeout) override;
    using store::wait;
    COROCOLL_DECL task<bool> check(std::vector<std::string> keys) override;
    COROCOLL_DECL task<bool> delete_key(std::string key) override;
    COROCOLL_DECL task<std::int64_t> num_keys() override;

    /// Throws the parent's failure as this set-up's, if the parent failed.
    COROCOLL_DECL void check_parent() const;

    /// The longest pause between two looks at a missing key.
    static constexpr std::chrono::milliseconds longest_pause{10};

private:
    std::shared_ptr<rendezvous::store> base_;
    const transport::engine& parent_;
    std::string parent_name_;
    std::string what_;
};

/// The error a set-up whose parent group failed throws (see `parent_watched_store`).
COROCOLL_DECL std::system_error parent_failed_error(const transport::engine& parent,
                                                    const std::string& parent_name,
                                                    const std::string& what);

}  // namespace detail

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL std::system_error parent_failed_error(const transport::engine& parent,
                                                    const std::string& parent_name,
                                                    const std::string& what) {
    std::string culprit = parent.failed_peer() >= 0
                              ? "rank " + std::to_string(parent.failed_peer()) + " of "
                              : std::string();
    auto code = make_error_code(errc::connection_closed);
    // The parent's text ends with its code's words, which this error's what() adds again.
    std::string cause = parent.failure_what();
    std::string tail = ": " + code.message();
    if (cause.size() > tail.size() &&
        cause.compare(cause.size() - tail.size(), tail.size(), tail) == 0) {
        cause.resize(cause.size() - tail.size());
    }
    return std::system_error(code, "corocoll: rank " + std::to_string(parent.rank()) + ": " + what +
                                       ": stopped, " + culprit + "the parent group '" +
                                       parent_name + "' failed during set-up: " + cause);
}

COROCOLL_DECL void parent_watched_store::check_parent() const {
    if (parent_.failed()) throw parent_failed_error(parent_, parent_name_, what_);
}

COROCOLL_DECL task<> parent_watched_store::set(std::string key, std::string value) {
    check_parent();
    co_await base_->set(std::move(key), std::move(value));
}

COROCOLL_DECL task<std::string> parent_watched_store::get(std::string key) {
    std::vector<std::string> keys{key};
    co_await wait(std::move(keys), timeout());
    co_return co_await base_->get(std::move(key));
}

COROCOLL_DECL task<std::int64_t> parent_watched_store::add(std::string key, std::int64_t delta) {
    check_parent();
    co_return co_await base_->add(std::move(key), delta);
}

COROCOLL_DECL task<std::string> parent_watched_store::compare_set(std::string key,
                                                                  std::string expected,
                                                                  std::string desired) {
    check_parent();
    co_return co_await base_->compare_set(std::move(key), std::move(expected), std::move(desired));
}

COROCOLL_DECL task<> parent_watched_store::wait(std::vector<std::string> keys, duration timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
        check_parent();
        if (co_await base_->check(keys)) co_return;
        check_parent();
        auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
            corocoll::detail::throw_error(
                std::make_error_code(std::errc::timed_out),
                "corocoll: store: wait for " + rendezvous::detail::join_keys(keys) +
                    " timed out after " + std::to_string(timeout.count()) + " ms");
        }
        auto* r = io::reactor::current();
        if (r == nullptr) {
            // No reactor to pause on (a caller outside corocoll's loop): one plain wait.
            co_await base_->wait(std::move(keys), std::chrono::duration_cast<duration>(
                                                      deadline - now + duration(1)));
            co_return;
        }
        co_await r->sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
        pause = std::min(pause * 2, longest_pause);
    }
}

COROCOLL_DECL task<bool> parent_watched_store::check(std::vector<std::string> keys) {
    check_parent();
    co_return co_await base_->check(std::move(keys));
}

COROCOLL_DECL task<bool> parent_watched_store::delete_key(std::string key) {
    check_parent();
    co_return co_await base_->delete_key(std::move(key));
}

COROCOLL_DECL task<std::int64_t> parent_watched_store::num_keys() {
    co_return co_await base_->num_keys();
}

}  // namespace detail

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
