#pragma once

// Reduce along a binomial tree to `root`: each rank combines what its children send into its
// own partial result and passes that to its parent, in chunks (a chunk is reduced while the
// next one arrives). A non-root rank with children works in the group's scratch, so its buffer
// is left as it was: its first child's chunks land there and its own buffer is reduced into
// them; a leaf sends its buffer as it is; the root reduces into its buffer. Before chunks, every
// rank also took a temporary as large as the buffer for what came in, whose fresh pages'
// faults dominated large calls (docs/performance.md, "Why the defaults").
// Cost: ceil(log2 n) rounds; every rank but the root sends bytes once; the root receives
// ceil(log2 n) * bytes and reduces as much.
// Chosen: always for reduce (any size, any world size).

#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/reduction.hpp>
#include <corocoll/collectives/ring.hpp>
#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> reduce_binomial(context& c, std::span<std::byte> data, const reduction& red,
                                     int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/reduce_binomial.ipp>
#endif
