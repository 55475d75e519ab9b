// The bodies of the non-template functions declared in
// <corocoll/collectives/all_reduce_recursive_doubling.hpp>: inline where corocoll is header-only,
// compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/all_reduce_recursive_doubling.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_reduce_recursive_doubling(context& c, std::span<std::byte> data,
                                                   const reduction& red) {
    int n = c.size(), r = c.rank();
    std::size_t count = data.size() / red.elem();
    int p2 = 1;
    while (p2 * 2 <= n) p2 *= 2;
    int rem = n - p2;
    std::span<std::byte> incoming = c.scratch(context::algorithm_slot, data.size());
    int vrank;
    if (r < 2 * rem) {
        if (r % 2 == 0) {
            co_await c.send(data, r + 1, 0);
            vrank = -1;
        } else {
            co_await c.recv(incoming, r - 1, 0);
            red(data.data(), incoming.data(), count);
            vrank = r / 2;
        }
    } else {
        vrank = r - rem;
    }
    if (vrank >= 0) {
        std::uint32_t round = 1;
        for (int mask = 1; mask < p2; mask <<= 1, ++round) {
            int vpartner = vrank ^ mask;
            int partner = vpartner < rem ? vpartner * 2 + 1 : vpartner + rem;
            co_await c.exchange(data, partner, incoming, partner, round);
            red(data.data(), incoming.data(), count);
        }
        red.finish(data.data(), count, n);
    }
    // The result goes back to the ranks that sat out in a round no doubling round can have:
    // rounds 1..log2(p2) are at most 30 for any int world size, so 31 never meets one.
    constexpr std::uint32_t hand_back_round = 31;
    if (r < 2 * rem) {
        if (r % 2 == 1) {
            co_await c.send(data, r - 1, hand_back_round);
        } else {
            co_await c.recv(data, r + 1, hand_back_round);
        }
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
