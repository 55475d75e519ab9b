#pragma once

// All-gather by Bruck's algorithm: in round k every rank sends the first min(2^k, n - 2^k)
// blocks it holds to rank - 2^k and appends as many from rank + 2^k; a final local rotation
// puts the blocks in rank order.
// Cost: ceil(log2 n) rounds for any n; each rank sends (n - 1) blocks in all, plus one local
// copy of the result. Chosen: for all_gather of small totals.

#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// `out` holds n blocks of `block` bytes; rank r's own block is `in`.
COROCOLL_DECL task<> all_gather_bruck(context& c, std::span<std::byte> out,
                                      std::span<const std::byte> in);

}  // namespace collectives

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_gather_bruck(context& c, std::span<std::byte> out,
                                      std::span<const std::byte> in) {
    int n = c.size(), r = c.rank();
    std::size_t block = in.size();
    std::span<std::byte> tmp =
        c.scratch(context::algorithm_slot, block * static_cast<std::size_t>(n));
    if (block > 0) std::memcpy(tmp.data(), in.data(), block);
    std::uint32_t round = 0;
    for (int dist = 1; dist < n; dist *= 2, ++round) {
        int blocks = std::min(dist, n - dist);
        std::span<const std::byte> send(tmp.data(), block * static_cast<std::size_t>(blocks));
        std::span<std::byte> recv(tmp.data() + block * static_cast<std::size_t>(dist),
                                  block * static_cast<std::size_t>(blocks));
        co_await c.exchange(send, (r - dist + n) % n, recv, (r + dist) % n, round);
    }
    for (int i = 0; i < n && block > 0; ++i) {
        std::memcpy(out.data() + block * static_cast<std::size_t>((r + i) % n),
                    tmp.data() + block * static_cast<std::size_t>(i), block);
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
