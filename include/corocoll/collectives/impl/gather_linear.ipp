// The bodies of the non-template functions declared in <corocoll/collectives/gather_linear.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/gather_linear.hpp>
#include <corocoll/core/copy.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> gather_linear(context& c, std::span<const std::byte> in,
                                   std::span<std::byte> out, int root) {
    int n = c.size();
    std::size_t block = in.size();
    if (c.rank() != root) {
        co_await c.send(in, root, 0);
        co_return;
    }
    if (n == 2) {
        // One other rank: its message straight into place, with no list to wait on.
        const int other = 1 - root;
        if (block > 0)
            copy_bytes(out.data() + block * static_cast<std::size_t>(root), in.data(), block);
        co_await c.recv(out.subspan(block * static_cast<std::size_t>(other), block), other, 0);
        co_return;
    }
    std::vector<context::recv_operation> recvs;
    for (int p = 0; p < n; ++p) {
        auto dest = out.subspan(block * static_cast<std::size_t>(p), block);
        if (p == root) {
            if (block > 0) copy_bytes(dest.data(), in.data(), block);
        } else {
            recvs.push_back(c.recv(dest, p, 0));
        }
    }
    co_await when_all(std::move(recvs));
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
