// The bodies of the non-template functions declared in <corocoll/collectives/scatter_linear.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/scatter_linear.hpp>
#include <corocoll/core/copy.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> scatter_linear(context& c, std::span<const std::byte> in,
                                    std::span<std::byte> out, int root) {
    int n = c.size();
    std::size_t block = out.size();
    if (c.rank() != root) {
        co_await c.recv(out, root, 0);
        co_return;
    }
    if (n == 2) {
        // One other rank: its block in one message, with no list to wait on, sent before
        // this rank copies its own (the other waits for it).
        const int other = 1 - root;
        co_await c.send(in.subspan(block * static_cast<std::size_t>(other), block), other, 0);
        if (block > 0)
            copy_bytes(out.data(), in.data() + block * static_cast<std::size_t>(root), block);
        co_return;
    }
    std::vector<task<>> sends;
    for (int p = 0; p < n; ++p) {
        auto src = in.subspan(block * static_cast<std::size_t>(p), block);
        if (p == root) {
            if (block > 0) copy_bytes(out.data(), src.data(), block);
        } else {
            sends.push_back(c.send(src, p, 0));
        }
    }
    co_await when_all(std::move(sends));
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
