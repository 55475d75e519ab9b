#pragma once

// scatter_object_list: the root sends each rank its serialized object directly, its length in
// round 0 and its bytes in round 1, to every rank at once.
// Cost: 2 rounds; the root sends n - 1 lengths and objects over n - 1 connections; each other
// rank receives one. Chosen: always for scatter_object_list.

#include <corocoll/collectives/context.hpp>
#include <corocoll/core/when_all.hpp>
#include <corocoll/version.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// `parts` (n byte strings, read on `root` only) go out so that rank r gets `parts[r]` in
/// `mine`.
COROCOLL_DECL task<> scatter_object_direct(context& c, const std::vector<std::string>& parts,
                                           std::string& mine, int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> scatter_object_direct(context& c, const std::vector<std::string>& parts,
                                           std::string& mine, int root) {
    if (c.rank() != root) {
        std::int64_t len = 0;
        co_await c.recv(std::as_writable_bytes(std::span(&len, 1)), root, 0);
        mine.resize(static_cast<std::size_t>(len));
        co_await c.recv(std::as_writable_bytes(std::span(mine.data(), mine.size())), root, 1);
        co_return;
    }
    std::vector<std::int64_t> lens(parts.size());
    std::vector<task<>> sends;
    for (int p = 0; p < c.size(); ++p) {
        auto i = static_cast<std::size_t>(p);
        if (p == root) {
            mine = parts[i];
            continue;
        }
        lens[i] = static_cast<std::int64_t>(parts[i].size());
        sends.push_back(
            [](context& cc, const std::int64_t& len, const std::string& part, int to) -> task<> {
                co_await cc.send(std::as_bytes(std::span(&len, 1)), to, 0);
                co_await cc.send(std::as_bytes(std::span(part.data(), part.size())), to, 1);
            }(c, lens[i], parts[i], p));
    }
    co_await when_all(std::move(sends));
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
