#pragma once

// Reduce, gather and scatter of small buffers through the group's shared arena
// (transport/shm/arena.hpp), for a group whose ranks all share one host, in the ranks' step
// lines (shm_arena::line_bytes, 272 bytes a step) rather than its data sets. Reduce and
// gather: every rank but the root writes its buffer into its lines and goes on without waiting
// (shm_arena::arrive_and_go); the root waits for every rank at that step and reduces every
// copy in rank order, or copies each block into place. Scatter: the root writes every block
// into its lines and goes on; each other rank waits for the root alone and copies its block.
// The ranks that go on wait for nobody until they are shm_arena's `arena_steps` steps ahead
// of the slowest (settle_lines): a loop of them runs as a queue, the way an MPI's eager
// messages do, where the messages of gather_linear / reduce_binomial cost a round of the pair
// channels' rings per call.
// Cost: one step, no message; the root reads n - 1 copies (reduce, gather) or writes n blocks
// (scatter). Only while the buffer fits a step's lines (`rooted_shm_fits`).
// Chosen: on a group with an arena, wherever it fits (select.hpp).

#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/reduction.hpp>
#include <corocoll/transport/shm/arena.hpp>
#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Whether a rank's lines carry what one rank writes for the step: `bytes` (a reduce's
/// buffer, a gather's block, the whole of what a scatter's root hands out).
constexpr bool rooted_shm_fits(std::size_t bytes) noexcept {
    return bytes <= transport::shm_arena::line_bytes;
}

/// `data` of rank `root` gets the reduction over every rank's `data`, in rank order; the
/// other ranks' buffers are left as they were.
COROCOLL_DECL task<> reduce_shm(context& c, std::span<std::byte> data, const reduction& red,
                                int root);

/// Rank `root`'s `out` gets every rank's `in` (equal blocks, in rank order).
COROCOLL_DECL task<> gather_shm(context& c, std::span<const std::byte> in, std::span<std::byte> out,
                                int root);

/// Rank r's `out` gets block r of rank `root`'s `in` (n blocks of out.size() bytes).
COROCOLL_DECL task<> scatter_shm(context& c, std::span<const std::byte> in,
                                 std::span<std::byte> out, int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/rooted_shm.ipp>
#endif
