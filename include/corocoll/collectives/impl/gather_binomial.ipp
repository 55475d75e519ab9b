// The bodies of the non-template functions declared in <corocoll/collectives/gather_binomial.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/gather_binomial.hpp>
#include <corocoll/core/copy.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> gather_binomial(context& c, std::span<const std::byte> in,
                                     std::span<std::byte> out, int root) {
    int n = c.size();
    int v = (c.rank() - root + n) % n;
    std::size_t block = in.size();
    // Blocks of ranks v .. v + subtree - 1 (relative), own first.
    std::span<std::byte> tmp =
        c.scratch(context::algorithm_slot, block * static_cast<std::size_t>(n));
    if (block > 0) copy_bytes(tmp.data(), in.data(), block);
    for (int mask = 1; mask < n; mask <<= 1) {
        if ((v & mask) != 0) {
            int held = std::min(mask, n - v);
            co_await c.send(tmp.first(block * static_cast<std::size_t>(held)),
                            ((v - mask) + root) % n, 0);
            co_return;
        }
        if (v + mask < n) {
            int child_blocks = std::min(mask, n - (v + mask));
            co_await c.recv(tmp.subspan(block * static_cast<std::size_t>(mask),
                                        block * static_cast<std::size_t>(child_blocks)),
                            ((v + mask) + root) % n, 0);
        }
    }
    for (int i = 0; i < n && block > 0; ++i) {
        copy_bytes(out.data() + block * static_cast<std::size_t>((i + root) % n),
                   tmp.data() + block * static_cast<std::size_t>(i), block);
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
