#pragma once

#include <corocoll/core/error.hpp>
#include <corocoll/core/log.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/core/when_all.hpp>
#include <corocoll/io/endpoint.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/io/socket.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/transport/frame.hpp>
#include <corocoll/version.hpp>

#include <ifaddrs.h>
#include <net/if.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// How a rank joins the mesh of connections of its group.
struct mesh_options {
    /// Everything (listening, publishing, connecting, handshakes) must finish by then.
    std::chrono::steady_clock::time_point deadline;
    /// The group's name; peers of different groups refuse each other.
    std::string group_name = "default";
    /// A shared secret every connection must present (COROCOLL_JOB_TOKEN); empty: none.
    std::string job_token;
    /// Where this rank listens (port 0: an ephemeral port). See `choose_listen_address`.
    io::endpoint listen_on = io::endpoint::loopback(0);
};

/// The address this rank listens on for its peers: the first IPv4 (else IPv6) address of the
/// interface named by COROCOLL_SOCKET_IFNAME (or GLOO_SOCKET_IFNAME); otherwise the local
/// address this host uses to reach `master` (found by connecting a UDP socket, which sends
/// nothing); loopback when `master` is loopback or unknown. Port 0.
inline io::endpoint choose_listen_address(const std::optional<io::endpoint>& master) {
    const char* ifname = std::getenv("COROCOLL_SOCKET_IFNAME");
    if (ifname == nullptr) ifname = std::getenv("GLOO_SOCKET_IFNAME");
    if (ifname != nullptr) {
        ifaddrs* list = nullptr;
        if (::getifaddrs(&list) != 0) corocoll::detail::throw_errno(errno, "corocoll: getifaddrs");
        std::optional<io::endpoint> v4, v6;
        for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
            if (a->ifa_addr == nullptr || std::string(a->ifa_name) != ifname) continue;
            if (a->ifa_addr->sa_family == AF_INET && !v4) {
                v4 = io::endpoint(a->ifa_addr, sizeof(sockaddr_in));
            } else if (a->ifa_addr->sa_family == AF_INET6 && !v6) {
                v6 = io::endpoint(a->ifa_addr, sizeof(sockaddr_in6));
            }
        }
        ::freeifaddrs(list);
        if (v4) return io::endpoint::from_numeric(v4->host(), 0);
        if (v6) return io::endpoint::from_numeric(v6->host(), 0);
        throw std::invalid_argument(std::string("corocoll: socket interface '") + ifname +
                                    "' (COROCOLL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME) has no "
                                    "IP address");
    }
    if (!master) return io::endpoint::loopback(0);
    std::string host = master->host();
    if (host.rfind("127.", 0) == 0 || host == "::1") return io::endpoint::from_numeric(host, 0);
    int fd = ::socket(master->family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        io::endpoint local;
        socklen_t len = io::endpoint::capacity();
        bool ok = ::connect(fd, master->data(), master->size()) == 0 &&
                  ::getsockname(fd, local.data(), &len) == 0;
        ::close(fd);
        if (ok) {
            local.resize(len);
            return io::endpoint::from_numeric(local.host(), 0);
        }
    }
    return io::endpoint::loopback(0);
}

