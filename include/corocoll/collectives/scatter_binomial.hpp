#pragma once

// Scatter from `root` along a binomial tree: the root hands each child the blocks of the
// child's whole subtree in one message; inner ranks pass them on the same way.
// Cost: ceil(log2 n) rounds; the root sends (n - 1) blocks in log2(n) messages. Chosen: for
// scatter of small blocks.

#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

#include <cstring>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// `in` (n blocks, used on the root only) is cut into blocks of `out.size()` bytes; rank r
/// receives block r in `out`.
COROCOLL_DECL task<> scatter_binomial(context& c, std::span<const std::byte> in,
                                      std::span<std::byte> out, int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/scatter_binomial.ipp>
#endif
