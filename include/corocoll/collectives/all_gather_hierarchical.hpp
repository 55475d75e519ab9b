#pragma once

// All-gather in three phases for a group that spans hosts: each host's leader gathers its
// ranks' blocks straight into their places in its output, the leaders send every block of
// their host to every other leader (all receives posted first, each block into its place),
// then each leader broadcasts the whole output within its host. Ranks of a host need not be
// consecutive.
// Cost: 1 + (H - 1 exchanges) + ceil(log2 L) rounds; between hosts each leader sends its
// host's blocks to every other leader ((H - 1) * L * block bytes) and receives the rest of
// the output once; no other rank sends across hosts. Within a host each rank sends its block
// once and receives the output once.
// Chosen: for all_gather of any size when the group spans several hosts and some host holds
// more than one rank (`topology::hierarchical`).

#include <corocoll/collectives/hierarchical_phase.hpp>
#include <corocoll/collectives/topology.hpp>
#include <corocoll/version.hpp>

#include <cstring>
#include <exception>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// `c` is a call on the whole group whose hosts `t` describes; `out` holds size() blocks of
/// in.size() bytes, in rank order.
COROCOLL_DECL task<> all_gather_hierarchical(context& c, const topology& t,
                                             std::span<std::byte> out,
                                             std::span<const std::byte> in, thresholds th = {});

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/all_gather_hierarchical.ipp>
#endif
