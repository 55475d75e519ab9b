// The bodies of the non-template functions declared in <corocoll/collectives/exchange_shm.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/all_gather_shm.hpp>
#include <corocoll/collectives/exchange_shm.hpp>
#include <corocoll/core/copy.hpp>

#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

namespace detail {

// The exchange both share: `in` holds n blocks of `block` bytes; each step carries bytes
// [off, off + len) of every block (len a multiple of `grain`), and `take(off, len, from)`
// then reads this rank's piece of every rank r's input at from(r).
template <class Take>
task<> exchange_shm(context& c, std::span<const std::byte> in, std::size_t block, std::size_t grain,
                    Take take) {
    transport::shm_arena& a = *c.arena;
    const int n = a.size(), me = a.rank();
    const auto at = [](int r) { return static_cast<std::size_t>(r); };
    const std::size_t slot = a.slot_bytes();
    co_await a.settle(c.net, c.deadline);
    a.declare(c.meta);
    if (in.size() <= transport::shm_arena::small_bytes) {
        const std::uint64_t s = a.next_step();
        if (!in.empty()) copy_bytes(a.own_small(in.size()), in.data(), in.size());
        co_await a.arrive(c.net, c.meta, c.deadline, true);
        if (block > 0) take(0, block, [&](int r) { return a.small(r, s) + at(me) * block; });
        co_return;
    }
    // Each block's share of a slot; at least one grain (`exchange_shm_fits` checked that
    // beforehand).
    const std::size_t piece = slot / at(n) / grain * grain;
    bool check = true;
    for (std::size_t off = 0; off < block; off += piece) {
        const std::size_t len = std::min(piece, block - off);
        const std::uint64_t s = a.next_step();
        std::byte* set = a.set(s);
        std::byte* mine = set + at(me) * slot;
        for (int p = 0; p < n; ++p)
            copy_bytes(mine + at(p) * len, in.data() + at(p) * block + off, len);
        co_await a.arrive(c.net, c.meta, c.deadline, std::exchange(check, false));
        take(off, len, [&](int r) { return set + at(r) * slot + at(me) * len; });
    }
}

}  // namespace detail

COROCOLL_DECL bool exchange_shm_fits(const transport::shm_arena& a, std::size_t in_bytes,
                                     std::size_t grain) noexcept {
    return in_bytes <= transport::shm_arena::small_bytes ||
           a.slot_bytes() / static_cast<std::size_t>(a.size()) >= grain;
}

COROCOLL_DECL task<> reduce_scatter_shm(context& c, std::span<std::byte> out,
                                        std::span<const std::byte> in, const reduction& red) {
    const int n = c.arena->size();
    const std::size_t elem = red.elem();
    return detail::exchange_shm(c, in, out.size(), elem,
                                [out, red, n, elem](std::size_t off, std::size_t len, auto from) {
                                    std::byte* dst = out.data() + off;
                                    copy_bytes(dst, from(0), len);
                                    for (int r = 1; r < n; ++r) red(dst, from(r), len / elem);
                                    red.finish(dst, len / elem, n);
                                });
}

COROCOLL_DECL task<> all_to_all_shm(context& c, std::span<std::byte> out,
                                    std::span<const std::byte> in) {
    transport::shm_arena& a = *c.arena;
    const int n = a.size(), me = a.rank();
    const auto at = [](int r) { return static_cast<std::size_t>(r); };
    const std::size_t block = out.size() / at(n);
    if (block == 0 || !a.single_copy(transport::single_copy_use::all_to_all, block)) {
        co_await detail::exchange_shm(
            c, in, block, 1, [out, n, block](std::size_t off, std::size_t len, auto from) {
                for (int r = 0; r < n; ++r) {
                    copy_bytes(out.data() + static_cast<std::size_t>(r) * block + off, from(r),
                               len);
                }
            });
        co_return;
    }
    // Single copies: every rank offers its input and copies block `me` of every other rank's
    // straight into place, as all_gather_shm does with whole buffers.
    co_await a.settle(c.net, c.deadline);
    a.declare(c.meta);
    co_await gather_single_copies(c, in, at(me) * block, in.subspan(at(me) * block, block), out);
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
