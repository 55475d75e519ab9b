#pragma once

// Scatter in one step: the root sends every rank its block at once, each straight from its
// place in the input (no copies).
// Cost: 1 round; the root sends (n - 1) blocks over n - 1 connections in parallel.
// Chosen: for scatter of large blocks (scatter's linear threshold, see select.hpp); on 2
// ranks sharing an arena, for blocks of 512 B to 32 KiB (thresholds::shm_pair_message_from).

#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

#include <cstring>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> scatter_linear(context& c, std::span<const std::byte> in,
                                    std::span<std::byte> out, int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/scatter_linear.ipp>
#endif
