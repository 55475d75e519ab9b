#pragma once

// All-reduce in three phases for a group that spans hosts: the ranks of each host reduce to
// their host's leader (binomial tree, on shared memory where the host has it), the leaders
// all-reduce among themselves (across hosts: ring for large buffers, recursive doubling for
// small ones), and each leader broadcasts the result to its host (binomial, or a chain for
// large buffers on more than two ranks).
// Cost, with H hosts and L ranks on the largest: ceil(log2 L) + the leaders' rounds +
// ceil(log2 L) rounds; between hosts only the leaders send, 2(H - 1)/H * bytes each with the
// ring, instead of every rank. Within a host each rank sends about bytes twice.
// Chosen: for all_reduce of any size when the group spans several hosts and some host holds
// more than one rank (`topology::hierarchical`).

#include <corocoll/collectives/all_reduce_recursive_doubling.hpp>
#include <corocoll/collectives/all_reduce_ring.hpp>
#include <corocoll/collectives/broadcast_binomial.hpp>
#include <corocoll/collectives/broadcast_chain.hpp>
#include <corocoll/collectives/reduce_binomial.hpp>
#include <corocoll/collectives/select.hpp>
#include <corocoll/collectives/topology.hpp>
#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Rounds of each phase start here (a round is 12 bits of the step; see `context::step`).
inline constexpr std::uint32_t hierarchical_phase_rounds = 1024;

/// `c` is a call on the whole group whose hosts `t` describes.
COROCOLL_DECL task<> all_reduce_hierarchical(context& c, const topology& t,
                                             std::span<std::byte> data, const reduction& red,
                                             thresholds th = {});

/// The broadcast of a hierarchical phase among `ranks` (group ranks) from `ranks[root]`, with
/// the algorithm `select` picks for that many ranks and bytes.
COROCOLL_DECL task<> broadcast_among(context& c, std::span<const int> ranks,
                                     std::span<std::byte> data, int root, std::uint32_t phase,
                                     thresholds th);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/all_reduce_hierarchical.ipp>
#endif
