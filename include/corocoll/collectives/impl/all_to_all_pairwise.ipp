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
