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

#include <corocoll/collectives/all_reduce_hierarchical.hpp>
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

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_gather_hierarchical(context& c, const topology& t,
                                             std::span<std::byte> out,
                                             std::span<const std::byte> in, thresholds th) {
    int me = c.rank();
    int host = t.host_of(me), leader = t.leader_of(host);
    std::size_t block = in.size();
    auto place = [&](int r) { return out.subspan(block * static_cast<std::size_t>(r), block); };
    std::span<const int> local = t.ranks_on(host);
    if (me != leader) {
        co_await c.send(in, leader, 0);
    } else {
        if (block > 0) std::memcpy(place(me).data(), in.data(), block);
        std::vector<context::recv_operation> recvs;
        for (int r : local) {
            if (r != me) recvs.push_back(c.recv(place(r), r, 0));
        }
        co_await when_all(std::move(recvs));
        // Between leaders: block i of host g comes from g's leader as chunk i of round
        // `hierarchical_phase_rounds`; every receive is posted before any send.
        // Reserved whole: a started receive must not move.
        recvs.clear();
        recvs.reserve(static_cast<std::size_t>(c.size()) - local.size());
        for (int g = 0; g < t.hosts(); ++g) {
            if (g == host) continue;
            auto theirs = t.ranks_on(g);
            for (std::size_t i = 0; i < theirs.size(); ++i) {
                recvs.push_back(c.recv(place(theirs[i]), t.leader_of(g), hierarchical_phase_rounds,
                                       static_cast<std::uint32_t>(i)));
                recvs.back().start();
            }
        }
        std::exception_ptr failed;
        try {
            for (int g = 0; g < t.hosts(); ++g) {
                if (g == host) continue;
                for (std::size_t i = 0; i < local.size(); ++i) {
                    co_await c.send(place(local[i]), t.leader_of(g), hierarchical_phase_rounds,
                                    static_cast<std::uint32_t>(i));
                }
            }
        } catch (...) {
            failed = std::current_exception();
        }
        // The posted receives may be filling `out`: they end (the group has failed, if a send
        // did) before the buffer can go.
        try {
            co_await when_all(std::move(recvs));
        } catch (...) {
            if (!failed) failed = std::current_exception();
        }
        if (failed) std::rethrow_exception(failed);
    }
    co_await broadcast_among(c, local, out, 0, 2, th);
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
