#pragma once

// All-reduce through the group's shared arena (transport/shm/arena.hpp), for a group whose
// ranks all share one host. Small buffers (whole: n * bytes at most `whole_bytes`): every rank
// writes its buffer into the arena (at most 16 bytes go in its own line, so a 4-byte
// all_reduce moves one line per peer), meets the others at one step, and reduces every rank's
// copy itself, in rank order, so that every rank computes the same bits. Larger buffers go in
// chunks of a slot (the arena's data set / n): every rank copies its chunk in, one step, then
// reduces its own slice of the chunk over every rank's copy into the arena, a second step,
// then copies the whole reduced chunk out.
// Cost: small: one step; each rank writes bytes and reads n * bytes. Large: two steps per
// chunk; each rank writes bytes + bytes / n, reads bytes (its slice of every copy) + bytes
// (the result): about three copies of the buffer per rank, whatever n, with no message.
// Chosen: on a group with an arena, by size (see select.hpp).

#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/reduction.hpp>
#include <corocoll/transport/shm/arena.hpp>
#include <corocoll/version.hpp>

#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// At most this many bytes, times the group's size, are reduced whole by every rank in one step.
inline constexpr std::size_t all_reduce_shm_whole_bytes = std::size_t{64} << 10;

COROCOLL_DECL task<> all_reduce_shm(context& c, std::span<std::byte> data, const reduction& red);

namespace detail {

/// This rank's slice of a chunk of `len` bytes whose n copies lie a slot apart from `copies`
/// (rank r's at r * slot), reduced over every copy in rank order into the same place of
/// `result`: the second step of all_reduce_shm's large path, and of reduce_shm's.
inline void reduce_own_slice(const transport::shm_arena& a, const reduction& red,
                             const std::byte* copies, std::byte* result, std::size_t len) {
    const std::size_t elem = red.elem(), slot = a.slot_bytes();
    const int n = a.size();
    auto [first, last] =
        block_range(len / elem, static_cast<std::size_t>(n), static_cast<std::size_t>(a.rank()));
    if (last <= first) return;
    std::byte* out = result + first * elem;
    std::memcpy(out, copies + first * elem, (last - first) * elem);
    for (int r = 1; r < n; ++r) {
        red(out, copies + static_cast<std::size_t>(r) * slot + first * elem, last - first);
    }
    red.finish(out, last - first, n);
}

}  // namespace detail

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/all_reduce_shm.ipp>
#endif
