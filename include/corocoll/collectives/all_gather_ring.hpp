#pragma once

// All-gather around a ring: rank r starts with block r of `data`; in round s it sends block
// (r - s) to rank + 1 and receives block (r - s - 1) from rank - 1 straight into place.
// Cost: n - 1 rounds; each rank sends and receives (n - 1)/n * bytes; bus bandwidth optimal.
// Chosen: for all_gather of large totals (and as the second half of all_reduce_ring).

#include <corocoll/collectives/ring.hpp>
#include <corocoll/version.hpp>

#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Blocks are `block_range(count, n, i)` of `data` in elements of `elem` bytes.
COROCOLL_DECL task<> all_gather_ring(context& c, std::span<std::byte> data, std::size_t elem,
                                     std::uint32_t first_round = 0);

/// all_gather_into's form: rank r's `in` goes to block r of `out` (blocks of in.size() bytes,
/// so equal on every rank), then the ring fills the others.
COROCOLL_DECL task<> all_gather_ring(context& c, std::span<std::byte> out,
                                     std::span<const std::byte> in, std::size_t elem);

}  // namespace collectives

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

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
        std::memcpy(out.data() + in.size() * static_cast<std::size_t>(c.rank()), in.data(),
                    in.size());
    }
    return all_gather_ring(c, out, elem);
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
