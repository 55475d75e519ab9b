#pragma once

// Shared steps of the ring algorithms (reduce_scatter_ring, all_gather_ring, all_reduce_ring):
// in each round a rank sends one block to rank + 1 and receives one from rank - 1, cut into
// chunks so that receiving chunk k+1 overlaps reducing chunk k.

#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/reduction.hpp>
#include <corocoll/version.hpp>

#include <algorithm>
#include <cassert>
#include <optional>

COROCOLL_BEGIN_NAMESPACE

namespace collectives::detail {

// Chunks of a block, in whole elements.
struct chunking {
    std::span<std::byte> block;
    std::size_t elem;
    std::size_t chunk_elems;

    std::size_t chunks() const noexcept;
    std::span<std::byte> piece(std::size_t k) const noexcept;
};

inline std::size_t chunk_elems(const context& c, std::size_t elem) {
    return std::max<std::size_t>(1, c.chunk_bytes / elem);
}

// Sends `out` to `dst` in chunks, as steps (`round`, k).
COROCOLL_DECL task<> send_chunks(context& c, std::span<const std::byte> out, int dst,
                                 std::uint32_t round, std::size_t elem);

// Receives what `send_chunks` sends from `src` into `in`; with `red`, reduces it into `in`
// instead, and with `own` too, computes in = received op own (see `ring_round`).
COROCOLL_DECL task<> recv_chunks(context& c, std::span<std::byte> in, int src, std::uint32_t round,
                                 const reduction* red, std::size_t elem,
                                 std::span<const std::byte> own = {});

// One round: send `out` to `dst` while receiving the same-sized block from `src`; with a
// reduction, each received chunk is reduced into `in` (double-buffered so the next chunk's
// receive is posted before this one is reduced); without, chunks land in `in` directly.
// With a reduction and `own` (as long as `in`, not overlapping it), chunks land in `in`
// directly and `own`'s matching chunk is reduced into each: in = received op own, no scratch.
COROCOLL_DECL task<> ring_round(context& c, std::span<const std::byte> out, int dst,
                                std::span<std::byte> in, int src, std::uint32_t round,
                                const reduction* red, std::size_t elem,
                                std::span<const std::byte> own = {});

}  // namespace collectives::detail

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/ring.ipp>
#endif
