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

#if COROCOLL_DEFINE_BODIES
#include <corocoll/process_group/impl/parent_watch.ipp>
#endif
