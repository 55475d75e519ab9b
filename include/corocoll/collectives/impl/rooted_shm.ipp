// The bodies of the non-template functions declared in <corocoll/collectives/rooted_shm.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/all_reduce_shm.hpp>
#include <corocoll/collectives/rooted_shm.hpp>
#include <corocoll/core/copy.hpp>

#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

namespace detail {

// A rank that only writes for its step (having said so, `will_go_on`, before the call's
// `declare`): into its lines, at their start, all of `what` but the `skip` bytes from
// `skip_at` (a scatter root's own block, which no other rank reads), what follows them moved
// down into their place (`scatter_shm_offset`), then on without waiting. Packed so, what a
// reader copies out starts as early in the lines as it can: on 2 ranks the other's block
// starts in the line with the root's counter, which the reader reads anyway.
inline void rooted_shm_write(context& c, std::span<const std::byte> what, std::size_t skip_at = 0,
                             std::size_t skip = 0) {
    transport::shm_arena& a = *c.arena;
    std::byte* to = a.own_small(what.size() - skip);
    if (skip_at > 0) copy_bytes(to, what.data(), skip_at);
    const std::size_t rest = skip_at + skip;
    if (rest < what.size()) copy_bytes(to + skip_at, what.data() + rest, what.size() - rest);
    a.arrive_and_go(c.net, c.meta, true);
}

// A rank that only writes `what` for the step, its lines free: says so, declares the call,
// writes and goes on (a reduce's or gather's non-root).
inline void rooted_shm_go_on(context& c, std::span<const std::byte> what) {
    c.arena->will_go_on(c.net, c.meta);
    c.arena->declare(c.meta);
    rooted_shm_write(c, what);
}

// A reduce's root, its lines free: declares the call and puts its own copy in its own lines,
// in rank order with the others' as all_reduce_shm does (no other rank reads them in a
// reduce); the step the copies go with.
inline std::uint64_t reduce_lines_own(context& c, std::span<const std::byte> data) {
    transport::shm_arena& a = *c.arena;
    a.declare(c.meta);
    const std::uint64_t s = a.next_step();
    if (!data.empty()) copy_bytes(a.own_small(data.size()), data.data(), data.size());
    return s;
}

// A reduce's root, every rank arrived at step `s`: reduces every copy into `data`.
inline void reduce_lines_collect(context& c, std::span<std::byte> data, const reduction& red,
                                 std::uint64_t s) {
    if (data.empty()) return;
    transport::shm_arena& a = *c.arena;
    const std::size_t count = data.size() / red.elem();
    copy_bytes(data.data(), a.small(0, s), data.size());
    for (int r = 1; r < a.size(); ++r) red(data.data(), a.small(r, s), count);
    red.finish(data.data(), count, a.size());
}

// A gather's root, every rank arrived at step `s`: every block into place.
inline void gather_lines_collect(context& c, std::span<const std::byte> in,
                                 std::span<std::byte> out, std::uint64_t s) {
    transport::shm_arena& a = *c.arena;
    const std::size_t block = in.size();
    for (int r = 0; r < a.size() && block > 0; ++r) {
        copy_bytes(out.data() + static_cast<std::size_t>(r) * block,
                   r == a.rank() ? in.data() : a.small(r, s), block);
    }
}

// A scatter's root, its lines free: says it goes on, declares the call, writes every other
// rank's block and goes on; its own block straight into `out`.
inline void scatter_lines_from_root(context& c, std::span<const std::byte> in,
                                    std::span<std::byte> out) {
    const std::size_t block = out.size();
    const std::size_t mine = static_cast<std::size_t>(c.arena->rank()) * block;
    c.arena->will_go_on(c.net, c.meta);
    c.arena->declare(c.meta);
    rooted_shm_write(c, in, mine, block);
    if (block > 0) copy_bytes(out.data(), in.data() + mine, block);
}

// A scatter's other rank, the root arrived at step `s`: its block out of the root's lines.
inline void scatter_lines_take(context& c, std::span<std::byte> out, int root, std::uint64_t s) {
    const std::size_t block = out.size();
    if (block == 0) return;
    copy_bytes(out.data(),
               c.arena->small(root, s) + scatter_shm_offset(c.arena->rank(), root, block), block);
}

}  // namespace detail

