// The bodies of the non-template functions declared in <corocoll/collectives/rooted_shm.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/rooted_shm.hpp>

#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

namespace detail {

// A rank that only writes for its step: into its lines, then on without waiting.
inline void rooted_shm_write(context& c, std::span<const std::byte> what) {
    transport::shm_arena& a = *c.arena;
    if (!what.empty()) std::memcpy(a.small(a.rank(), a.next_step()), what.data(), what.size());
    a.arrive_and_go(c.net, c.meta, true);
}

}  // namespace detail

COROCOLL_DECL task<> reduce_shm(context& c, std::span<std::byte> data, const reduction& red,
                                int root) {
    transport::shm_arena& a = *c.arena;
    const int n = a.size(), me = a.rank();
    co_await a.settle_lines(c.net, c.deadline);
    a.declare(c.meta);
    if (me != root) {
        detail::rooted_shm_write(c, data);
        co_return;
    }
    // In rank order, as all_reduce_shm does: this rank's copy goes in its own lines too (no
    // other rank reads them in a reduce), and every copy is reduced from there.
    const std::uint64_t s = a.next_step();
    if (!data.empty()) std::memcpy(a.small(me, s), data.data(), data.size());
    co_await a.arrive(c.net, c.meta, c.deadline, true);
    if (data.empty()) co_return;
    const std::size_t count = data.size() / red.elem();
    std::memcpy(data.data(), a.small(0, s), data.size());
    for (int r = 1; r < n; ++r) red(data.data(), a.small(r, s), count);
    red.finish(data.data(), count, n);
}

COROCOLL_DECL task<> gather_shm(context& c, std::span<const std::byte> in, std::span<std::byte> out,
                                int root) {
    transport::shm_arena& a = *c.arena;
    const int n = a.size(), me = a.rank();
    co_await a.settle_lines(c.net, c.deadline);
    a.declare(c.meta);
    if (me != root) {
        detail::rooted_shm_write(c, in);
        co_return;
    }
    const std::uint64_t s = a.next_step();
    co_await a.arrive(c.net, c.meta, c.deadline, true);
    if (in.empty()) co_return;
    for (int r = 0; r < n; ++r) {
        std::memcpy(out.data() + static_cast<std::size_t>(r) * in.size(),
                    r == me ? in.data() : a.small(r, s), in.size());
    }
}

COROCOLL_DECL task<> scatter_shm(context& c, std::span<const std::byte> in,
                                 std::span<std::byte> out, int root) {
    transport::shm_arena& a = *c.arena;
    const int me = a.rank();
    co_await a.settle_lines(c.net, c.deadline);
    a.declare(c.meta);
    const std::size_t mine = static_cast<std::size_t>(me) * out.size();
    if (me == root) {
        detail::rooted_shm_write(c, in);
        if (!out.empty()) std::memcpy(out.data(), in.data() + mine, out.size());
        co_return;
    }
    const std::uint64_t s = a.next_step();
    co_await a.arrive(c.net, c.meta, c.deadline, true, root);
    if (!out.empty()) std::memcpy(out.data(), a.small(root, s) + mine, out.size());
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
