#pragma once

// All-to-all by pairwise exchange: in round s every rank sends its block for rank + s and
// receives the block from rank - s, so each round is a perfect matching of the ranks.
// Cost: n - 1 rounds; each rank sends and receives every block but its own once. Chosen:
// always for all_to_all (equal or given split sizes).

#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

#include <cstring>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Rank r's block for rank p is `in[in_offsets[p] .. in_offsets[p + 1])`; the block from rank
/// p lands at `out[out_offsets[p] .. out_offsets[p + 1])` (offsets in bytes, n + 1 each).
COROCOLL_DECL task<> all_to_all_pairwise(context& c, std::span<std::byte> out,
                                         const std::vector<std::size_t>& out_offsets,
                                         std::span<const std::byte> in,
                                         const std::vector<std::size_t>& in_offsets);

}  // namespace collectives

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_to_all_pairwise(context& c, std::span<std::byte> out,
                                         const std::vector<std::size_t>& out_offsets,
                                         std::span<const std::byte> in,
                                         const std::vector<std::size_t>& in_offsets) {
    int n = c.size(), r = c.rank();
    auto in_block = [&](int p) {
        return in.subspan(
            in_offsets[static_cast<std::size_t>(p)],
            in_offsets[static_cast<std::size_t>(p) + 1] - in_offsets[static_cast<std::size_t>(p)]);
    };
    auto out_block = [&](int p) {
        return out.subspan(out_offsets[static_cast<std::size_t>(p)],
                           out_offsets[static_cast<std::size_t>(p) + 1] -
                               out_offsets[static_cast<std::size_t>(p)]);
    };
    auto own_in = in_block(r);
    auto own_out = out_block(r);
    if (!own_in.empty())
        std::memcpy(own_out.data(), own_in.data(), std::min(own_in.size(), own_out.size()));
    for (int s = 1; s < n; ++s) {
        int dst = (r + s) % n, src = (r - s + n) % n;
        co_await c.exchange(in_block(dst), dst, out_block(src), src, static_cast<std::uint32_t>(s));
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
