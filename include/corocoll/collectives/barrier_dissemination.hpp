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

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> barrier_dissemination(context& c) {
    int n = c.size(), r = c.rank();
    std::uint32_t round = 0;
    for (int dist = 1; dist < n; dist *= 2, ++round) {
        co_await c.exchange({}, (r + dist) % n, {}, (r - dist + n) % n, round);
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