namespace detail {

inline frame_header make_hello(int rank, int peer, int size, const mesh_options& o) {
    frame_header h;
    h.kind = frame_kind::hello;
    h.src = static_cast<std::uint32_t>(rank);
    h.dst = static_cast<std::uint32_t>(peer);
    h.count = static_cast<std::uint64_t>(size);
    h.seq = hash64(o.group_name);
    h.length = o.job_token.size();
    h.seal();
    return h;
}

inline task<> send_hello(io::socket& s, int rank, int peer, int size, const mesh_options& o) {
    frame_header h = make_hello(rank, peer, size, o);
    co_await s.send(std::as_bytes(std::span(&h, 1)), o.deadline);
    co_await s.send(std::as_bytes(std::span(o.job_token.data(), o.job_token.size())), o.deadline);
}

// Reads a hello and checks it against what this rank expects; returns the peer's rank.
// `expected_peer` < 0: any rank (accepting side).
inline task<int> read_hello(io::socket& s, int rank, int size, int expected_peer,
                            const mesh_options& o) {
    frame_header h;
    co_await s.recv(std::as_writable_bytes(std::span(&h, 1)), o.deadline);
    std::string from = "connection from " + s.peer().to_string();
    if (std::string p = h.problem(4096); !p.empty() || h.kind != frame_kind::hello) {
        corocoll::detail::throw_error(
            corocoll::errc::protocol_error,
            "corocoll: init: " + from + ": " + (p.empty() ? "first frame is not a hello" : p));
    }
    std::string token(h.length, '\0');
    co_await s.recv(std::as_writable_bytes(std::span(token.data(), token.size())), o.deadline);
    auto peer = static_cast<int>(h.src);
    std::string who = from + " (rank " + std::to_string(peer) + ")";
    if (h.seq != hash64(o.group_name)) {
        corocoll::detail::throw_error(
            corocoll::errc::protocol_error,
            "corocoll: init: " + who + " belongs to another group than '" + o.group_name + "'");
    }
    if (h.count != static_cast<std::uint64_t>(size)) {
        corocoll::detail::throw_error(
            corocoll::errc::protocol_error,
            "corocoll: init: " + who + " has world size " + std::to_string(h.count) + ", rank " +
                std::to_string(rank) + " has world size " + std::to_string(size));
    }
    if (h.dst != static_cast<std::uint32_t>(rank) || peer < 0 || peer >= size || peer == rank ||
        (expected_peer >= 0 && peer != expected_peer)) {
        corocoll::detail::throw_error(
            corocoll::errc::protocol_error,
            "corocoll: init: " + who + " says it is rank " + std::to_string(peer) +
                " calling rank " + std::to_string(h.dst) + "; this is rank " +
                std::to_string(rank) +
                (expected_peer >= 0 ? " expecting rank " + std::to_string(expected_peer) : ""));
    }
    if (!constant_time_equal(token, o.job_token)) {
        corocoll::detail::throw_error(
            std::make_error_code(std::errc::permission_denied),
            "corocoll: init: " + who + " did not present this job's token (COROCOLL_JOB_TOKEN)");
    }
    co_return peer;
}

inline std::string remaining_ms(std::chrono::steady_clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    return std::to_string(std::max<long long>(left.count(), 0)) + " ms";
}

// Connects to lower rank `peer`, retrying with backoff and jitter until the deadline.
inline task<io::socket> connect_to(io::reactor& r, rendezvous::store& store, int rank, int peer,
                                   int size, const mesh_options& o, std::stop_token stop) {
    auto now = std::chrono::steady_clock::now();
    std::vector<std::string> key{"mesh/addr/" + std::to_string(peer)};
    co_await store.wait(key, std::chrono::duration_cast<std::chrono::milliseconds>(std::max(
                                 o.deadline - now, std::chrono::steady_clock::duration{})));
    io::endpoint where = io::endpoint::parse(co_await store.get(key[0]));
    std::minstd_rand jitter(static_cast<unsigned>(rank * 7919 + peer));
    auto backoff = std::chrono::milliseconds(5);
    for (;;) {
        try {
            io::socket s = co_await io::socket::connect(r, where, io::op_options(o.deadline, stop));
            co_await send_hello(s, rank, peer, size, o);
            co_await read_hello(s, rank, size, peer, o);
            COROCOLL_LOG(trace, "INIT", "connected to rank ", peer, " at ", where.to_string());
            co_return s;
        } catch (const std::system_error& e) {
            bool retry = e.code() == std::errc::connection_refused ||
                         e.code() == std::errc::connection_reset ||
                         e.code() == corocoll::errc::connection_closed;
            if (!retry || stop.stop_requested() || std::chrono::steady_clock::now() >= o.deadline) {
                corocoll::detail::throw_error(
                    e.code(), "corocoll: init: rank " + std::to_string(rank) +
                                  " connecting to rank " + std::to_string(peer) + " at " +
                                  where.to_string() + ": " + corocoll::detail::context_of(e));
            }
        }
        auto sleep = backoff + std::chrono::milliseconds(jitter() % (backoff.count() + 1));
        co_await r.sleep_until(std::min(std::chrono::steady_clock::now() + sleep, o.deadline),
                               stop);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    }
}

}  // namespace detail

