#pragma once

// Gather to `root` along a binomial tree: each rank collects its subtree's blocks (in rank
// order relative to the root) and sends them to its parent in one message.
// Cost: ceil(log2 n) rounds; the root receives (n - 1) blocks in log2(n) messages; inner
// ranks forward their subtrees once. Chosen: for gather of small blocks.

#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// `out` (n blocks, used on the root only) receives every rank's `in` in rank order.
COROCOLL_DECL task<> gather_binomial(context& c, std::span<const std::byte> in,
                                     std::span<std::byte> out, int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/gather_binomial.ipp>
#endif
