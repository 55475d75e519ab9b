// The bodies of the non-template functions declared in <corocoll/collectives/all_reduce_ring.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/all_reduce_ring.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_reduce_ring(context& c, std::span<std::byte> data, const reduction& red) {
    int n = c.size(), r = c.rank();
    std::size_t elem = red.elem(), count = data.size() / elem;
    co_await reduce_scatter_ring(c, data, red, 0);
    auto [first, last] =
        block_range(count, static_cast<std::size_t>(n), static_cast<std::size_t>(r));
    red.finish(data.data() + first * elem, last - first, n);  // avg: each rank its own block
    co_await all_gather_ring(c, data, elem, static_cast<std::uint32_t>(n - 1));
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
