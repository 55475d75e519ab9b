#pragma once

// monitored_barrier, like torch's: every other rank reports to rank 0 (round 0), which waits
// up to the barrier's own timeout for all of them and then sends each its verdict: an empty
// one (pass) or the error text naming every rank that did not arrive (rounds 1 and 2). A
// late rank finds the verdict waiting in its buffers.
// Cost: 2 rounds through rank 0 (3 with a failure): rank 0 receives n - 1 empty messages and
// sends n - 1 lengths (plus the text), so O(n) at the root; latency, not bandwidth. Chosen:
// always (it is the only monitored_barrier).

#include <corocoll/collectives/context.hpp>
#include <corocoll/core/error.hpp>
#include <corocoll/core/when_all.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/version.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <system_error>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> monitored_barrier_star(context& c, std::chrono::milliseconds timeout);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/monitored_barrier_star.ipp>
#endif
