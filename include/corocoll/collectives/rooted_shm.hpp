#pragma once

// Reduce, gather and scatter through the group's shared arena (transport/shm/arena.hpp), for a
// group whose ranks all share one host.
// Small (what one rank writes fits its step lines, shm_arena::line_bytes: 4 KiB): reduce
// and gather: every rank but the root writes its buffer into its lines and goes on without
// waiting (shm_arena::arrive_and_go); the root waits for every rank at that step and reduces
// every copy in rank order, or copies each block into place. Scatter: the root writes every
// other rank's block into its lines and goes on; each other rank waits for the root alone and
// copies its block. The ranks that go on wait for nobody until they are one step fewer ahead
// of the slowest than the arena has places per rank (transport::detail::arena_steps_for: 32 on 2
// ranks, 128 on 3 to 8, 8 beyond; settle_lines): a loop of them runs as a queue, the way an MPI's
// eager messages do. Larger gathers and scatters: from the group's single-copy size
// (shm_arena::single_copy) the root copies every block straight from the others' buffers
// (gather), or the others copy theirs straight from the root's (scatter), and the rank whose
// buffer was read waits at a second step until that is done; below it, in pieces of a slot of
// the data sets, the writers (gather's others, scatter's root) going on at each piece. Larger
// reduces go in chunks of a slot of the data sets: every rank copies its chunk in, one step;
// reduces its slice of the chunk over every copy, in rank order, into the other set, a second
// step; the root copies the reduced chunk out, and the others go on at the last chunk's step.
// Cost: one step (two with single copies) per piece, no message: each block is copied into the
// arena and out of it once (by a single copy: once in all), where gather_linear and
// scatter_linear move it through a pair channel's ring (two copies). A reduce beyond the
// lines: two steps per chunk; each rank writes bytes + bytes / n and reads bytes, the root
// bytes more (the result), where reduce_binomial's messages move bytes through a channel's
// ring at each of its log2 n levels.
// Chosen: on a group with an arena, by size (select.hpp).

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

/// Whether gather_shm and scatter_shm (`u`) carry blocks of `block` bytes (`lines`: what one
/// rank writes for a step's lines): in the lines, by single copies, or in pieces of a slot
/// (none where a slot is empty: many thousands of ranks on a small arena; the callers go by
/// messages).
inline bool rooted_shm_carries(const transport::shm_arena& a, transport::single_copy_use u,
                               std::size_t lines, std::size_t block) noexcept {
    return rooted_shm_fits(lines) || a.single_copy(u, block) || a.slot_bytes() > 0;
}

/// Whether reduce_shm carries a buffer of `bytes` (elements of `elem` bytes): in the lines,
/// or in chunks of a slot of the data sets (none where a slot holds no element: many
/// thousands of ranks on a small arena; the caller goes by messages).
inline bool reduce_shm_carries(const transport::shm_arena& a, std::size_t bytes,
                               std::size_t elem) noexcept {
    return rooted_shm_fits(bytes) || a.slot_bytes() >= elem;
}

/// Whether gather_shm carries blocks of `block` bytes in the ranks' lines (its small path).
inline bool gather_shm_in_lines(const transport::shm_arena& a, std::size_t block) noexcept {
    return rooted_shm_fits(block) && !a.single_copy(transport::single_copy_use::gather, block);
}

/// Whether scatter_shm carries blocks of `block` bytes in the root's lines (its small path).
inline bool scatter_shm_in_lines(const transport::shm_arena& a, std::size_t block) noexcept {
    return rooted_shm_fits(block * static_cast<std::size_t>(a.size())) &&
           !a.single_copy(transport::single_copy_use::scatter, block);
}

/// Where rank `r`'s block of `block` bytes starts in the lines of a scatter's root `root`
/// (the root leaves its own block out).
inline std::size_t scatter_shm_offset(int r, int root, std::size_t block) noexcept {
    return static_cast<std::size_t>(r < root ? r : r - 1) * block;
}

/// Whether the small path of a rooted call in the lines would run to its end now without
/// waiting: this rank's lines are free again (`lines_settled`) and, where this rank waits,
/// those it waits for have arrived at the step already: the root alone where the root writes
/// and goes on (`root_writes`: broadcast, scatter), else every other rank (the root of a
/// reduce or gather). Reads the others' lines; changes nothing else. `reads`: the bytes of
/// data this rank would read from the start of the lines of each rank it waits for (the
/// looks ask for those lines too: `shm_arena::arrived`).
inline bool rooted_shm_ready(transport::shm_arena& a, int root, bool root_writes,
                             std::size_t reads) noexcept {
    if (!a.lines_settled()) return false;
    const bool is_root = a.rank() == root;
    if (is_root == root_writes) return true;  // this rank writes and goes on
    const std::uint64_t s = a.next_step();
    if (!is_root) return a.arrived(root, s, reads);
    for (int r = 0; r < a.size(); ++r) {
        if (r != root && !a.arrived(r, s, reads)) return false;
    }
    return true;
}

/// reduce_shm, gather_shm and scatter_shm of what fits the lines, run to their end now,
/// without a coroutine, where `rooted_shm_ready` said so: `c` is the call, begun
/// (process_group::run_at_once); its deadline is not read. They throw what the comparison of
/// the calls finds, as the coroutines do.
COROCOLL_DECL void reduce_shm_now(context& c, std::span<std::byte> data, const reduction& red,
                                  int root);
COROCOLL_DECL void gather_shm_now(context& c, std::span<const std::byte> in,
                                  std::span<std::byte> out, int root);
COROCOLL_DECL void scatter_shm_now(context& c, std::span<const std::byte> in,
                                   std::span<std::byte> out, int root);

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
