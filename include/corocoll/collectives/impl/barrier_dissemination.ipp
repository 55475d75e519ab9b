// The bodies of the non-template functions declared in
// <corocoll/collectives/barrier_dissemination.hpp>: inline where corocoll is header-only, compiled
// once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/barrier_dissemination.hpp>

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
