#pragma once

// Reduce-scatter around a ring: `data` holds n blocks; in round s every rank sends block
// (r - s - 1) to rank + 1 and reduces block (r - s - 2) from rank - 1 into its own copy. After
// n - 1 rounds block r on rank r is the reduction of everyone's block r.
// Cost: n - 1 rounds; each rank sends and receives (n - 1)/n * bytes and reduces as much;
// bus bandwidth optimal. Chosen: for reduce_scatter always, and as the first half of
// all_reduce_ring.

#include <corocoll/collectives/ring.hpp>
#include <corocoll/version.hpp>

#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Blocks are `block_range(count, n, i)` of `data` (count = data.size() / elem); block r ends
/// up reduced on rank r. Rounds `first_round` .. `first_round + n - 2`.
COROCOLL_DECL task<> reduce_scatter_ring(context& c, std::span<std::byte> data,
                                         const reduction& red, std::uint32_t first_round = 0);

/// reduce_scatter_into's form: `in` (n equal blocks of out.size() bytes) is left as it was;
/// rank r's reduced block (finished: avg divides) lands in `out`. Each round receives
/// straight into its destination and reduces the rank's own block of `in` into it; the
/// destinations alternate between `out` and one block of scratch (none for 2 ranks), and the
/// last round's is `out`. Nothing is copied and no scratch as large as `in` is needed (a
/// copy of `in` in scratch, which the group frees above 8 MiB, faulted in fresh pages on
/// every large call; docs/performance.md, "Why the defaults"). When `out` overlaps `in`, or the
/// blocks are not equal, it works on a copy of `in` in the group's scratch instead.
COROCOLL_DECL task<> reduce_scatter_ring(context& c, std::span<std::byte> out,
                                         std::span<const std::byte> in, const reduction& red);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/reduce_scatter_ring.ipp>
#endif
