// The bodies of the non-template functions declared in
// <corocoll/collectives/broadcast_binomial.hpp>: inline where corocoll is header-only, compiled
// once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/broadcast_binomial.hpp>

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
