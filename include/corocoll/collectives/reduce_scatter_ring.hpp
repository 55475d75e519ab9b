#pragma once

// Reduce-scatter around a ring: `data` holds n blocks; in round s every rank sends block
// (r - s - 1) to rank + 1 and reduces block (r - s - 2) from rank - 1 into its own copy. After
// n - 1 rounds block r on rank r is the reduction of everyone's block r.
// Cost: n - 1 rounds; each rank sends and receives (n - 1)/n * bytes and reduces as much;
// bus bandwidth optimal. Chosen: for reduce_scatter always, and as the first half of
// all_reduce_ring.

#include <corocoll/collectives/ring.hpp>
#include <corocoll/version.hpp>

#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Blocks are `block_range(count, n, i)` of `data` (count = data.size() / elem); block r ends
/// up reduced on rank r. Rounds `first_round` .. `first_round + n - 2`.
COROCOLL_DECL task<> reduce_scatter_ring(context& c, std::span<std::byte> data,
                                         const reduction& red, std::uint32_t first_round = 0);

/// reduce_scatter_into's form: `in` (n equal blocks) is left as it was; rank r's reduced
/// block (finished: avg divides) lands in `out`. Works on a copy of `in` in the group's
/// scratch (one memcpy of the input, one of the block).
COROCOLL_DECL task<> reduce_scatter_ring(context& c, std::span<std::byte> out,
                                         std::span<const std::byte> in, const reduction& red);

}  // namespace collectives

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> reduce_scatter_ring(context& c, std::span<std::byte> data,
                                         const reduction& red, std::uint32_t first_round) {
    int n = c.size(), r = c.rank();
    std::size_t elem = red.elem(), count = data.size() / elem;
    auto block = [&](int i) {
        auto [first, last] =
            block_range(count, static_cast<std::size_t>(n), static_cast<std::size_t>(i));
        return data.subspan(first * elem, (last - first) * elem);
    };
    for (int s = 0; s < n - 1; ++s) {
        int send_block = ((r - s - 1) % n + n) % n, recv_block = ((r - s - 2) % n + n) % n;
        co_await detail::ring_round(c, block(send_block), (r + 1) % n, block(recv_block),
                                    (r - 1 + n) % n, first_round + static_cast<std::uint32_t>(s),
                                    &red, elem);
    }
}

COROCOLL_DECL task<> reduce_scatter_ring(context& c, std::span<std::byte> out,
                                         std::span<const std::byte> in, const reduction& red) {
    std::span<std::byte> work = c.scratch(context::group_slot, in.size());
    if (!in.empty()) std::memcpy(work.data(), in.data(), in.size());
    co_await reduce_scatter_ring(c, work, red);
    int n = c.size();
    std::size_t count = work.size() / red.elem();
    auto [first, last] =
        block_range(count, static_cast<std::size_t>(n), static_cast<std::size_t>(c.rank()));
    red.finish(work.data() + first * red.elem(), last - first, n);
    if (!out.empty()) std::memcpy(out.data(), work.data() + first * red.elem(), out.size());
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
