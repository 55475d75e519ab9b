#pragma once

// Reduce-scatter and all-to-all through the group's shared arena (transport/shm/arena.hpp),
// for a group whose ranks all share one host: every rank copies its whole input (n blocks)
// into its slot of the arena, meets the others at one step, and reads block `rank` of every
// rank's slot: all-to-all copies each into place, reduce-scatter reduces them over every rank
// in rank order. An input of up to 32 bytes goes in the rank's own line; blocks larger than
// a slot's share (the arena's data set / n / n) go in pieces of that share, one step each.
// From the group's single-copy size (shm_arena::single_copy; 16 KiB on 2 ranks by default),
// all-to-all puts only the inputs' addresses in the arena: each rank copies its own block
// into place and block `rank` of every other rank's input straight from that rank's buffer
// (process_vm_readv), then waits at a second step until every rank is done with its input;
// every other call backward (shm_arena::next_sweep_backward), as all_gather_shm does.
// Cost: one step per piece, with no message: each rank writes its input once and reads n
// blocks once, where the pairwise exchange and the ring each take n - 1 rounds of messages.
// With single copies: two steps, one copy of each block (the pairwise exchange's messages
// make two).
// Chosen: on a group with an arena, for inputs below `thresholds::shm_pair_exchange_below`
// (2 ranks) or `shm_exchange_below`, and all-to-all at every size where its blocks go by
// single copies (select.hpp); all-to-all only with equal blocks (uneven splits go pairwise).

#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/reduction.hpp>
#include <corocoll/transport/shm/arena.hpp>
#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Whether the arena carries an input of `in_bytes` (blocks of a multiple of `grain` bytes):
/// in one line, or in a slot's share per block of at least one grain. Where it does not (so
/// many ranks that a share is smaller than an element), the callers go by messages.
COROCOLL_DECL bool exchange_shm_fits(const transport::shm_arena& a, std::size_t in_bytes,
                                     std::size_t grain) noexcept;

/// Rank r's `out` gets the reduction over every rank of block r of `in` (n blocks of
/// out.size() bytes).
COROCOLL_DECL task<> reduce_scatter_shm(context& c, std::span<std::byte> out,
                                        std::span<const std::byte> in, const reduction& red);

/// Block p of rank r's `in` lands in block r of rank p's `out` (n equal blocks each).
COROCOLL_DECL task<> all_to_all_shm(context& c, std::span<std::byte> out,
                                    std::span<const std::byte> in);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/exchange_shm.ipp>
#endif
