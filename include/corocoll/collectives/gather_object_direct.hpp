#pragma once

// gather_object and all_gather_object: every rank sends its serialized object straight to each
// rank that collects (the root, or everyone), its length in round 0 and its bytes in round 1;
// all sends and receives of a rank run at once.
// Cost: 2 rounds. gather: the root receives n - 1 lengths and objects over n - 1 connections;
// all_gather: every rank sends and receives n - 1 of each, (n - 1) * object bytes, O(n^2)
// messages in the group. Chosen: always for the object collectives that gather (objects are
// small, and their lengths differ, which rules out the fixed-size algorithms).

#include <corocoll/collectives/context.hpp>
#include <corocoll/core/when_all.hpp>
#include <corocoll/version.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Gathers one byte string per rank into `out` (resized to n; slot r is rank r's): on `root`
/// only, or on every rank when `all`. `mine` ends up in this rank's slot.
COROCOLL_DECL task<> gather_object_direct(context& c, std::string mine, int root, bool all,
                                          std::vector<std::string>& out);

}  // namespace collectives

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> gather_object_direct(context& c, std::string mine, int root, bool all,
                                          std::vector<std::string>& out) {
    int n = c.size(), me = c.rank();
    out.assign(static_cast<std::size_t>(n), {});
    bool receives = all || me == root;
    std::int64_t my_len = static_cast<std::int64_t>(mine.size());
    std::vector<task<>> ops;
    for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        if (all || p == root) {
            ops.push_back(
                [](context& cc, const std::int64_t& len, const std::string& s, int to) -> task<> {
                    co_await cc.send(std::as_bytes(std::span(&len, 1)), to, 0);
                    co_await cc.send(std::as_bytes(std::span(s.data(), s.size())), to, 1);
                }(c, my_len, mine, p));
        }
        if (receives) {
            ops.push_back([](context& cc, std::string& into, int from) -> task<> {
                std::int64_t len = 0;
                co_await cc.recv(std::as_writable_bytes(std::span(&len, 1)), from, 0);
                into.resize(static_cast<std::size_t>(len));
                co_await cc.recv(std::as_writable_bytes(std::span(into.data(), into.size())), from,
                                 1);
            }(c, out[static_cast<std::size_t>(p)], p));
        }
    }
    co_await when_all(std::move(ops));
    out[static_cast<std::size_t>(me)] = std::move(mine);
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
