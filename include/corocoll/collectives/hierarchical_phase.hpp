#pragma once

// What the hierarchical algorithms (all_reduce, broadcast and all_gather across hosts) share: the
// numbering of their phases' rounds, and the broadcast of one phase among a subset of the group
// (a host's ranks, or the hosts' leaders).

#include <corocoll/collectives/broadcast_binomial.hpp>
#include <corocoll/collectives/broadcast_chain.hpp>
#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/select.hpp>
#include <corocoll/version.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Rounds of each phase start here (a round is 12 bits of the step; see `context::step`).
inline constexpr std::uint32_t hierarchical_phase_rounds = 1024;

/// The broadcast of a hierarchical phase among `ranks` (group ranks) from `ranks[root]`, with
/// the algorithm `select` picks for that many ranks and bytes.
COROCOLL_DECL task<> broadcast_among(context& c, std::span<const int> ranks,
                                     std::span<std::byte> data, int root, std::uint32_t phase,
                                     thresholds th);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/hierarchical_phase.ipp>
#endif
