#pragma once

// A store inside another store under a key prefix, as c10d's PrefixStore.

#include <corocoll/rendezvous/store.hpp>
#include <corocoll/version.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {

/// A namespace inside another store: every key becomes `prefix + "/" + key`, as c10d's
/// `PrefixStore` does, so process groups (and launcher attempts) do not see each other's
/// keys. `num_keys` counts the whole underlying store, as c10d's does.
class prefix_store final : public store {
public:
    /// Every key of `base` seen through this store is `prefix + "/" + key`.
    prefix_store(std::string prefix, std::shared_ptr<store> base)
        : store(base->timeout()), prefix_(std::move(prefix)), base_(std::move(base)) {}

    /// The prefix put before every key.
    const std::string& prefix() const noexcept { return prefix_; }
    /// The store the keys go to.
    const std::shared_ptr<store>& underlying() const noexcept { return base_; }

    task<> set(std::string key, std::string value) override {
        return base_->set(full(key), std::move(value));
    }
    task<std::string> get(std::string key) override { return with_timeout_get(full(key)); }
    task<std::int64_t> add(std::string key, std::int64_t delta) override {
        return base_->add(full(key), delta);
    }
    task<std::string> compare_set(std::string key, std::string expected,
                                  std::string desired) override {
        return base_->compare_set(full(key), std::move(expected), std::move(desired));
    }
    COROCOLL_DECL task<> wait(std::vector<std::string> keys, duration timeout) override;
    using store::wait;
    COROCOLL_DECL task<bool> check(std::vector<std::string> keys) override;
    task<bool> delete_key(std::string key) override { return base_->delete_key(full(key)); }
    task<std::int64_t> num_keys() override { return base_->num_keys(); }
    COROCOLL_DECL task<std::vector<std::string>> multi_get(std::vector<std::string> keys,
                                                           duration timeout) override;
    using store::multi_get;

private:
    std::string full(const std::string& key) const { return prefix_ + "/" + key; }

    // get() honours this store's timeout, which may differ from the base store's.
    task<std::string> with_timeout_get(std::string key);

    std::string prefix_;
    std::shared_ptr<store> base_;
};

}  // namespace rendezvous

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/rendezvous/impl/prefix_store.ipp>
#endif
