// The bodies of the non-template functions declared in
// <corocoll/collectives/all_reduce_hierarchical.hpp>: inline where corocoll is header-only,
// compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/all_reduce_hierarchical.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_reduce_hierarchical(context& c, const topology& t,
                                             std::span<std::byte> data, const reduction& red,
                                             thresholds th) {
    int me = c.rank();
    int host = t.host_of(me);
    int leader = t.leader_of(host);
    std::span<const int> local = t.ranks_on(host);
    // avg sums through every phase and divides once, by the whole group's size, at the end.
    reduction sum = red;
    if (sum.op == reduce_op::avg) sum.op = reduce_op::sum;
    if (local.size() > 1) {
        context sub = c.among(local, 0);
        co_await reduce_binomial(sub, data, sum, 0);  // the leader is local rank 0
    }
    if (me == leader) {
        if (t.hosts() > 1) {
            context sub = c.among(t.leaders(), hierarchical_phase_rounds);
            if (select(collective_kind::all_reduce, data.size(), sub.size(), {}, th) ==
                algorithm::ring) {
                co_await all_reduce_ring(sub, data, sum);
            } else {
                co_await all_reduce_recursive_doubling(sub, data, sum);
            }
        }
        red.finish(data.data(), data.size() / red.elem(), c.size());
    }
    co_await broadcast_among(c, local, data, 0, 2, th);
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
