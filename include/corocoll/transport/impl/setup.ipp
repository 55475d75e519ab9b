// The bodies of the non-template functions declared in <corocoll/transport/setup.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/setup.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {
namespace detail {

// A rank as an index into the per-rank vectors of set-up.
inline std::size_t slot(int p) noexcept { return static_cast<std::size_t>(p); }

// A rank's host identity as the group's topology reads it.
inline std::string host_key(const std::string& boot, const std::string& netns,
                            const std::string& tag) {
    return boot + " " + netns + " " + tag;
}

// This rank's record (phase 2): what it publishes, and the host identity it stands for.
struct own_record {
    transport_choice choice = transport_choice::automatic;
    std::string boot;
    std::string netns;
    std::string tag;
    std::string socket_name = "-";
};

COROCOLL_DECL own_record make_own_record(transport_choice choice, std::string_view host_tag) {
    own_record me;
    me.choice = choice;
    me.boot = boot_id();
    if (me.boot.empty()) me.boot = "-";
    me.netns = netns_id();
    // The tag is one word of the record: blanks would split it.
    me.tag = host_tag.empty() ? "-" : std::string(host_tag);
    for (char& ch : me.tag) {
        if (ch == ' ' || ch == '\t' || ch == '\n') ch = '_';
    }
    return me;
}

// Phase 2: publishes this rank's record and reads every other rank's.
COROCOLL_DECL task<std::vector<shm_peer_info>> exchange_records(rendezvous::store& store, int rank,
                                                                int size, const own_record& me,
                                                                const mesh_options& mo) {
    co_await store.set("mesh/shm/" + std::to_string(rank), std::string(to_string(me.choice)) + " " +
                                                               me.boot + " " + me.socket_name +
                                                               " " + me.netns + " " + me.tag);
    std::vector<std::string> keys;
    for (int p = 0; p < size; ++p) {
        if (p != rank) keys.push_back("mesh/shm/" + std::to_string(p));
    }
    // One store round trip for every record (a multi_get), not one per rank.
    auto records = co_await store.multi_get(
        std::move(keys), std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::max(mo.deadline - std::chrono::steady_clock::now(),
                                      std::chrono::steady_clock::duration{})));
    std::vector<shm_peer_info> info(slot(size));
    for (int p = 0, k = 0; p < size; ++p) {
        if (p == rank) continue;
        std::istringstream in(std::move(records[static_cast<std::size_t>(k++)]));
        std::string choice;
        auto& i = info[slot(p)];
        in >> choice >> i.boot >> i.socket_name >> i.netns >> i.tag;
        i.choice = choice == "shm"   ? transport_choice::shm
                   : choice == "tcp" ? transport_choice::tcp
                                     : transport_choice::automatic;
    }
    co_return info;
}

// Phase 3: which pairs may try shared memory, and why the others may not.
COROCOLL_DECL std::vector<pair_plan> plan_pairs(int rank, int size, const own_record& me,
                                                const std::vector<shm_peer_info>& info) {
    std::vector<pair_plan> plan(slot(size));
    for (int p = 0; p < size; ++p) {
        if (p == rank) continue;
        const auto& i = info[slot(p)];
        auto& pl = plan[slot(p)];
        if (me.choice == transport_choice::tcp || i.choice == transport_choice::tcp) {
            pl.why = "COROCOLL_TRANSPORT=tcp on rank " +
                     std::to_string(me.choice == transport_choice::tcp ? rank : p);
        } else if (me.boot == "-" || i.boot != me.boot) {
            pl.why = "another host (boot ids differ)";
        } else if (i.tag != me.tag) {
            pl.why = "another host (host tags differ: " + me.tag + " and " + i.tag + ")";
        } else {
            pl.candidate = true;
        }
    }
    return plan;
}

// A verdict that did not go or come (phases 4 and 5): the peer went away, or the deadline
// passed; the error names both ranks and the step.
inline std::system_error verdict_error(const std::system_error& e, int rank, int peer,
                                       const char* doing) {
    return std::system_error(e.code(), "corocoll: init: rank " + std::to_string(rank) + " " +
                                           doing + " rank " + std::to_string(peer) + ": " +
                                           corocoll::detail::context_of(e));
}

