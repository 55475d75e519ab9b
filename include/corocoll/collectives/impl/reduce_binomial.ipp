// The bodies of the non-template functions declared in <corocoll/collectives/reduce_binomial.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/reduce_binomial.hpp>

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
