#pragma once

// All-to-all by pairwise exchange: in round s every rank sends its block for rank + s and
// receives the block from rank - s, so each round is a perfect matching of the ranks.
// Cost: n - 1 rounds; each rank sends and receives every block but its own once. Chosen:
// always for all_to_all (equal or given split sizes).

#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

#include <cstring>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Rank r's block for rank p is `in[in_offsets[p] .. in_offsets[p + 1])`; the block from rank
/// p lands at `out[out_offsets[p] .. out_offsets[p + 1])` (offsets in bytes, n + 1 each).
COROCOLL_DECL task<> all_to_all_pairwise(context& c, std::span<std::byte> out,
                                         const std::vector<std::size_t>& out_offsets,
                                         std::span<const std::byte> in,
                                         const std::vector<std::size_t>& in_offsets);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/all_to_all_pairwise.ipp>
#endif
