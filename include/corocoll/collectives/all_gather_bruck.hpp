#pragma once

// All-gather by Bruck's algorithm: in round k every rank sends the first min(2^k, n - 2^k)
// blocks it holds to rank - 2^k and appends as many from rank + 2^k; a final local rotation
// puts the blocks in rank order.
// Cost: ceil(log2 n) rounds for any n; each rank sends (n - 1) blocks in all, plus one local
// copy of the result. Chosen: for all_gather of small totals.

#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// `out` holds n blocks of `block` bytes; rank r's own block is `in`.
COROCOLL_DECL task<> all_gather_bruck(context& c, std::span<std::byte> out,
                                      std::span<const std::byte> in);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/all_gather_bruck.ipp>
#endif
