// The bodies of the non-template functions declared in
// <corocoll/collectives/scatter_object_direct.hpp>: inline where corocoll is header-only, compiled
// once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/scatter_object_direct.hpp>

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
