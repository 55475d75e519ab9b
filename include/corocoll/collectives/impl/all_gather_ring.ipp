// The bodies of the non-template functions declared in <corocoll/collectives/all_gather_ring.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/all_gather_ring.hpp>
#include <corocoll/core/copy.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_gather_ring(context& c, std::span<std::byte> data, std::size_t elem,
                                     std::uint32_t first_round) {
    int n = c.size(), r = c.rank();
    std::size_t count = data.size() / elem;
    auto block = [&](int i) {
        auto [first, last] =
            block_range(count, static_cast<std::size_t>(n), static_cast<std::size_t>(i));
        return data.subspan(first * elem, (last - first) * elem);
    };
    for (int s = 0; s < n - 1; ++s) {
        int send_block = ((r - s) % n + n) % n, recv_block = ((r - s - 1) % n + n) % n;
        co_await detail::ring_round(c, block(send_block), (r + 1) % n, block(recv_block),
                                    (r - 1 + n) % n, first_round + static_cast<std::uint32_t>(s),
                                    nullptr, elem);
    }
}

COROCOLL_DECL task<> all_gather_ring(context& c, std::span<std::byte> out,
                                     std::span<const std::byte> in, std::size_t elem) {
    if (!in.empty()) {
        copy_bytes(out.data() + in.size() * static_cast<std::size_t>(c.rank()), in.data(),
                   in.size());
    }
    return all_gather_ring(c, out, elem);
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
