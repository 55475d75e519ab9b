#pragma once

// All-to-all with every message in flight at once: each rank posts its n - 1 receives, sends
// its n - 1 blocks, then waits for the receives.
// Cost: one round of n - 1 messages each way; where the pairwise exchange waits for each
// round's partner before the next, these overlap, so a small call pays about one latency
// instead of n - 1. Every peer's message arrives at once, so a large call has n - 1 streams
// competing for each rank's link and memory. Chosen: for small blocks without a shared arena
// (select.hpp).

#include <corocoll/collectives/all_to_all_pairwise.hpp>
#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// all_to_all_pairwise's form: rank r's block for rank p is `in[in_offsets[p] ..
/// in_offsets[p + 1])`; the block from rank p lands at `out[out_offsets[p] .. out_offsets[p +
/// 1])` (offsets in bytes, n + 1 each).
COROCOLL_DECL task<> all_to_all_linear(context& c, std::span<std::byte> out,
                                       const std::vector<std::size_t>& out_offsets,
                                       std::span<const std::byte> in,
                                       const std::vector<std::size_t>& in_offsets);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/all_to_all_linear.ipp>
#endif
