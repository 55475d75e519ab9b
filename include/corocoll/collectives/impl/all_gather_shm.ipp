// The bodies of the non-template functions declared in <corocoll/collectives/all_gather_shm.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/all_gather_shm.hpp>
#include <corocoll/core/copy.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_gather_shm(context& c, std::span<std::byte> out,
                                    std::span<const std::byte> in) {
    transport::shm_arena& a = *c.arena;
    const int n = a.size(), me = a.rank();
    const std::size_t block = in.size();
    const std::size_t slot = a.slot_bytes();
    co_await a.settle(c.net, c.deadline);
    a.declare(c.meta);
    auto at = [](int r) { return static_cast<std::size_t>(r); };
    if (a.single_copy(transport::single_copy_use::all_gather, block)) {
        co_await gather_single_copies(c, in, 0, in, out);
        co_return;
    }
    if (block <= transport::shm_arena::small_bytes ||
        (block >= all_gather_shm_lines_from && block <= transport::shm_arena::line_bytes)) {
        // In this rank's lines for the step: every rank waits there for all, so no rank
        // writes a place again before every other is done with it.
        const std::uint64_t s = a.next_step();
        if (block > 0) copy_bytes(a.own_small(block), in.data(), block);
        co_await a.arrive(c.net, c.meta, c.deadline, true);
        for (int r = 0; r < n && block > 0; ++r) {
            copy_bytes(out.data() + at(r) * block, a.small(r, s), block);
        }
        co_return;
    }
    bool check = true;
    for (std::size_t off = 0; off < block; off += slot) {
        const std::size_t len = std::min(slot, block - off);
        const std::uint64_t s = a.next_step();
        std::byte* set = a.set(s);
        copy_bytes(set + at(me) * slot, in.data() + off, len);
        co_await a.arrive(c.net, c.meta, c.deadline, std::exchange(check, false));
        for (int r = 0; r < n; ++r) {
            copy_bytes(out.data() + at(r) * block + off, set + at(r) * slot, len);
        }
    }
}

COROCOLL_DECL task<> gather_single_copies(context& c, std::span<const std::byte> offered,
                                          std::size_t read_at, std::span<const std::byte> own,
                                          std::span<std::byte> out) {
    transport::shm_arena& a = *c.arena;
    const int n = a.size(), me = a.rank();
    const std::size_t block = own.size();
    auto at = [](int r) { return static_cast<std::size_t>(r); };
    const std::uint64_t s = a.next_step();
    std::span<std::byte> mine = out.subspan(at(me) * block, block);
    const bool copy_mine = mine.data() != own.data();
    // Every other call goes backward: its own block last, the others in reverse order, each
    // from its end (shm_arena::next_sweep_backward).
    const bool backward = a.next_sweep_backward();
    if (copy_mine && !backward) copy_bytes(mine.data(), own.data(), block);
    a.offer(offered.data(), offered.size());
    try {
        co_await a.arrive(c.net, c.meta, c.deadline, true);
        for (int k = 1; k < n; ++k) {
            const int r = (me + (backward ? n - k : k)) % n;
            a.copy_from(c.net, c.meta, r, s, read_at, out.subspan(at(r) * block, block), backward);
        }
        if (copy_mine && backward) a.copy_backward(mine.data(), own.data(), block);
        a.expect_copies(c.net, block);
        co_await a.arrive(c.net, c.meta, c.deadline);
    } catch (...) {
        a.withdraw();
        throw;
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
