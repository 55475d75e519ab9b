#pragma once

// Reduce along a binomial tree to `root`: each rank combines what its children send into its
// own partial result and passes that to its parent, in chunks (a chunk is reduced while the
// next one arrives). A non-root rank with children works in the group's scratch, so its buffer
// is left as it was: its first child's chunks land there and its own buffer is reduced into
// them; a leaf sends its buffer as it is; the root reduces into its buffer. Before chunks, every
// rank also took a temporary as large as the buffer for what came in (at 64 MiB on 2 ranks:
// 58 ms, against 6.2 ms for a broadcast of that size, most of it fresh pages' faults).
// Cost: ceil(log2 n) rounds; every rank but the root sends bytes once; the root receives
// ceil(log2 n) * bytes and reduces as much.
// Chosen: always for reduce (any size, any world size).

#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/reduction.hpp>
#include <corocoll/collectives/ring.hpp>
#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> reduce_binomial(context& c, std::span<std::byte> data, const reduction& red,
                                     int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> reduce_binomial(context& c, std::span<std::byte> data, const reduction& red,
                                     int root) {
    int n = c.size();
    int v = (c.rank() - root + n) % n;
    std::size_t elem = red.elem(), count = data.size() / elem;
    // A non-root rank with children (v + mask for the masks below v's lowest set bit) leaves its
    // buffer as it was: its first child's chunks land in scratch and `own` is reduced into them.
    std::span<std::byte> acc = data;
    std::span<const std::byte> own;
    if (v != 0 && (v & 1) == 0 && v + 1 < n) {
        own = data;
        acc = c.scratch(context::algorithm_slot, data.size());
    }
    for (int mask = 1; mask < n; mask <<= 1) {
        if ((v & mask) != 0) {
            co_await detail::send_chunks(c, acc, ((v - mask) + root) % n, 0, elem);
            co_return;
        }
        if (v + mask < n) {
            co_await detail::recv_chunks(c, acc, ((v + mask) + root) % n, 0, &red, elem, own);
            own = {};
        }
    }
    red.finish(acc.data(), count, n);  // only the root gets here
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
