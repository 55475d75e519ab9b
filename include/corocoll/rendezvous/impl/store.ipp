// The bodies of the non-template functions declared in <corocoll/rendezvous/store.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/rendezvous/store.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {

COROCOLL_DECL task<std::vector<std::string>> store::multi_get(std::vector<std::string> keys,
                                                              duration timeout) {
    co_await wait(keys, timeout);
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (auto& k : keys) values.push_back(co_await get(std::move(k)));
    co_return values;
}

namespace detail {

COROCOLL_DECL std::int64_t parse_store_int(const std::string& key, const std::string& text) {
    try {
        std::size_t used = 0;
        long long v = std::stoll(text, &used);
        if (used == text.size()) return v;
    } catch (const std::exception&) {
    }
    throw std::invalid_argument("corocoll: store add: the value of key '" + key +
                                "' is not an integer");
}

COROCOLL_DECL std::int64_t checked_add(const std::string& key, std::int64_t old,
                                       std::int64_t delta) {
    std::int64_t sum = 0;
    if (__builtin_add_overflow(old, delta, &sum)) {
        corocoll::detail::throw_error(std::make_error_code(std::errc::value_too_large),
                                      "corocoll: store: add of " + std::to_string(delta) + " to '" +
                                          key + "' (now " + std::to_string(old) +
                                          ") would overflow int64; the value is unchanged");
    }
    return sum;
}

COROCOLL_DECL std::string join_keys(const std::vector<std::string>& keys) {
    std::string out;
    for (const auto& k : keys) {
        if (!out.empty()) out += ", ";
        out += "'" + k + "'";
    }
    return out;
}

}  // namespace detail
}  // namespace rendezvous

COROCOLL_END_NAMESPACE
