// The bodies of the non-template functions declared in
// <corocoll/collectives/hierarchical_phase.hpp>: inline where corocoll is header-only, compiled
// once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/hierarchical_phase.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> broadcast_among(context& c, std::span<const int> ranks,
                                     std::span<std::byte> data, int root, std::uint32_t phase,
                                     thresholds th) {
    if (ranks.size() < 2) co_return;
    context sub = c.among(ranks, phase * hierarchical_phase_rounds);
    if (select(collective_kind::broadcast, data.size(), sub.size(), {}, th) == algorithm::chain) {
        co_await broadcast_chain(sub, data, root);
    } else {
        co_await broadcast_binomial(sub, data, root);
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
