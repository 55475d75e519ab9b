#pragma once

// Barrier by dissemination (Hensgen, Finkel, Manber): in round k every rank sends an empty
// message to rank + 2^k and waits for one from rank - 2^k (mod n).
// Cost: ceil(log2 n) rounds, 0 payload bytes, n * ceil(log2 n) messages in all.
// Chosen: always (every world size).

#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> barrier_dissemination(context& c);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/barrier_dissemination.ipp>
#endif
