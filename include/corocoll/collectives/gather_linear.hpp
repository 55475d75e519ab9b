#pragma once

// Gather in one step: every rank sends its block to the root, which receives from all of them
// at once, each block straight into its place in the output (no copies).
// Cost: 1 round; the root receives (n - 1) blocks over n - 1 connections in parallel.
// Chosen: for gather of large blocks (gather's linear threshold, see select.hpp).

#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

#include <cstring>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> gather_linear(context& c, std::span<const std::byte> in,
                                   std::span<std::byte> out, int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

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
    std::vector<context::recv_operation> recvs;
    for (int p = 0; p < n; ++p) {
        auto dest = out.subspan(block * static_cast<std::size_t>(p), block);
        if (p == root) {
            if (block > 0) std::memcpy(dest.data(), in.data(), block);
        } else {
            recvs.push_back(c.recv(dest, p, 0));
        }
    }
    co_await when_all(std::move(recvs));
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
