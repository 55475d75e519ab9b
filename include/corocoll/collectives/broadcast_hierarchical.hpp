#pragma once

// Broadcast in two phases for a group that spans hosts: one rank per host (the root on its
// own host, the leader on every other) receives the buffer across hosts (binomial tree, or a
// chain for large buffers), then each of them broadcasts it within its host.
// Cost: the root's host and every other host each receive bytes once across hosts (H - 1
// transfers between hosts in all, against up to n - 1 for a tree over every rank); then
// ceil(log2 L) rounds within a host of L ranks.
// Chosen: for broadcast of any size when the group spans several hosts and some host holds
// more than one rank (`topology::hierarchical`).

#include <corocoll/collectives/hierarchical_phase.hpp>
#include <corocoll/collectives/topology.hpp>
#include <corocoll/version.hpp>

#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// `c` is a call on the whole group whose hosts `t` describes.
COROCOLL_DECL task<> broadcast_hierarchical(context& c, const topology& t,
                                            std::span<std::byte> data, int root,
                                            thresholds th = {});

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/broadcast_hierarchical.ipp>
#endif
