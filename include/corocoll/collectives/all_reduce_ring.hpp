#pragma once

// All-reduce as a ring reduce-scatter followed by a ring all-gather (Patarasuk & Yuan). Each
// round is cut into chunks so that transfer and reduction overlap.
// Cost: 2(n - 1) rounds; each rank sends and receives 2(n - 1)/n * bytes (bus bandwidth
// optimal) and reduces (n - 1)/n * bytes. Chosen: for large buffers (at or above all_reduce's
// large threshold), any world size.

#include <corocoll/collectives/all_gather_ring.hpp>
#include <corocoll/collectives/reduce_scatter_ring.hpp>
#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_reduce_ring(context& c, std::span<std::byte> data, const reduction& red);

}  // namespace collectives

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

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

#endif  // COROCOLL_DEFINE_BODIES
