#pragma once

// All-reduce through the group's shared arena (transport/shm/arena.hpp), for a group whose
// ranks all share one host. Small buffers (whole: n * bytes at most `whole_bytes`): every rank
// writes its buffer into the arena (at most 32 bytes go in its own line, so a 4-byte
// all_reduce moves one line per peer), meets the others at one step, and reduces every rank's
// copy itself, in rank order, so that every rank computes the same bits. Larger buffers go in
// chunks of a slot (the arena's data set / n): every rank copies its chunk in, one step, then
// reduces its own slice of the chunk over every rank's copy into the arena, a second step,
// then copies the whole reduced chunk out.
// Cost: small: one step; each rank writes bytes and reads n * bytes. Large: two steps per
// chunk; each rank writes bytes + bytes / n, reads bytes (its slice of every copy) + bytes
// (the result): about three copies of the buffer per rank, whatever n, with no message.
// On 2 ranks, from the arena's single-copy size for all_reduce (shm_arena::single_copy: by
// default a buffer the size of the L2) nothing goes through the arena: each rank offers its
// buffer, reduces its own half in place from the other's half, read straight from its memory
// in pieces that stay in the L2 (process_vm_readv), and then copies the other's reduced half
// into its buffer the same way: each rank reads half the buffer from the other twice and its
// own half once, writing the buffer once, instead of the arena's three copies
// (`all_reduce_single_copies`).
// Chosen: on a group with an arena, by size (see select.hpp).

#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/reduction.hpp>
#include <corocoll/transport/shm/arena.hpp>
#include <corocoll/version.hpp>

#include <cassert>
#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// At most this many bytes, times the group's size, are reduced whole by every rank in one step.
inline constexpr std::size_t all_reduce_shm_whole_bytes = std::size_t{64} << 10;

COROCOLL_DECL task<> all_reduce_shm(context& c, std::span<std::byte> data, const reduction& red);

/// The single-copy path of all_reduce_shm on 2 ranks, from a call that has settled and
/// declared itself: both offer `data`; at the first step rank r reduces half r of its buffer
/// (the blocks of `block_range`) in place from the other's half r (every op is commutative),
/// in pieces of `single_copy_piece_bytes`; at the second step it copies the other's half; at
/// the third both are done reading each other's buffer.
COROCOLL_DECL task<> all_reduce_single_copies(context& c, std::span<std::byte> data,
                                              const reduction& red);

/// The pieces of a block that all_reduce_single_copies reads from another rank and reduces at
/// once: an eighth of the L2 the arena holds (256 KiB where it holds none), so that the piece,
/// the own block's part and the result stay in it. Measured on the 2 MiB L2 (docs/performance.md,
/// "all_reduce of 2 ranks by single copies"): 256 and 512 KiB alike, 64 KiB and 1 MiB slower.
COROCOLL_DECL std::size_t single_copy_piece_bytes(const transport::shm_arena& a) noexcept;

namespace detail {

/// The large path of all_reduce_shm, and of reduce_shm beyond the lines, from a call that has
/// settled and declared itself: `data` in chunks of a slot of the data sets; every rank copies
/// its chunk in, one step, reduces its slice of the chunk over every copy in rank order into
/// the other set, a second step, and copies the reduced chunk out: every rank where `root` is
/// negative, the root alone otherwise, the others going on at the last chunk's second step
/// (they read nothing of it).
COROCOLL_DECL task<> reduce_in_slices(context& c, std::span<std::byte> data, const reduction& red,
                                      int root);

}  // namespace detail

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/all_reduce_shm.ipp>
#endif
