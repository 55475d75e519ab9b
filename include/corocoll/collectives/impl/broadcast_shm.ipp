// The bodies of the non-template functions declared in <corocoll/collectives/broadcast_shm.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/broadcast_shm.hpp>
#include <corocoll/core/copy.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

namespace {

// The root's part of a broadcast in its lines, once they are free: it writes them and goes on.
void broadcast_lines_from_root(context& c, std::span<const std::byte> data) {
    transport::shm_arena& a = *c.arena;
    a.will_go_on(c.net, c.meta);
    a.declare(c.meta);
    if (!data.empty()) copy_bytes(a.own_small(data.size()), data.data(), data.size());
    a.arrive_and_go(c.net, c.meta, true);
}

// Another rank's, once the root arrived at step `s`: the data out of the root's lines.
void broadcast_lines_take(context& c, std::span<std::byte> data, int root, std::uint64_t s) {
    if (!data.empty()) copy_bytes(data.data(), c.arena->small(root, s), data.size());
}

}  // namespace

COROCOLL_DECL void broadcast_shm_now(context& c, std::span<std::byte> data, int root) {
    transport::shm_arena& a = *c.arena;
    if (a.rank() == root) {
        broadcast_lines_from_root(c, data);
        return;
    }
    a.declare(c.meta);
    const std::uint64_t s = a.next_step();
    // The root is there (seen already): the wait is complete; what it does at its end is
    // what is left, the comparison of the calls.
    a.arrive(c.net, c.meta, c.deadline, true, root).await_resume();
    broadcast_lines_take(c, data, root, s);
}

COROCOLL_DECL task<> broadcast_shm(context& c, std::span<std::byte> data, int root) {
    transport::shm_arena& a = *c.arena;
    const bool is_root = a.rank() == root;
    if (broadcast_shm_in_lines(a, data.size())) {
        // In the root's lines, which it may write again before every reader is done with
        // the last call's (settle_lines): a loop of small broadcasts runs as a queue.
        if (!a.lines_settled()) co_await a.settle_lines(c.net, c.meta, c.deadline);
        if (is_root) {
            broadcast_lines_from_root(c, data);
        } else {
            a.declare(c.meta);
            const std::uint64_t s = a.next_step();
            co_await a.arrive(c.net, c.meta, c.deadline, true, root);
            broadcast_lines_take(c, data, root, s);
        }
        co_return;
    }
    co_await a.settle(c.net, c.deadline);
    a.declare(c.meta);
    if (a.single_copy(transport::single_copy_use::broadcast, data.size())) {
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
    const std::size_t piece = std::min(broadcast_shm_piece_bytes, a.set_bytes());
    bool check = true;
    std::size_t off = 0;
    do {
        const std::size_t len = std::min(piece, data.size() - off);
        const std::uint64_t s = a.next_step();
        std::byte* at = a.set(s);
        if (is_root) {
            // Every rank reached the step before this one: the set is free again.
            if (off > 0) co_await a.settle(c.net, c.deadline);
            if (len > 0) copy_bytes(at, data.data() + off, len);
            a.arrive_and_go(c.net, c.meta, std::exchange(check, false));
        } else {
            co_await a.arrive(c.net, c.meta, c.deadline, std::exchange(check, false), root);
            if (len > 0) copy_bytes(data.data() + off, at, len);
        }
        off += len;
    } while (off < data.size());
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