// Phase 4, the lower side: offers a segment to every higher candidate, then tells each its
// verdict over their TCP socket.
COROCOLL_DECL task<> offer_segments(io::reactor& r, std::vector<io::socket>& socks, int rank,
                                    int size, const std::vector<shm_peer_info>& info,
                                    std::vector<pair_plan>& plan, std::size_t ring,
                                    std::uint64_t group, const mesh_options& mo) {
    for (int q = rank + 1; q < size; ++q) {
        auto& pl = plan[slot(q)];
        shm_verdict v;
        if (pl.candidate && !pl.deferred) {
            auto o = co_await offer_segment(r, info[slot(q)].socket_name, ring, group, rank,
                                            mo.deadline);
            v = o.verdict;
            pl.nonce = v.nonce;
            pl.map = std::move(o.map);
            pl.sock = std::move(o.sock);
            pl.why = std::move(o.why);
        }
        // Connections on first use: only candidates are connected at set-up.
        if (!socks[slot(q)].is_open()) continue;
        try {
            co_await socks[slot(q)].send(std::as_bytes(std::span(&v, 1)), mo.deadline);
        } catch (const std::system_error& e) {
            throw verdict_error(e, rank, q, "sending its shared-memory verdict to");
        }
    }
}

// Phase 5, the higher side: reads each lower rank's verdict; returns how many offered.
COROCOLL_DECL task<int> read_verdicts(std::vector<io::socket>& socks, int rank,
                                      std::vector<pair_plan>& plan, const mesh_options& mo) {
    int count = 0;
    for (int p = 0; p < rank; ++p) {
        if (!socks[slot(p)].is_open()) continue;  // connects on first use, no candidate
        shm_verdict v;
        try {
            co_await socks[slot(p)].recv(std::as_writable_bytes(std::span(&v, 1)), mo.deadline);
        } catch (const std::system_error& e) {
            throw verdict_error(e, rank, p, "reading the shared-memory verdict of");
        }
        if (v.magic != shm_verdict{}.magic) {
            corocoll::detail::throw_error(
                corocoll::errc::protocol_error,
                "corocoll: init: rank " + std::to_string(p) + " sent no channel verdict");
        }
        auto& pl = plan[slot(p)];
        if (v.offered == offered) {
            pl.nonce = v.nonce;
            pl.candidate = true;
            ++count;
        } else if (pl.candidate) {
            pl.candidate = false;
            pl.why = verdict_text(v.offered, p);
        }
    }
    co_return count;
}

