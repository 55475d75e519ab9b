// The bodies of the non-template functions declared in <corocoll/collectives/dispatch.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/all_gather_bruck.hpp>
#include <corocoll/collectives/all_gather_hierarchical.hpp>
#include <corocoll/collectives/all_gather_ring.hpp>
#include <corocoll/collectives/all_gather_shm.hpp>
#include <corocoll/collectives/all_reduce_hierarchical.hpp>
#include <corocoll/collectives/all_reduce_recursive_doubling.hpp>
#include <corocoll/collectives/all_reduce_ring.hpp>
#include <corocoll/collectives/all_reduce_shm.hpp>
#include <corocoll/collectives/all_to_all_linear.hpp>
#include <corocoll/collectives/all_to_all_pairwise.hpp>
#include <corocoll/collectives/barrier_dissemination.hpp>
#include <corocoll/collectives/broadcast_binomial.hpp>
#include <corocoll/collectives/broadcast_chain.hpp>
#include <corocoll/collectives/broadcast_hierarchical.hpp>
#include <corocoll/collectives/broadcast_object_binomial.hpp>
#include <corocoll/collectives/broadcast_shm.hpp>
#include <corocoll/collectives/dispatch.hpp>
#include <corocoll/collectives/exchange_shm.hpp>
#include <corocoll/collectives/gather_binomial.hpp>
#include <corocoll/collectives/gather_linear.hpp>
#include <corocoll/collectives/gather_object_direct.hpp>
#include <corocoll/collectives/monitored_barrier_star.hpp>
#include <corocoll/collectives/reduce_binomial.hpp>
#include <corocoll/collectives/reduce_scatter_doubling.hpp>
#include <corocoll/collectives/reduce_scatter_ring.hpp>
#include <corocoll/collectives/rooted_shm.hpp>
#include <corocoll/collectives/scatter_binomial.hpp>
#include <corocoll/collectives/scatter_linear.hpp>
#include <corocoll/collectives/scatter_object_direct.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> barrier(context& c) { return barrier_dissemination(c); }

COROCOLL_DECL task<> monitored_barrier(context& c, std::chrono::milliseconds timeout) {
    return monitored_barrier_star(c, timeout);
}

COROCOLL_DECL task<> broadcast(context& c, algorithm a, const topology& hosts,
                               std::span<std::byte> data, int root) {
    switch (a) {
        case algorithm::shm:
            return broadcast_shm(c, data, root);
        case algorithm::hierarchical:
            return broadcast_hierarchical(c, hosts, data, root);
        case algorithm::chain:
            return broadcast_chain(c, data, root);
        default:
            return broadcast_binomial(c, data, root);
    }
}

COROCOLL_DECL task<> all_reduce(context& c, algorithm a, const topology& hosts,
                                std::span<std::byte> data, const reduction& red) {
    switch (a) {
        case algorithm::shm:
            return all_reduce_shm(c, data, red);
        case algorithm::hierarchical:
            return all_reduce_hierarchical(c, hosts, data, red);
        case algorithm::ring:
            return all_reduce_ring(c, data, red);
        default:
            return all_reduce_recursive_doubling(c, data, red);
    }
}

COROCOLL_DECL task<> reduce(context& c, algorithm a, std::span<std::byte> data,
                            const reduction& red, int root) {
    if (a == algorithm::shm && reduce_shm_carries(*c.arena, data.size(), red.elem())) {
        return reduce_shm(c, data, red, root);
    }
    return reduce_binomial(c, data, red, root);
}

COROCOLL_DECL task<> all_gather(context& c, algorithm a, const topology& hosts,
                                std::span<std::byte> out, std::span<const std::byte> in,
                                std::size_t elem) {
    switch (a) {
        case algorithm::shm:
            return all_gather_shm(c, out, in);
        case algorithm::hierarchical:
            return all_gather_hierarchical(c, hosts, out, in);
        case algorithm::bruck:
            return all_gather_bruck(c, out, in);
        default:
            return all_gather_ring(c, out, in, elem);
    }
}

COROCOLL_DECL task<> gather(context& c, algorithm a, std::span<const std::byte> in,
                            std::span<std::byte> out, int root) {
    if (a == algorithm::shm &&
        rooted_shm_carries(*c.arena, transport::single_copy_use::gather, in.size(), in.size())) {
        return gather_shm(c, in, out, root);
    }
    if (a == algorithm::linear) return gather_linear(c, in, out, root);
    return gather_binomial(c, in, out, root);
}

COROCOLL_DECL task<> scatter(context& c, algorithm a, std::span<const std::byte> in,
                             std::span<std::byte> out, int root) {
    if (a == algorithm::shm &&
        rooted_shm_carries(*c.arena, transport::single_copy_use::scatter,
                           out.size() * static_cast<std::size_t>(c.size()), out.size())) {
        return scatter_shm(c, in, out, root);
    }
    if (a == algorithm::linear) return scatter_linear(c, in, out, root);
    return scatter_binomial(c, in, out, root);
}

COROCOLL_DECL task<> reduce_scatter(context& c, algorithm a, std::span<std::byte> out,
                                    std::span<const std::byte> in, const reduction& red) {
    if (a == algorithm::shm && exchange_shm_fits(*c.arena, in.size(), red.elem())) {
        return reduce_scatter_shm(c, out, in, red);
    }
    if (a == algorithm::recursive_doubling) return reduce_scatter_doubling(c, out, in, red);
    return reduce_scatter_ring(c, out, in, red);
}

namespace detail {

// The offsets of equal blocks, which the caller did not make.
inline std::vector<std::size_t> even_offsets(const context& c, std::span<std::byte> out) {
    const auto n = static_cast<std::size_t>(c.size());
    std::vector<std::size_t> offsets(n + 1);
    for (std::size_t p = 0; p <= n; ++p) offsets[p] = p * (out.size() / n);
    return offsets;
}

// The pairwise exchange or the linear one of equal blocks, with the offsets made here.
COROCOLL_DECL task<> all_to_all_even(context& c, algorithm a, std::span<std::byte> out,
                                     std::span<const std::byte> in) {
    const std::vector<std::size_t> offsets = even_offsets(c, out);
    if (a == algorithm::linear) {
        co_await all_to_all_linear(c, out, offsets, in, offsets);
    } else {
        co_await all_to_all_pairwise(c, out, offsets, in, offsets);
    }
}

}  // namespace detail

COROCOLL_DECL task<> all_to_all(context& c, algorithm a, std::span<std::byte> out,
                                const std::vector<std::size_t>& out_offsets,
                                std::span<const std::byte> in,
                                const std::vector<std::size_t>& in_offsets) {
    if (out_offsets.empty()) {
        if (a == algorithm::shm && exchange_shm_fits(*c.arena, in.size(), 1)) {
            return all_to_all_shm(c, out, in);
        }
        return detail::all_to_all_even(c, a, out, in);
    }
    if (a == algorithm::linear) return all_to_all_linear(c, out, out_offsets, in, in_offsets);
    return all_to_all_pairwise(c, out, out_offsets, in, in_offsets);
}

COROCOLL_DECL task<> broadcast_object(context& c, std::string& bytes, int root) {
    return broadcast_object_binomial(c, bytes, root);
}

COROCOLL_DECL task<> gather_object(context& c, std::string mine, int root, bool all,
                                   std::vector<std::string>& out) {
    return gather_object_direct(c, std::move(mine), root, all, out);
}

COROCOLL_DECL task<> scatter_object(context& c, const std::vector<std::string>& parts,
                                    std::string& mine, int root) {
    return scatter_object_direct(c, parts, mine, root);
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
