// The bodies of the non-template functions declared in
// <corocoll/collectives/broadcast_object_binomial.hpp>: inline where corocoll is header-only,
// compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/broadcast_object_binomial.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> broadcast_object_binomial(context& c, std::string& bytes, int root) {
    std::int64_t len = static_cast<std::int64_t>(bytes.size());
    co_await broadcast_binomial(c, std::as_writable_bytes(std::span(&len, 1)), root);
    bytes.resize(static_cast<std::size_t>(len));
    auto body = std::as_writable_bytes(std::span(bytes.data(), bytes.size()));
    thresholds t{};
    t.chain_piece_bytes = c.chunk_bytes;
    if (select(collective_kind::broadcast, body.size(), c.size(), {}, t) == algorithm::chain) {
        co_await broadcast_chain(c, body, root, 1);
    } else {
        co_await broadcast_binomial(c, body, root, 1);
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