// Phase 5, the higher side: accepts the `count` segments offered on this rank's unix socket,
// maps each one whose nonce is right, and answers.
COROCOLL_DECL task<> take_segments(io::reactor& r, fd_guard& listener, int rank, int count,
                                   std::vector<pair_plan>& plan, std::uint64_t group,
                                   const mesh_options& mo) {
    while (count > 0) {
        try {
            co_await r.poll(listener.fd, POLLIN, io::op_options(mo.deadline, mo.stop));
        } catch (const std::system_error& e) {
            corocoll::detail::throw_error(
                e.code(), "corocoll: init: rank " + std::to_string(rank) + " waited for " +
                              std::to_string(count) +
                              " shared-memory segment(s) from lower ranks: " +
                              corocoll::detail::context_of(e));
        }
        fd_guard conn(::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (conn.fd < 0) continue;
        // A rank sends its intro as it connects: a connection that says nothing for a few
        // seconds is a stray, dropped without stalling set-up.
        try {
            co_await r.poll(
                conn.fd, POLLIN,
                io::op_options(std::min(mo.deadline, io::deadline_after(std::chrono::seconds(5)))));
        } catch (const std::system_error&) {
            COROCOLL_LOG(warn, "INIT", "rank ", rank,
                         " drops a connection to its unix socket that sent nothing");
            continue;
        }
        shm_intro intro;
        fd_guard memfd;
        bool ok = recv_intro(conn.fd, intro, memfd);
        auto p = static_cast<int>(intro.rank);
        if (!ok || intro.group != group || p < 0 || p >= rank || !plan[slot(p)].candidate ||
            plan[slot(p)].sock.fd >= 0 || intro.nonce != plan[slot(p)].nonce) {
            COROCOLL_LOG(warn, "INIT", "rank ", rank,
                         " drops a stray connection to its unix socket");
            continue;
        }
        auto& pl = plan[slot(p)];
        shm_reply reply = take_offered(memfd.fd, intro, pl.nonce, pl.map, pl.why);
        pl.sock = std::move(conn);
        if (!co_await unix_exchange(r, pl.sock.fd, &reply, sizeof(reply), true, mo.deadline)) {
            pl.map.reset();
            if (pl.why.empty()) pl.why = "rank " + std::to_string(p) + " left during set-up";
        }
        pl.shm = pl.map.addr != nullptr;
        --count;
    }
}

// Phase 6, the lower side: the higher ranks' answers.
COROCOLL_DECL task<> read_answers(io::reactor& r, int rank, int size, std::vector<pair_plan>& plan,
                                  const mesh_options& mo) {
    for (int q = rank + 1; q < size; ++q) {
        auto& pl = plan[slot(q)];
        if (pl.sock.fd < 0) continue;
        shm_reply reply;
        if (!co_await unix_exchange(r, pl.sock.fd, &reply, sizeof(reply), false, mo.deadline) ||
            reply.mapped != 1) {
            pl.why = "rank " + std::to_string(q) + " could not map the segment";
            pl.map.reset();
            continue;
        }
        auto* seg = static_cast<shm_segment*>(pl.map.addr);
        seg->can_read_peer[0].store(can_read(seg->pid[1], reply.address, pl.nonce) ? 1 : 0);
        pl.shm = true;
    }
}

// Phase 8: one channel per pair, as planned.
COROCOLL_DECL std::vector<std::unique_ptr<channel>> make_channels(
    io::reactor& r, std::vector<io::socket>& socks, int rank, int size, transport_choice mine,
    const std::vector<shm_peer_info>& info, std::vector<pair_plan>& plan, const engine_options& o) {
    std::vector<std::unique_ptr<channel>> out(slot(size));
    for (int p = 0; p < size; ++p) {
        if (p == rank) continue;
        auto& pl = plan[slot(p)];
        std::string pair = "rank " + std::to_string(rank) + " - rank " + std::to_string(p);
        if (pl.deferred) {
            COROCOLL_LOG(info, "INIT", pair, ": on first use (shm tried then)");
            continue;
        }
        if (!pl.shm) {
            if (mine == transport_choice::shm || info[slot(p)].choice == transport_choice::shm) {
                if (pl.why.empty()) pl.why = "the segment could not be shared";
                corocoll::detail::throw_error(
                    std::make_error_code(std::errc::operation_not_supported),
                    "corocoll: init: " + pair +
                        " cannot use shared memory, which COROCOLL_TRANSPORT=shm asks for: " +
                        pl.why);
            }
            if (!socks[slot(p)].is_open()) {
                COROCOLL_LOG(info, "INIT", pair, ": tcp on first use (", pl.why, ")");
                continue;
            }
            COROCOLL_LOG(info, "INIT", pair, ": tcp (", pl.why, ")");
            out[slot(p)] = tcp_channel::make(std::move(socks[slot(p)]), o.same_host_send_buffer);
            continue;
        }
        int side = p < rank ? 1 : 0;
        auto* seg = static_cast<shm_segment*>(pl.map.addr);
        // The creator has both probes' results; single copies need the reader to see the
        // writer's memory.
        std::string copies;
        if (o.shm_single_copy_bytes == 0) {
            copies = "; single copies off";
        } else if (side == 0) {
            bool in = seg->can_read_peer[0].load() != 0, out = seg->can_read_peer[1].load() != 0;
            copies = in && out ? "; single copies both ways"
                     : in      ? "; single copies only to this rank"
                     : out     ? "; single copies only from this rank"
                               : "; no single copies (process_vm_readv refused)";
        }
        socks[slot(p)].close();
        auto ch = std::make_unique<shm_channel>(r, side, pl.map.addr, pl.map.bytes,
                                                pl.sock.release(), o.shm_single_copy_bytes,
                                                o.shm_futex_wait, o.shm_publish_without_fence);
        COROCOLL_LOG(info, "INIT", pair, ": shm (same boot id, one segment mapped by both", copies,
                     "; sleeps on a ", ch->sleeps_on(), ")");
        out[slot(p)] = std::move(ch);
        pl.map.addr = nullptr;  // the channel owns it now
    }
    return out;
}

}  // namespace detail

