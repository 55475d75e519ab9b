// The bodies of the non-template functions declared in
// <corocoll/collectives/gather_object_direct.hpp>: inline where corocoll is header-only, compiled
// once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/gather_object_direct.hpp>

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
