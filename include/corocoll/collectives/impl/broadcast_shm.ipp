// The bodies of the non-template functions declared in <corocoll/collectives/broadcast_shm.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/broadcast_shm.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> broadcast_shm(context& c, std::span<std::byte> data, int root) {
    transport::shm_arena& a = *c.arena;
    const bool is_root = a.rank() == root;
    co_await a.settle(c.net, c.deadline);
    a.declare(c.meta);
    if (a.single_copy(data.size())) {
        const std::uint64_t s = a.next_step();
        if (!is_root) {
            co_await a.arrive(c.net, c.meta, c.deadline, true, root);
            a.copy_from(c.net, c.meta, root, s, 0, data, a.next_sweep_backward());
            // The root waits here for every rank; the next call here waits for them too.
            a.arrive_and_go(c.net, c.meta);
            co_return;
        }
        a.offer(data.data(), data.size());
        try {
            co_await a.arrive(c.net, c.meta, c.deadline, true);
            a.expect_copies(c.net, data.size());
            co_await a.arrive(c.net, c.meta, c.deadline);
        } catch (...) {
            a.withdraw();
            throw;
        }
        co_return;
    }
    const bool small = data.size() <= transport::shm_arena::small_bytes;
    const std::size_t piece =
        small ? data.size() : std::min(broadcast_shm_piece_bytes, a.set_bytes());
    bool check = true;
    std::size_t off = 0;
    do {
        const std::size_t len = std::min(piece, data.size() - off);
        const std::uint64_t s = a.next_step();
        std::byte* at = small ? a.small(root, s) : a.set(s);
        if (is_root) {
            // Every rank reached the step before this one: the set is free again.
            if (off > 0) co_await a.settle(c.net, c.deadline);
            if (len > 0) std::memcpy(at, data.data() + off, len);
            a.arrive_and_go(c.net, c.meta, std::exchange(check, false));
        } else {
            co_await a.arrive(c.net, c.meta, c.deadline, std::exchange(check, false), root);
            if (len > 0) std::memcpy(data.data() + off, at, len);
        }
        off += len;
    } while (off < data.size());
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
