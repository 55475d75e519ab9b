// The bodies of the non-template functions declared in
// <corocoll/collectives/all_to_all_pairwise.hpp>: inline where corocoll is header-only, compiled
// once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/all_to_all_pairwise.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_to_all_pairwise(context& c, std::span<std::byte> out,
                                         const std::vector<std::size_t>& out_offsets,
                                         std::span<const std::byte> in,
                                         const std::vector<std::size_t>& in_offsets) {
    int n = c.size(), r = c.rank();
    detail::copy_own_block(out, out_offsets, in, in_offsets, r);
    for (int s = 1; s < n; ++s) {
        int dst = (r + s) % n, src = (r - s + n) % n;
        co_await c.exchange(detail::offset_block(in, in_offsets, dst), dst,
                            detail::offset_block(out, out_offsets, src), src,
                            static_cast<std::uint32_t>(s));
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
