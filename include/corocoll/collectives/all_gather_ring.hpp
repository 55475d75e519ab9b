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

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/all_gather_ring.ipp>
#endif
