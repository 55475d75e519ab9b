#pragma once

// Broadcast along a binomial tree rooted at `root`: a rank receives the whole buffer from its
// parent, then sends it to its children, largest subtree first.
// Cost: ceil(log2 n) rounds; the root sends ceil(log2 n) * bytes; n - 1 messages in all.
// Chosen: for small buffers (below broadcast's large threshold) and any world size.

#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> broadcast_binomial(context& c, std::span<std::byte> data, int root,
                                        std::uint32_t round = 0);

}  // namespace collectives

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> broadcast_binomial(context& c, std::span<std::byte> data, int root,
                                        std::uint32_t round) {
    int n = c.size();
    int v = (c.rank() - root + n) % n;  // rank relative to the root
    int mask = 1;
    while (mask < n) {
        if ((v & mask) != 0) {
            co_await c.recv(data, ((v - mask) + root) % n, round);
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1) {
        if (v + mask < n) co_await c.send(data, ((v + mask) + root) % n, round);
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
