#pragma once

// Reduce along a binomial tree to `root`: each rank combines what its children send into its
// own partial result and passes that to its parent. Non-root ranks work on a copy, so their
// buffers are left as they were; the root reduces into its buffer.
// Cost: ceil(log2 n) rounds; every rank but the root sends bytes once; the root receives
// ceil(log2 n) * bytes and reduces as much.
// Chosen: always for reduce (any size, any world size).

#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/reduction.hpp>
#include <corocoll/version.hpp>

#include <cstring>

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
    std::size_t count = data.size() / red.elem();
    std::span<std::byte> acc = data;
    if (v != 0) {  // non-root ranks reduce into a copy: their input stays as it was
        acc = c.scratch(context::algorithm_slot, data.size());
        if (!data.empty()) std::memcpy(acc.data(), data.data(), data.size());
    }
    std::span<std::byte> incoming = c.scratch(context::algorithm_slot + 1, data.size());
    for (int mask = 1; mask < n; mask <<= 1) {
        if ((v & mask) != 0) {
            co_await c.send(acc, ((v - mask) + root) % n, 0);
            co_return;
        }
        if (v + mask < n) {
            co_await c.recv(incoming, ((v + mask) + root) % n, 0);
            red(acc.data(), incoming.data(), count);
        }
    }
    red.finish(acc.data(), count, n);  // only the root gets here
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
