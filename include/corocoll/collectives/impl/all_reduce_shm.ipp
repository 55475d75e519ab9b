// The bodies of the non-template functions declared in <corocoll/collectives/all_reduce_shm.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/all_reduce_shm.hpp>
#include <corocoll/core/copy.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_reduce_shm(context& c, std::span<std::byte> data, const reduction& red) {
    transport::shm_arena& a = *c.arena;
    const int n = a.size(), me = a.rank();
    const std::size_t elem = red.elem();
    const std::size_t slot = a.slot_bytes();
    co_await a.settle(c.net, c.deadline);
    a.declare(c.meta);
    if (data.size() * static_cast<std::size_t>(n) <= all_reduce_shm_whole_bytes &&
        data.size() <= slot) {
        const std::uint64_t s = a.next_step();
        const bool small = data.size() <= transport::shm_arena::small_bytes;
        auto copy_of = [&](int r) {
            return small ? a.small(r, s) : a.set(s) + static_cast<std::size_t>(r) * slot;
        };
        if (!data.empty()) {
            copy_bytes(small ? a.own_small(data.size()) : copy_of(me), data.data(), data.size());
        }
        co_await a.arrive(c.net, c.meta, c.deadline, true);
        if (data.empty()) co_return;
        const std::size_t count = data.size() / elem;
        if (me != 0) copy_bytes(data.data(), copy_of(0), data.size());
        for (int r = 1; r < n; ++r) red(data.data(), copy_of(r), count);
        red.finish(data.data(), count, n);
        co_return;
    }
    if (a.single_copy(transport::single_copy_use::all_reduce, data.size())) {
        co_await all_reduce_single_copies(c, data, red);
        co_return;
    }
    co_await detail::reduce_in_slices(c, data, red, -1);
}

COROCOLL_DECL std::size_t single_copy_piece_bytes(const transport::shm_arena& a) noexcept {
    return a.l2_bytes() > 0 ? std::max<std::size_t>(a.l2_bytes() / 8, 4096)
                            : std::size_t{256} << 10;
}

COROCOLL_DECL task<> all_reduce_single_copies(context& c, std::span<std::byte> data,
                                              const reduction& red) {
    transport::shm_arena& a = *c.arena;
    assert(a.size() == 2);
    const int me = a.rank(), other = 1 - me;
    const std::size_t elem = red.elem();
    const std::size_t count = data.size() / elem;
    // Half r of the buffer, in bytes: [offset, offset + length).
    auto half = [&](int r) {
        auto [first, last] = block_range(count, 2, static_cast<std::size_t>(r));
        return std::pair{first * elem, (last - first) * elem};
    };
    const auto [mine_at, mine_len] = half(me);
    const std::size_t piece = std::min(std::max(elem, single_copy_piece_bytes(a) / elem * elem),
                                       std::max(mine_len, elem));
    std::span<std::byte> theirs = c.scratch(context::algorithm_slot, piece);
    const std::uint64_t s = a.next_step();
    a.offer(data.data(), data.size());
    try {
        co_await a.arrive(c.net, c.meta, c.deadline, true);
        for (std::size_t off = 0; off < mine_len; off += piece) {
            const std::size_t len = std::min(piece, mine_len - off);
            std::byte* own = data.data() + mine_at + off;
            a.copy_from(c.net, c.meta, other, s, mine_at + off, theirs.first(len));
            red(own, theirs.data(), len / elem);
            red.finish(own, len / elem, 2);
        }
        co_await a.arrive(c.net, c.meta, c.deadline);
        const auto [at, len] = half(other);
        if (len > 0) a.copy_from(c.net, c.meta, other, s, at, data.subspan(at, len));
        a.expect_copies(c.net, mine_len);
        co_await a.arrive(c.net, c.meta, c.deadline);
    } catch (...) {
        a.withdraw();
        throw;
    }
}

COROCOLL_DECL task<> detail::reduce_in_slices(context& c, std::span<std::byte> data,
                                              const reduction& red, int root) {
    transport::shm_arena& a = *c.arena;
    const int n = a.size(), me = a.rank();
    const std::size_t elem = red.elem();
    const std::size_t slot = a.slot_bytes();
    const std::size_t chunk = slot / elem * elem;
    const bool reads = root < 0 || me == root;
    bool check = true;
    for (std::size_t off = 0; off < data.size(); off += chunk) {
        const std::size_t len = std::min(chunk, data.size() - off);
        const std::uint64_t s = a.next_step();
        std::byte* copies = a.set(s);
        copy_bytes(copies + static_cast<std::size_t>(me) * slot, data.data() + off, len);
        co_await a.arrive(c.net, c.meta, c.deadline, std::exchange(check, false));
        // This rank's slice of the chunk, reduced over every rank's copy in rank order.
        auto [first, last] =
            block_range(len / elem, static_cast<std::size_t>(n), static_cast<std::size_t>(me));
        std::byte* result = a.set(s + 1);
        if (last > first) {
            std::byte* out = result + first * elem;
            copy_bytes(out, copies + first * elem, (last - first) * elem);
            for (int r = 1; r < n; ++r) {
                red(out, copies + static_cast<std::size_t>(r) * slot + first * elem, last - first);
            }
            red.finish(out, last - first, n);
        }
        if (!reads && off + len >= data.size()) {
            a.arrive_and_go(c.net, c.meta);
            co_return;
        }
        co_await a.arrive(c.net, c.meta, c.deadline);
        if (reads) copy_bytes(data.data() + off, result, len);
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
