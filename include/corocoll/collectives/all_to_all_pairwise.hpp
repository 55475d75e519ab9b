#pragma once

// All-to-all by pairwise exchange: in round s every rank sends its block for rank + s and
// receives the block from rank - s, so each round is a perfect matching of the ranks.
// Cost: n - 1 rounds; each rank sends and receives every block but its own once. Chosen:
// always for all_to_all (equal or given split sizes).

#include <corocoll/collectives/context.hpp>
#include <corocoll/core/copy.hpp>
#include <corocoll/version.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

namespace detail {

/// Block `p` of `whole`, cut at `offsets` (n + 1 byte offsets): all_to_all's blocks.
template <class Span>
Span offset_block(Span whole, const std::vector<std::size_t>& offsets, int p) {
    const auto i = static_cast<std::size_t>(p);
    return whole.subspan(offsets[i], offsets[i + 1] - offsets[i]);
}

/// Rank `r`'s own block of `in` copied to its place in `out` (what no message carries).
inline void copy_own_block(std::span<std::byte> out, const std::vector<std::size_t>& out_offsets,
                           std::span<const std::byte> in,
                           const std::vector<std::size_t>& in_offsets, int r) {
    auto from = offset_block(in, in_offsets, r);
    auto to = offset_block(out, out_offsets, r);
    if (!from.empty()) copy_bytes(to.data(), from.data(), std::min(from.size(), to.size()));
}

}  // namespace detail

/// Rank r's block for rank p is `in[in_offsets[p] .. in_offsets[p + 1])`; the block from rank
/// p lands at `out[out_offsets[p] .. out_offsets[p + 1])` (offsets in bytes, n + 1 each).
COROCOLL_DECL task<> all_to_all_pairwise(context& c, std::span<std::byte> out,
                                         const std::vector<std::size_t>& out_offsets,
                                         std::span<const std::byte> in,
                                         const std::vector<std::size_t>& in_offsets);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/all_to_all_pairwise.ipp>
#endif
