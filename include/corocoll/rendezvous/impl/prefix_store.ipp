// The bodies of the non-template functions declared in <corocoll/rendezvous/prefix_store.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/rendezvous/prefix_store.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {

COROCOLL_DECL task<> prefix_store::wait(std::vector<std::string> keys, duration timeout) {
    for (auto& k : keys) k = full(k);
    return base_->wait(std::move(keys), timeout);
}

COROCOLL_DECL task<bool> prefix_store::check(std::vector<std::string> keys) {
    for (auto& k : keys) k = full(k);
    return base_->check(std::move(keys));
}

COROCOLL_DECL task<std::vector<std::string>> prefix_store::multi_get(std::vector<std::string> keys,
                                                                     duration timeout) {
    for (auto& k : keys) k = full(k);
    return base_->multi_get(std::move(keys), timeout);
}

COROCOLL_DECL task<std::string> prefix_store::with_timeout_get(std::string key) {
    // Named: g++ 12.2 rejects an initializer_list temporary inside co_await
    // ("array used as initializer").
    std::vector<std::string> keys{key};
    co_await base_->wait(std::move(keys), timeout());
    co_return co_await base_->get(std::move(key));
}

}  // namespace rendezvous

COROCOLL_END_NAMESPACE
