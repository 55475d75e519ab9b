#pragma once

// Gather in one step: every rank sends its block to the root, which receives from all of them
// at once, each block straight into its place in the output (no copies).
// Cost: 1 round; the root receives (n - 1) blocks over n - 1 connections in parallel.
// Chosen: for gather of large blocks (gather's linear threshold, see select.hpp); on 2 ranks
// sharing an arena, for blocks of 2 to 32 KiB and from half the L2 in all
// (thresholds::shm_pair_gather_message_from, shm_pair_rooted_below).

#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

#include <cstring>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> gather_linear(context& c, std::span<const std::byte> in,
                                   std::span<std::byte> out, int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/gather_linear.ipp>
#endif
