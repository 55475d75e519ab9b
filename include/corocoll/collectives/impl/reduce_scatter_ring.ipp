// The bodies of the non-template functions declared in
// <corocoll/collectives/reduce_scatter_ring.hpp>: inline where corocoll is header-only, compiled
// once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/reduce_scatter_ring.hpp>
#include <corocoll/core/copy.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> reduce_scatter_ring(context& c, std::span<std::byte> data,
                                         const reduction& red, std::uint32_t first_round) {
    int n = c.size(), r = c.rank();
    std::size_t elem = red.elem(), count = data.size() / elem;
    auto block = [&](int i) {
        auto [first, last] =
            block_range(count, static_cast<std::size_t>(n), static_cast<std::size_t>(i));
        return data.subspan(first * elem, (last - first) * elem);
    };
    for (int s = 0; s < n - 1; ++s) {
        int send_block = ((r - s - 1) % n + n) % n, recv_block = ((r - s - 2) % n + n) % n;
        co_await detail::ring_round(c, block(send_block), (r + 1) % n, block(recv_block),
                                    (r - 1 + n) % n, first_round + static_cast<std::uint32_t>(s),
                                    &red, elem);
    }
}

COROCOLL_DECL task<> reduce_scatter_ring(context& c, std::span<std::byte> out,
                                         std::span<const std::byte> in, const reduction& red) {
    int n = c.size(), r = c.rank();
    std::size_t elem = red.elem();
    bool overlapping = !out.empty() && !in.empty() && out.data() < in.data() + in.size() &&
                       in.data() < out.data() + out.size();
    if (n > 1 && !overlapping && in.size() == out.size() * static_cast<std::size_t>(n)) {
        auto block = [&](int i) {
            return in.subspan(static_cast<std::size_t>(i) * out.size(), out.size());
        };
        // Round s receives block (r - s - 2) into dests[(n - 2 - s) % 2], so the last round
        // (s = n - 2) fills `out`; the next round sends what this one filled.
        std::span<std::byte> dests[2] = {
            out, n > 2 ? c.scratch(context::group_slot, out.size()) : std::span<std::byte>{}};
        std::span<const std::byte> sending = block(((r - 1) % n + n) % n);
        for (int s = 0; s < n - 1; ++s) {
            int recv_block = ((r - s - 2) % n + n) % n;
            std::span<std::byte> dest = dests[(n - 2 - s) % 2];
            co_await detail::ring_round(c, sending, (r + 1) % n, dest, (r - 1 + n) % n,
                                        static_cast<std::uint32_t>(s), &red, elem,
                                        block(recv_block));
            sending = dest;
        }
        red.finish(out.data(), out.size() / elem, n);
        co_return;
    }
    std::span<std::byte> work = c.scratch(context::group_slot, in.size());
    if (!in.empty()) copy_bytes(work.data(), in.data(), in.size());
    co_await reduce_scatter_ring(c, work, red);
    std::size_t count = work.size() / elem;
    auto [first, last] =
        block_range(count, static_cast<std::size_t>(n), static_cast<std::size_t>(r));
    red.finish(work.data() + first * elem, last - first, n);
    if (!out.empty()) copy_bytes(out.data(), work.data() + first * elem, out.size());
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
