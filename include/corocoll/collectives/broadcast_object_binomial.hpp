#pragma once

// broadcast_object_list: the root's serialized list goes out in two broadcasts, its length in
// round 0 (binomial tree) so that every rank can size its buffer, then its bytes from round 1:
// by the chain (pipelined) when they are large and there are more than two ranks, otherwise by
// the binomial tree.
// Cost: the length costs ceil(log2 n) rounds of 8 bytes; the bytes cost what
// broadcast_binomial or broadcast_chain costs for them. Chosen: always for
// broadcast_object_list.

#include <corocoll/collectives/broadcast_binomial.hpp>
#include <corocoll/collectives/broadcast_chain.hpp>
#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/select.hpp>
#include <corocoll/version.hpp>

#include <cstdint>
#include <span>
#include <string>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Every rank's `bytes` becomes `root`'s (resized as needed).
COROCOLL_DECL task<> broadcast_object_binomial(context& c, std::string& bytes, int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> broadcast_object_binomial(context& c, std::string& bytes, int root) {
    std::int64_t len = static_cast<std::int64_t>(bytes.size());
    co_await broadcast_binomial(c, std::as_writable_bytes(std::span(&len, 1)), root);
    bytes.resize(static_cast<std::size_t>(len));
    auto body = std::as_writable_bytes(std::span(bytes.data(), bytes.size()));
    if (body.size() >= thresholds{}.broadcast_chain_bytes && c.size() > 2) {
        co_await broadcast_chain(c, body, root, 1);
    } else {
        co_await broadcast_binomial(c, body, root, 1);
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
