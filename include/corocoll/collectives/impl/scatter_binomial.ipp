// The bodies of the non-template functions declared in <corocoll/collectives/scatter_binomial.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/scatter_binomial.hpp>
#include <corocoll/core/copy.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> scatter_binomial(context& c, std::span<const std::byte> in,
                                      std::span<std::byte> out, int root) {
    int n = c.size();
    int v = (c.rank() - root + n) % n;
    std::size_t block = out.size();
    std::vector<std::byte> tmp;  // this subtree's blocks, relative order, own first
    int held = 0;
    int top = 1;  // the lowest set bit of v (v = 0: above every child)
    if (v == 0) {
        tmp.resize(block * static_cast<std::size_t>(n));
        for (int i = 0; i < n && block > 0; ++i) {
            copy_bytes(tmp.data() + block * static_cast<std::size_t>(i),
                       in.data() + block * static_cast<std::size_t>((i + root) % n), block);
        }
        held = n;
        while (top < n) top <<= 1;
    } else {
        while ((v & top) == 0) top <<= 1;
        held = std::min(top, n - v);
        tmp.resize(block * static_cast<std::size_t>(held));
        co_await c.recv(tmp, ((v - top) + root) % n, 0);
    }
    for (int mask = top >> 1; mask > 0; mask >>= 1) {
        if (v + mask < n && mask < held) {
            int child_blocks = std::min(mask, n - (v + mask));
            co_await c.send(std::span(tmp).subspan(block * static_cast<std::size_t>(mask),
                                                   block * static_cast<std::size_t>(child_blocks)),
                            ((v + mask) + root) % n, 0);
        }
    }
    if (block > 0) copy_bytes(out.data(), tmp.data(), block);
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