/// Builds the full mesh of TCP connections of a group: rank `rank` listens on
/// `o.listen_on`, publishes host:port under "mesh/addr/<rank>" in `store` (give each group
/// its own prefix store), connects to every lower rank (retrying with backoff and jitter
/// while they start) and accepts every higher one. Each connection starts with a hello each
/// way that checks group, ranks, world size, protocol version and the job token; a
/// connection whose first frame is not a hello is dropped, one that is but disagrees is an
/// error naming both sides. Everything is bounded by `o.deadline`. Returns one socket per
/// rank, indexed by rank (the own entry stays closed).
inline task<std::vector<io::socket>> connect_mesh(io::reactor& r, rendezvous::store& store,
                                                  int rank, int size, mesh_options o) {
    std::vector<io::socket> peers(static_cast<std::size_t>(size));
    if (size == 1) co_return peers;
    io::acceptor listener = io::acceptor::listen(r, o.listen_on);
    co_await store.set("mesh/addr/" + std::to_string(rank), listener.local_endpoint().to_string());
    COROCOLL_LOG(info, "INIT", "rank ", rank, "/", size, " listening on ",
                 listener.local_endpoint().to_string());

    // When one side fails, the other stops waiting instead of running into the deadline.
    std::stop_source stop;
    auto accept_all = [&]() -> task<> {
        int missing = size - 1 - rank;
        while (missing > 0) {
            io::socket s;
            try {
                s = co_await listener.accept(io::op_options(o.deadline, stop.get_token()));
            } catch (const std::system_error& e) {
                corocoll::detail::throw_error(
                    e.code(), "corocoll: init: rank " + std::to_string(rank) + " waited " + "for " +
                                  std::to_string(missing) +
                                  " higher rank(s) to connect: " + corocoll::detail::context_of(e));
            }
            int peer = -1;
            try {
                peer = co_await detail::read_hello(s, rank, size, -1, o);
            } catch (const std::system_error& e) {
                if (e.code() == corocoll::errc::protocol_error &&
                    std::string(e.what()).find("bad magic") != std::string::npos) {
                    COROCOLL_LOG(warn, "INIT", "dropping a stray connection: ", e.what());
                    continue;
                }
                throw;
            }
            if (peer < rank || peers[static_cast<std::size_t>(peer)].is_open()) {
                corocoll::detail::throw_error(
                    corocoll::errc::protocol_error,
                    "corocoll: init: rank " + std::to_string(rank) + " got a second or " +
                        "unexpected connection from rank " + std::to_string(peer));
            }
            co_await detail::send_hello(s, rank, peer, size, o);
            peers[static_cast<std::size_t>(peer)] = std::move(s);
            --missing;
        }
    };
    auto connect_all = [&]() -> task<> {
        std::vector<task<io::socket>> lower;
        for (int p = 0; p < rank; ++p) {
            lower.push_back(detail::connect_to(r, store, rank, p, size, o, stop.get_token()));
        }
        auto socks = co_await when_all(std::move(lower));
        for (int p = 0; p < rank; ++p) peers[static_cast<std::size_t>(p)] = std::move(socks[p]);
    };
    auto stopping = [&](task<> t) -> task<> {
        try {
            co_await std::move(t);
        } catch (...) {
            stop.request_stop();
            throw;
        }
    };
    co_await when_all(stopping(accept_all()), stopping(connect_all()));
    co_return peers;
}

}  // namespace transport

COROCOLL_END_NAMESPACE
