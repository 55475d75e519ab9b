#pragma once

// Scatter in one step: the root sends every rank its block at once, each straight from its
// place in the input (no copies).
// Cost: 1 round; the root sends (n - 1) blocks over n - 1 connections in parallel.
// Chosen: for scatter of large blocks (scatter's linear threshold, see select.hpp).

#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

#include <cstring>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> scatter_linear(context& c, std::span<const std::byte> in,
                                    std::span<std::byte> out, int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

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
    std::vector<task<>> sends;
    for (int p = 0; p < n; ++p) {
        auto src = in.subspan(block * static_cast<std::size_t>(p), block);
        if (p == root) {
            if (block > 0) std::memcpy(out.data(), src.data(), block);
        } else {
            sends.push_back(c.send(src, p, 0));
        }
    }
    co_await when_all(std::move(sends));
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
