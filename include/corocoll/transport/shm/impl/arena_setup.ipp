// The bodies of <corocoll/transport/shm/arena_setup.hpp>: inline where corocoll is
// header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/cheapest.hpp>
#include <corocoll/transport/shm/arena_setup.hpp>

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <limits>

COROCOLL_BEGIN_NAMESPACE

namespace transport {
namespace detail {

COROCOLL_DECL std::size_t single_copy_from_for(single_copy_use u, int ranks, std::size_t option,
                                               std::size_t l2_bytes,
                                               std::chrono::nanoseconds copy_cost) {
    // all_reduce: 2 ranks only, whatever the option (see the declaration).
    if (u == single_copy_use::all_reduce && ranks != 2) return 0;
    if (option != engine_options::automatic_single_copy) return option;
    const std::size_t l2 = l2_bytes > 0 ? l2_bytes : std::size_t{2} << 20;
    // The size measured where a process_vm_readv is quick; where it is slow, the one that
    // follows the L2, never below it.
    const bool slow = copy_cost >= slow_single_copy;
    auto from = [slow](std::size_t quick, std::size_t by_l2) {
        return slow ? std::max(quick, by_l2) : quick;
    };
    const std::size_t kib = 1024;
    if (ranks == 2) {
        // Where it is slow, all_reduce and all_gather, where both ranks copy from each other,
        // make none: the pair's ring, whose two copies the two ranks make at once, led them at
        // every size. all_to_all makes them from blocks of half the L2 to blocks of 8 L2s
        // (`single_copy_below_for`): there the ring's three copies (the own block, in and
        // out of the ring) trailed one copy by the kernel and the own block's.
        switch (u) {
            case single_copy_use::all_reduce:
                return slow ? 0 : l2;
            case single_copy_use::broadcast:
                return from(16 * kib, l2);
            case single_copy_use::all_gather:
                return slow ? 0 : 8 * kib;
            default:  // gather, scatter, all_to_all
                return from(16 * kib, l2 / 2);
        }
    }
    if (ranks > 8) return 0;
    switch (u) {
        case single_copy_use::scatter:
            return from(64 * kib, l2 / static_cast<std::size_t>(ranks));
        case single_copy_use::all_to_all:
            // Where it is slow, none: the messages led from the first blocks past the data
            // sets' (128 KiB on 4 ranks) to 16 MiB ones (docs/performance.md, "No single
            // copies of all_to_all on 3 to 8 ranks where a process_vm_readv is slow").
            return slow ? 0 : 24 * kib;
        default:
            return 0;
    }
}

COROCOLL_DECL std::size_t single_copy_below_for(single_copy_use u, int ranks, std::size_t option,
                                                std::size_t l2_bytes,
                                                std::chrono::nanoseconds copy_cost) {
    if (option != engine_options::automatic_single_copy || copy_cost < slow_single_copy) return 0;
    if (u != single_copy_use::all_to_all || ranks != 2) return 0;
    const std::size_t l2 = l2_bytes > 0 ? l2_bytes : std::size_t{2} << 20;
    return 8 * l2;
}

COROCOLL_DECL std::chrono::nanoseconds single_copy_cost() noexcept {
    static const std::chrono::nanoseconds cost = corocoll::detail::cheapest_of(32, [] {
        char from[64] = {1};
        char to[64] = {};
        iovec local{to, sizeof(to)};
        iovec remote{from, sizeof(from)};
        return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) ==
               static_cast<ssize_t>(sizeof(from));
    });
    return cost;
}

COROCOLL_DECL mapping create_arena(int ranks, std::size_t set_bytes, std::uint64_t nonce,
                                   std::size_t single_copy_bytes, std::size_t l2_bytes,
                                   fd_guard& memfd) {
    mapping m =
        create_shared("corocoll-arena", shm_arena::bytes_for(ranks, set_bytes), "arena", memfd);
    auto* h = new (m.addr) arena_header;
    h->probe = nonce;
    h->ranks = static_cast<std::uint64_t>(ranks);
    h->set_bytes = set_bytes;
    for (std::size_t u = 0; u < single_copy_uses; ++u) {
        h->single_copy_from[u] =
            single_copy_from_for(static_cast<single_copy_use>(u), ranks, single_copy_bytes,
                                 l2_bytes, single_copy_cost());
        const std::size_t below =
            single_copy_below_for(static_cast<single_copy_use>(u), ranks, single_copy_bytes,
                                  l2_bytes, single_copy_cost());
        // Whole KiB, rounded up (a bound past 4 TiB is none).
        const std::size_t kib = (below + 1023) >> 10;
        h->single_copy_below_kib[u] =
            kib > std::numeric_limits<std::uint32_t>::max() ? 0 : static_cast<std::uint32_t>(kib);
    }
    h->l2_bytes = l2_bytes;
    const std::uint64_t steps = arena_steps_for(ranks);
    for (int k = 0; k < ranks; ++k) {
        std::byte* at = static_cast<std::byte*>(m.addr) + shm_arena::lines_offset(ranks, k);
        auto* places = reinterpret_cast<arena_step_line*>(at);
        for (std::uint64_t j = 0; j < steps; ++j) new (&places[j]) arena_step_line;
        new (at + shm_arena::places_bytes(ranks)) arena_line;
    }
    return m;
}

COROCOLL_DECL mapping map_arena(int fd, const shm_intro& intro, int ranks, std::string& why) {
    mapping m = map_shared(fd, intro.map_bytes, shm_arena::data_offset(ranks), "arena", why);
    if (m.addr == nullptr) return m;
    const auto* h = static_cast<const arena_header*>(m.addr);
    if (h->magic != arena_magic || h->probe != intro.nonce ||
        h->ranks != static_cast<std::uint64_t>(ranks) ||
        shm_arena::bytes_for(ranks, h->set_bytes) != intro.map_bytes) {
        why = "the mapped arena does not hold what rank 0 sent (not the same memory)";
        return {};
    }
    return m;
}

COROCOLL_DECL task<> share_arena(io::reactor& r, rendezvous::store& store, int rank, int size,
                                 const mesh_options& mo, std::size_t arena_bytes,
                                 std::size_t arena_single_copy_bytes,
                                 const std::vector<std::string>* hosts,
                                 std::vector<pair_plan>& plan, std::uint64_t group,
                                 std::unique_ptr<shm_arena>& arena) {
    auto at = [](int p) { return static_cast<std::size_t>(p); };
    bool one_host = hosts != nullptr && arena_bytes > 0;
    bool all_shm = true;
    // Connections on first use: set-up gave segments only to ring neighbours, so the arena goes
    // around the ring (rank 0 to 1, 1 to 2, ...) instead of from rank 0 to every rank.
    bool around = mo.lazy;
    for (int p = 0; p < size; ++p) {
        if (hosts != nullptr && (*hosts)[at(p)] != (*hosts)[0]) one_host = false;
        if (p != rank && !plan[at(p)].shm && !plan[at(p)].deferred) all_shm = false;
    }
    if (!one_host) co_return;
    std::string why;
    mapping map;
    fd_guard memfd;
    shm_intro intro;
    intro.group = group;
    intro.rank = 0;
    int from = around ? rank - 1 : 0;
    if (rank == 0) {
        if (all_shm) {
            intro.nonce = fresh_nonce();
            std::size_t set = (arena_bytes + 4095) & ~std::size_t{4095};
            try {
                map = create_arena(size, set, intro.nonce, arena_single_copy_bytes,
                                   machine_cache_sizes().l2, memfd);
                intro.map_bytes = map.bytes;
            } catch (const std::system_error& e) {
                why = e.what();
            }
        }
    } else if (plan[at(from)].shm) {
        co_await r.poll(plan[at(from)].sock.fd, POLLIN, io::op_options(mo.deadline, mo.stop));
        if (!recv_intro(plan[at(from)].sock.fd, intro, memfd)) {
            why = intro.map_bytes == 0 ? "rank 0 has no arena to share"
                                       : "rank 0's arena came without its descriptor";
            memfd.reset();
            intro = shm_intro{};
            intro.group = group;
        } else if (intro.group != group) {
            why = "rank 0's arena is another group's";
            memfd.reset();
            intro = shm_intro{};
            intro.group = group;
        } else {
            map = map_arena(memfd.fd, intro, size, why);
        }
    } else {
        why = "no shared memory with rank " + std::to_string(from);
    }
    // Passed on: rank 0 to every rank, or each rank to the next around the ring (what it got,
    // or word that there is none, so that nobody waits for it).
    for (int q = around ? rank + 1 : 1; q < size && (around || rank == 0); ++q) {
        if (plan[at(q)].shm) send_intro(plan[at(q)].sock.fd, memfd.fd, intro);
        if (around) break;
    }
    if (map.addr == nullptr || !all_shm) {
        COROCOLL_LOG(info, "INIT", "rank ", rank, ": no shared-memory arena (",
                     !all_shm ? std::string("not every pair shares memory") : why, ")");
        co_return;
    }
    arena = std::make_unique<shm_arena>(map.addr, map.bytes, rank);
    map.addr = nullptr;  // the arena owns it now
    // Whether this rank may read every other's memory (its pairs' probes, process_vm_readv):
    // single copies in the arena need every rank to (counted in "mesh/arena_reads").
    bool reads_all = true;
    for (int p = 0; p < size; ++p) {
        if (p == rank) continue;
        // A pair that connects on first use has no probe yet: the ring neighbours' stand for it.
        if (plan[at(p)].deferred) continue;
        const auto* seg = static_cast<const shm_segment*>(plan[at(p)].map.addr);
        if (seg == nullptr || seg->can_read_peer[p < rank ? 1 : 0].load() == 0) reads_all = false;
    }
    if (reads_all) co_await store.add("mesh/arena_reads", 1);
    co_await store.add("mesh/arena", 1);
}

}  // namespace detail
}  // namespace transport

COROCOLL_END_NAMESPACE