COROCOLL_DECL void gather_shm_now(context& c, std::span<const std::byte> in,
                                  std::span<std::byte> out, int root) {
    if (c.arena->rank() != root) {
        detail::rooted_shm_go_on(c, in);
        return;
    }
    c.arena->declare(c.meta);
    const std::uint64_t s = c.arena->next_step();
    c.arena->arrive(c.net, c.meta, c.deadline, true).await_resume();
    detail::gather_lines_collect(c, in, out, s);
}

COROCOLL_DECL void scatter_shm_now(context& c, std::span<const std::byte> in,
                                   std::span<std::byte> out, int root) {
    if (c.arena->rank() == root) {
        detail::scatter_lines_from_root(c, in, out);
        return;
    }
    c.arena->declare(c.meta);
    const std::uint64_t s = c.arena->next_step();
    c.arena->arrive(c.net, c.meta, c.deadline, true, root).await_resume();
    detail::scatter_lines_take(c, out, root, s);
}

COROCOLL_DECL task<> reduce_shm(context& c, std::span<std::byte> data, const reduction& red,
                                int root) {
    transport::shm_arena& a = *c.arena;
    const int me = a.rank();
    if (!rooted_shm_fits(data.size())) {
        // Beyond the lines: in slices, as all_reduce_shm's large path, the root alone copying
        // the result out.
        co_await a.settle(c.net, c.deadline);
        a.declare(c.meta);
        co_await detail::reduce_in_slices(c, data, red, root);
        co_return;
    }
    if (!a.lines_settled()) co_await a.settle_lines(c.net, c.meta, c.deadline);
    if (me != root) {
        detail::rooted_shm_go_on(c, data);
        co_return;
    }
    const std::uint64_t s = detail::reduce_lines_own(c, data);
    co_await a.arrive(c.net, c.meta, c.deadline, true);
    detail::reduce_lines_collect(c, data, red, s);
}

COROCOLL_DECL void reduce_shm_now(context& c, std::span<std::byte> data, const reduction& red,
                                  int root) {
    if (c.arena->rank() != root) {
        detail::rooted_shm_go_on(c, data);
        return;
    }
    const std::uint64_t s = detail::reduce_lines_own(c, data);
    c.arena->arrive(c.net, c.meta, c.deadline, true).await_resume();
    detail::reduce_lines_collect(c, data, red, s);
}

COROCOLL_DECL task<> gather_shm(context& c, std::span<const std::byte> in, std::span<std::byte> out,
                                int root) {
    transport::shm_arena& a = *c.arena;
    const int n = a.size(), me = a.rank();
    const std::size_t block = in.size();
    auto at = [block](int r) { return static_cast<std::size_t>(r) * block; };
    if (gather_shm_in_lines(a, block)) {
        if (!a.lines_settled()) co_await a.settle_lines(c.net, c.meta, c.deadline);
        if (me != root) {
            detail::rooted_shm_go_on(c, in);
            co_return;
        }
        a.declare(c.meta);
        const std::uint64_t s = a.next_step();
        co_await a.arrive(c.net, c.meta, c.deadline, true);
        detail::gather_lines_collect(c, in, out, s);
        co_return;
    }
    co_await a.settle(c.net, c.deadline);
    a.declare(c.meta);
    if (a.single_copy(transport::single_copy_use::gather, block)) {
        // The others offer their blocks and wait for the root alone at a second step, which
        // it reaches once it has copied every block straight from their buffers.
        const std::uint64_t s = a.next_step();
        if (me != root) {
            a.offer(in.data(), block);
            try {
                a.arrive_and_go(c.net, c.meta, true);
                co_await a.arrive(c.net, c.meta, c.deadline, false, root);
            } catch (...) {
                a.withdraw();
                throw;
            }
            co_return;
        }
        co_await a.arrive(c.net, c.meta, c.deadline, true);
        for (int r = 0; r < n; ++r) {
            if (r != me) a.copy_from(c.net, c.meta, r, s, 0, out.subspan(at(r), block));
        }
        copy_bytes(out.data() + at(me), in.data(), block);
        a.arrive_and_go(c.net, c.meta);
        co_return;
    }
    // In pieces of a slot of the data sets: the others write theirs and go on.
    const std::size_t slot = a.slot_bytes();
    bool check = true;
    for (std::size_t off = 0; off < block; off += slot) {
        const std::size_t len = std::min(slot, block - off);
        const std::uint64_t s = a.next_step();
        std::byte* set = a.set(s);
        if (me != root) {
            // Every rank reached the step before this one: the set is free again.
            if (off > 0) co_await a.settle(c.net, c.deadline);
            copy_bytes(set + static_cast<std::size_t>(me) * slot, in.data() + off, len);
            a.arrive_and_go(c.net, c.meta, std::exchange(check, false));
            continue;
        }
        co_await a.arrive(c.net, c.meta, c.deadline, std::exchange(check, false));
        for (int r = 0; r < n; ++r) {
            const std::byte* from =
                r == me ? in.data() + off : set + static_cast<std::size_t>(r) * slot;
            copy_bytes(out.data() + at(r) + off, from, len);
        }
    }
}

