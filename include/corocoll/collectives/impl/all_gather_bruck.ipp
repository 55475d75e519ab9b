// The bodies of the non-template functions declared in <corocoll/collectives/all_gather_bruck.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/all_gather_bruck.hpp>
#include <corocoll/core/copy.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_gather_bruck(context& c, std::span<std::byte> out,
                                      std::span<const std::byte> in) {
    int n = c.size(), r = c.rank();
    std::size_t block = in.size();
    std::span<std::byte> tmp =
        c.scratch(context::algorithm_slot, block * static_cast<std::size_t>(n));
    if (block > 0) copy_bytes(tmp.data(), in.data(), block);
    std::uint32_t round = 0;
    for (int dist = 1; dist < n; dist *= 2, ++round) {
        int blocks = std::min(dist, n - dist);
        std::span<const std::byte> send(tmp.data(), block * static_cast<std::size_t>(blocks));
        std::span<std::byte> recv(tmp.data() + block * static_cast<std::size_t>(dist),
                                  block * static_cast<std::size_t>(blocks));
        co_await c.exchange(send, (r - dist + n) % n, recv, (r + dist) % n, round);
    }
    for (int i = 0; i < n && block > 0; ++i) {
        copy_bytes(out.data() + block * static_cast<std::size_t>((r + i) % n),
                   tmp.data() + block * static_cast<std::size_t>(i), block);
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
