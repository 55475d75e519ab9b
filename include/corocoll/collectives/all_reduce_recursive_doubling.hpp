#pragma once

// All-reduce by recursive doubling: partners at distance 1, 2, 4, ... swap their whole
// buffers and reduce. With n not a power of two, the first 2*rem ranks (rem = n - 2^k) pair
// up first: even ones hand their data to the odd neighbour and sit out, and get the result
// back at the end.
// Cost: log2(2^k) rounds (+2 when n is not a power of two); each active rank sends and
// reduces bytes per round: latency optimal, bandwidth log2(n) * bytes. Chosen: for small
// buffers (below all_reduce's large threshold).

#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/reduction.hpp>
#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_reduce_recursive_doubling(context& c, std::span<std::byte> data,
                                                   const reduction& red);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/all_reduce_recursive_doubling.ipp>
#endif
