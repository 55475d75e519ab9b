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
#include <corocoll/collectives/hierarchical_phase.hpp>
#include <corocoll/collectives/reduce_binomial.hpp>
#include <corocoll/collectives/select.hpp>
#include <corocoll/collectives/topology.hpp>
#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// `c` is a call on the whole group whose hosts `t` describes.
COROCOLL_DECL task<> all_reduce_hierarchical(context& c, const topology& t,
                                             std::span<std::byte> data, const reduction& red,
                                             thresholds th = {});

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/all_reduce_hierarchical.ipp>
#endif
