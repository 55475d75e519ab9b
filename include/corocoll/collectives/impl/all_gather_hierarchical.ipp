// The bodies of the non-template functions declared in
// <corocoll/collectives/all_gather_hierarchical.hpp>: inline where corocoll is header-only,
// compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/all_gather_hierarchical.hpp>
#include <corocoll/core/copy.hpp>

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
        if (block > 0) copy_bytes(place(me).data(), in.data(), block);
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