COROCOLL_DECL task<> scatter_shm(context& c, std::span<const std::byte> in,
                                 std::span<std::byte> out, int root) {
    transport::shm_arena& a = *c.arena;
    const int n = a.size(), me = a.rank();
    const std::size_t block = out.size();
    const std::size_t mine = static_cast<std::size_t>(me) * block;
    const bool is_root = me == root;
    if (scatter_shm_in_lines(a, block)) {
        if (!a.lines_settled()) co_await a.settle_lines(c.net, c.meta, c.deadline);
        if (is_root) {
            detail::scatter_lines_from_root(c, in, out);
            co_return;
        }
        a.declare(c.meta);
        const std::uint64_t s = a.next_step();
        co_await a.arrive(c.net, c.meta, c.deadline, true, root);
        detail::scatter_lines_take(c, out, root, s);
        co_return;
    }
    co_await a.settle(c.net, c.deadline);
    a.declare(c.meta);
    if (a.single_copy(transport::single_copy_use::scatter, block)) {
        // The root offers its buffer; every other rank copies its block straight from it,
        // then arrives at a second step, at which the root waits for all.
        const std::uint64_t s = a.next_step();
        if (is_root) {
            a.offer(in.data(), in.size());
            try {
                a.arrive_and_go(c.net, c.meta, true);
                copy_bytes(out.data(), in.data() + mine, block);
                a.expect_copies(c.net, block);
                co_await a.arrive(c.net, c.meta, c.deadline);
            } catch (...) {
                a.withdraw();
                throw;
            }
            co_return;
        }
        co_await a.arrive(c.net, c.meta, c.deadline, true, root);
        a.copy_from(c.net, c.meta, root, s, mine, out);
        a.arrive_and_go(c.net, c.meta);
        co_return;
    }
    // In pieces of a slot of the data sets: the root writes every other rank's and goes on.
    const std::size_t slot = a.slot_bytes();
    bool check = true;
    for (std::size_t off = 0; off < block; off += slot) {
        const std::size_t len = std::min(slot, block - off);
        const std::uint64_t s = a.next_step();
        std::byte* set = a.set(s);
        if (is_root) {
            // Every rank reached the step before this one: the set is free again.
            if (off > 0) co_await a.settle(c.net, c.deadline);
            for (int r = 0; r < n; ++r) {
                const std::size_t to = static_cast<std::size_t>(r);
                if (r != me) copy_bytes(set + to * slot, in.data() + to * block + off, len);
            }
            a.arrive_and_go(c.net, c.meta, std::exchange(check, false));
            copy_bytes(out.data() + off, in.data() + mine + off, len);
            continue;
        }
        co_await a.arrive(c.net, c.meta, c.deadline, std::exchange(check, false), root);
        copy_bytes(out.data() + off, set + static_cast<std::size_t>(me) * slot, len);
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
