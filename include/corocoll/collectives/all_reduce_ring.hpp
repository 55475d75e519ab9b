#pragma once

// All-reduce as a ring reduce-scatter followed by a ring all-gather (Patarasuk & Yuan). Each
// round is cut into chunks so that transfer and reduction overlap.
// Cost: 2(n - 1) rounds; each rank sends and receives 2(n - 1)/n * bytes (bus bandwidth
// optimal) and reduces (n - 1)/n * bytes. Chosen: for large buffers (at or above all_reduce's
// large threshold), any world size.

#include <corocoll/collectives/all_gather_ring.hpp>
#include <corocoll/collectives/reduce_scatter_ring.hpp>
#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_reduce_ring(context& c, std::span<std::byte> data, const reduction& red);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/all_reduce_ring.ipp>
#endif
