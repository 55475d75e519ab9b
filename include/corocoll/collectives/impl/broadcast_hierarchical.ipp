// The bodies of the non-template functions declared in
// <corocoll/collectives/broadcast_hierarchical.hpp>: inline where corocoll is header-only, compiled
// once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/broadcast_hierarchical.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> broadcast_hierarchical(context& c, const topology& t,
                                            std::span<std::byte> data, int root, thresholds th) {
    int me = c.rank();
    int host = t.host_of(me), root_host = t.host_of(root);
    // Each host's representative: the root on its host, the leader elsewhere.
    std::vector<int> reps(t.leaders().begin(), t.leaders().end());
    reps[static_cast<std::size_t>(root_host)] = root;
    int my_rep = reps[static_cast<std::size_t>(host)];
    if (me == my_rep) co_await broadcast_among(c, reps, data, root_host, 0, th);
    std::span<const int> local = t.ranks_on(host);
    int local_root = 0;
    while (local[static_cast<std::size_t>(local_root)] != my_rep) ++local_root;
    co_await broadcast_among(c, local, data, local_root, 1, th);
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