COROCOLL_DECL task<std::vector<std::unique_ptr<channel>>> connect_channels(
    io::reactor& r, rendezvous::store& store, int rank, int size, mesh_options mo, engine_options o,
    std::vector<std::string>* hosts, std::unique_ptr<shm_arena>* arena,
    std::unique_ptr<lazy_mesh>* lazy) {
    using detail::slot;
    connect_mode mode = o.connect ? *o.connect : connect_from_env();
    mo.lazy = mode == connect_mode::lazy && lazy != nullptr && size > 1;
    std::vector<io::socket> socks;
    // Connections on first use: set-up publishes where this rank listens and connects only the
    // pairs that may share memory (their set-up runs over the connection); the rest dial when
    // they first send.
    io::acceptor tcp_listener;
    std::string here;
    if (!mo.lazy) {
        socks = co_await connect_mesh(r, store, rank, size, mo);
    } else {
        detail::require_token_auth(rank, mo);
        tcp_listener = io::acceptor::listen(r, mo.listen_on);
        here = tcp_listener.local_endpoint().to_string();
        co_await store.set("mesh/addr/" + std::to_string(rank), here);
        COROCOLL_LOG(info, "INIT", "rank ", rank, "/", size, " listening on ", here,
                     " (connections open on first use)");
        // At set-up: this rank's two neighbours on the ring of ranks, first (before anything
        // else waits on the store, so that a peer set up to connect eagerly is told apart in the
        // handshake). Through the ring every failure reaches every rank (a rank that dies is
        // seen by its neighbours, whose abort notices travel on around it), whatever the
        // program has connected since.
        std::vector<bool> ring(slot(size));
        ring[slot((rank + 1) % size)] = true;
        ring[slot((rank + size - 1) % size)] = true;
        socks = co_await connect_pairs(r, store, rank, size, mo, tcp_listener, here, ring);
    }
    // COROCOLL_TRANSPORT is read only when the options leave the choice to it: a value set in
    // code wins, and a bad variable is then not an error.
    transport_choice choice = o.transport ? *o.transport : transport_from_env();
    detail::own_record me = detail::make_own_record(choice, o.host_tag.view());
    if (hosts != nullptr) hosts->assign(slot(size), std::string{});
    if (hosts != nullptr) (*hosts)[slot(rank)] = detail::host_key(me.boot, me.netns, me.tag);
    if (size == 1) co_return std::vector<std::unique_ptr<channel>>(1);

    std::size_t ring = o.shm_ring_bytes;
    if (ring < (std::size_t{64} << 10) || (ring & (ring - 1)) != 0) {
        throw std::invalid_argument("corocoll: init: shm_ring_bytes " + std::to_string(ring) +
                                    " is not a power of two of at least 64 KiB");
    }
    detail::fd_guard listener;
    if (me.choice != transport_choice::tcp)
        listener = detail::listen_abstract(size, me.socket_name);
    auto info = co_await detail::exchange_records(store, rank, size, me, mo);
    if (hosts != nullptr) {
        for (int p = 0; p < size; ++p) {
            const auto& i = info[slot(p)];
            if (p != rank) (*hosts)[slot(p)] = detail::host_key(i.boot, i.netns, i.tag);
        }
    }
    auto plan = detail::plan_pairs(rank, size, me, info);
    // Connections on first use: a pair on this host that set-up did not connect gets its
    // segment when it connects (shm/first_use.hpp), so shared memory grows with the pairs that
    // talk.
    bool deferred_any = false;
    for (int p = 0; p < size; ++p) {
        auto& pl = plan[slot(p)];
        pl.deferred = mo.lazy && pl.candidate && !socks[slot(p)].is_open();
        deferred_any = deferred_any || pl.deferred;
    }
    std::uint64_t group = hash64(mo.group_name);
    co_await detail::offer_segments(r, socks, rank, size, info, plan, ring, group, mo);
    int offered = co_await detail::read_verdicts(socks, rank, plan, mo);
    co_await detail::take_segments(r, listener, rank, offered, plan, group, mo);
    co_await detail::read_answers(r, rank, size, plan, mo);
    if (arena != nullptr) {
        co_await detail::share_arena(r, store, rank, size, mo, o.shm_arena_bytes,
                                     o.shm_arena_single_copy_bytes, hosts, plan, group, *arena);
        if (*arena) (*arena)->sleep_on_futex(o.shm_futex_wait);
    }
    auto channels = detail::make_channels(r, socks, rank, size, me.choice, info, plan, o);
    std::unique_ptr<detail::first_use_shm> later;
    if (deferred_any) {
        detail::first_use_shm_options so;
        so.ring_bytes = ring;
        so.single_copy_bytes = o.shm_single_copy_bytes;
        so.futex_wait = o.shm_futex_wait;
        so.publish_without_fence = o.shm_publish_without_fence;
        so.group = group;
        so.mine = me.choice;
        std::vector<bool> deferred(slot(size));
        for (int p = 0; p < size; ++p) deferred[slot(p)] = plan[slot(p)].deferred;
        later = std::make_unique<detail::first_use_shm>(r, rank, so, std::move(info),
                                                        std::move(deferred), std::move(listener));
    } else {
        listener.reset();
    }
    if (mo.lazy) {
        // Where the others listen, in one store round trip: read now, while set-up's keys are
        // in the store.
        std::vector<std::string> keys;
        for (int p = 0; p < size; ++p) {
            if (p != rank && !channels[slot(p)]) keys.push_back("mesh/addr/" + std::to_string(p));
        }
        std::vector<std::string> found;
        if (!keys.empty()) {
            found = co_await store.multi_get(
                std::move(keys), std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::max(mo.deadline - std::chrono::steady_clock::now(),
                                              std::chrono::steady_clock::duration{})));
        }
        std::vector<std::string> addresses(slot(size));
        for (int p = 0, k = 0; p < size; ++p) {
            if (p != rank && !channels[slot(p)]) addresses[slot(p)] = std::move(found[slot(k++)]);
        }
        *lazy = std::make_unique<lazy_mesh>(r, rank, size, mo, std::move(tcp_listener), here,
                                            std::move(addresses), o.same_host_send_buffer);
        if (later) (*lazy)->share_memory(std::move(later));
    }
    co_return channels;
}

}  // namespace transport

COROCOLL_END_NAMESPACE
