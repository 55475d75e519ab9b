#pragma once

// Broadcast through the group's shared arena (transport/shm/arena.hpp), for a group whose
// ranks all share one host: the root copies the buffer into the arena once, in pieces, and
// every other rank copies each piece out once the root has reached the piece's step (it waits
// for the root alone). The root does not wait at its steps (`arrive_and_go`): before it writes
// piece k + 1 (in the other data set) it waits for every rank to reach piece k's step, which
// they do once they have copied piece k - 1 out; so it writes piece k + 1 while the others copy
// piece k, and returns after writing the last, as a send returns once its bytes are handed
// over: a loop of broadcasts pipelines from one call to the next. Up to
// shm_arena::line_bytes (4 KiB) go in the root's own step lines instead of a data set, which the
// root may write again long before every reader is done with the last call's (settle_lines):
// a loop of small broadcasts runs one call fewer ahead of the readers than the arena has places
// per rank (transport::detail::arena_steps_for: 32 on 2 ranks, 128 on 3-8, 8 beyond), as an MPI's
// eager messages do, where each call once waited for the readers' look at the one before.
// From the group's single-copy size (shm_arena::single_copy), where every rank may read every
// other's memory, the arena carries only the root's address instead: every other rank copies
// the root's buffer straight into its own (process_vm_readv), and the root waits at a second
// step until they all have (its buffer is the user's again once it returns). Every other such
// copy goes backward (shm_arena::next_sweep_backward).
// Cost: one step per piece; the root writes bytes once, whatever n; every other rank reads
// bytes once: n copies in all against 2 (n - 1) through the channels, with no message. With
// single copies: two steps, and n - 1 copies in all (none by the root).
// Chosen: on a group with an arena, by size (see select.hpp).

#include <corocoll/collectives/context.hpp>
#include <corocoll/transport/shm/arena.hpp>
#include <corocoll/version.hpp>

#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Bytes per piece of the shared-memory broadcast (at most the arena's data set).
inline constexpr std::size_t broadcast_shm_piece_bytes = std::size_t{256} << 10;

COROCOLL_DECL task<> broadcast_shm(context& c, std::span<std::byte> data, int root);

/// Whether broadcast_shm carries `bytes` in the root's step lines (no data set, no single copy).
inline bool broadcast_shm_in_lines(const transport::shm_arena& a, std::size_t bytes) noexcept {
    return bytes <= transport::shm_arena::line_bytes &&
           !a.single_copy(transport::single_copy_use::broadcast, bytes);
}

/// broadcast_shm of `data` in the root's lines, run to its end now, without a coroutine,
/// where collectives::rooted_shm_ready (root writes) said so: `c` is the call, begun
/// (process_group::run_at_once); its deadline is not read. Throws what the comparison of the
/// calls finds, as broadcast_shm would.
COROCOLL_DECL void broadcast_shm_now(context& c, std::span<std::byte> data, int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/broadcast_shm.ipp>
#endif
