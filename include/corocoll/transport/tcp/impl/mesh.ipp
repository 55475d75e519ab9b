// The bodies of the non-template functions declared in <corocoll/transport/tcp/mesh.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/tcp/mesh.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

COROCOLL_DECL io::endpoint choose_listen_address(const std::optional<io::endpoint>& master) {
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

}  // namespace transport

namespace transport {
namespace detail {

COROCOLL_DECL void require_token_auth(int rank, const mesh_options& o) {
    if (!o.job_token.empty() && !corocoll::detail::token_auth_available()) {
        // Where set-up did not read the environment (a group built on a given store).
        throw std::invalid_argument("corocoll: init: rank " + std::to_string(rank) + ": " +
                                    corocoll::detail::no_token_auth);
    }
}

COROCOLL_DECL frame_header make_hello(int rank, int peer, int size, const mesh_options& o,
                                      std::size_t follows) {
    frame_header h;
    h.kind = frame_kind::hello;
    h.src = static_cast<std::uint32_t>(rank);
    h.dst = static_cast<std::uint32_t>(peer);
    h.count = static_cast<std::uint64_t>(size);
    h.seq = hash64(o.group_name);
    h.tag = (o.job_token.empty() ? 0 : 1) | (o.lazy ? 2 : 0);
    h.length = follows;
    h.seal();
    return h;
}

COROCOLL_DECL std::string hello_problem(const frame_header& h, int rank, int size,
                                        int expected_peer, const mesh_options& o,
                                        std::size_t follows) {
    if (std::string p = h.problem(4096); !p.empty()) return p;
    if (h.kind != frame_kind::hello) return "the first frame is not a hello";
    std::string who = "rank " + std::to_string(h.src);
    if (h.seq != hash64(o.group_name))
        return who + " belongs to another group than '" + o.group_name + "'";
    if (h.count != static_cast<std::uint64_t>(size)) {
        return who + " has world size " + std::to_string(h.count) + ", rank " +
               std::to_string(rank) + " has world size " + std::to_string(size);
    }
    auto peer = static_cast<std::int64_t>(h.src);
    if (h.dst != static_cast<std::uint32_t>(rank) || peer >= size || peer == rank ||
        (expected_peer >= 0 && peer != expected_peer)) {
        return "it says it is rank " + std::to_string(peer) + " calling rank " +
               std::to_string(h.dst) + "; this is rank " + std::to_string(rank) +
               (expected_peer >= 0 ? " expecting rank " + std::to_string(expected_peer) : "");
    }
    if (((h.tag & 2) != 0) != o.lazy) {
        return (h.tag & 2) != 0
                   ? who + " opens connections on first use (COROCOLL_CONNECT=lazy), rank " +
                         std::to_string(rank) + " at set-up"
                   : "rank " + std::to_string(rank) +
                         " opens connections on first use (COROCOLL_CONNECT=lazy), " + who +
                         " at set-up";
    }
    if (((h.tag & 1) != 0) != !o.job_token.empty()) {
        return (h.tag & 1) != 0
                   ? who + " has COROCOLL_JOB_TOKEN set, rank " + std::to_string(rank) + " has not"
                   : "rank " + std::to_string(rank) + " has COROCOLL_JOB_TOKEN set, " + who +
                         " has not";
    }
    if (h.length != follows) return "a hello of " + std::to_string(h.length) + " bytes";
    return {};
}

COROCOLL_DECL corocoll::detail::auth_proof mesh_proof(
    const mesh_options& o, std::string_view role, int connector, int listener,
    const std::string& listener_address, const corocoll::detail::auth_nonce& connector_nonce,
    const corocoll::detail::auth_nonce& listener_nonce) {
    std::string m = "corocoll mesh 1\n" + std::string(role) + "\n" + o.group_name + "\n" +
                    std::to_string(connector) + "\n" + std::to_string(listener) + "\n" +
                    listener_address + "\n";
    m.append(reinterpret_cast<const char*>(connector_nonce.data()), connector_nonce.size());
    m.append(reinterpret_cast<const char*>(listener_nonce.data()), listener_nonce.size());
    return corocoll::detail::hmac_sha256(o.job_token, m);
}

COROCOLL_DECL task<> connector_handshake(io::socket& s, int rank, int peer, int size,
                                         const mesh_options& o, const std::string& where,
                                         std::stop_token stop) {
    io::op_options by(hello_deadline(o), stop);
    bool auth = !o.job_token.empty();
    corocoll::detail::auth_nonce mine = corocoll::detail::auth_random_nonce(), theirs{};
    frame_header h = make_hello(rank, peer, size, o, corocoll::detail::nonce_bytes);
    co_await s.send(bytes_of(h), by);
    co_await s.send(mine, by);
    frame_header r;
    co_await s.recv(bytes_of(r), by);
    if (std::string p = hello_problem(
            r, rank, size, peer, o,
            corocoll::detail::nonce_bytes + (auth ? corocoll::detail::proof_bytes : 0));
        !p.empty()) {
        corocoll::detail::throw_error(corocoll::errc::protocol_error,
                                      "the listener answered with a bad hello: " + p);
    }
    co_await s.recv(theirs, by);
    if (!auth) co_return;
    corocoll::detail::auth_proof claimed{};
    co_await s.recv(claimed, by);
    if (!corocoll::detail::same_proof(claimed,
                                      mesh_proof(o, "listener", rank, peer, where, mine, theirs))) {
        corocoll::detail::throw_error(
            std::make_error_code(std::errc::permission_denied),
            "the listener did not prove it knows this job's token (COROCOLL_JOB_TOKEN): its "
            "token differs, or it is not rank " +
                std::to_string(peer) +
                " (was the address in the store forged?); nothing that depends on the token "
                "was sent to it");
    }
    corocoll::detail::auth_proof own = mesh_proof(o, "connector", rank, peer, where, mine, theirs);
    co_await s.send(own, by);
}

COROCOLL_DECL task<int> listener_handshake(io::socket& s, int rank, int size, const mesh_options& o,
                                           const std::string& here, std::stop_token stop) {
    io::op_options by(hello_deadline(o), stop);
    bool auth = !o.job_token.empty();
    frame_header h;
    co_await s.recv(bytes_of(h), by);
    if (std::string p = hello_problem(h, rank, size, -1, o, corocoll::detail::nonce_bytes);
        !p.empty()) {
        corocoll::detail::throw_error(corocoll::errc::protocol_error, p);
    }
    auto peer = static_cast<int>(h.src);
    corocoll::detail::auth_nonce theirs{}, mine = corocoll::detail::auth_random_nonce();
    co_await s.recv(theirs, by);
    frame_header r =
        make_hello(rank, peer, size, o,
                   corocoll::detail::nonce_bytes + (auth ? corocoll::detail::proof_bytes : 0));
    co_await s.send(bytes_of(r), by);
    co_await s.send(mine, by);
    if (!auth) co_return peer;
    corocoll::detail::auth_proof own = mesh_proof(o, "listener", peer, rank, here, theirs, mine);
    co_await s.send(own, by);
    corocoll::detail::auth_proof claimed{};
    try {
        co_await s.recv(claimed, by);
    } catch (const std::system_error& e) {
        corocoll::detail::throw_error(
            e.code(), "rank " + std::to_string(peer) +
                          " (so it said) did not prove it knows this job's token; it refused "
                          "this rank's proof (its COROCOLL_JOB_TOKEN differs?): " +
                          corocoll::detail::context_of(e));
    }
    if (!corocoll::detail::same_proof(claimed,
                                      mesh_proof(o, "connector", peer, rank, here, theirs, mine))) {
        corocoll::detail::throw_error(std::make_error_code(std::errc::permission_denied),
                                      "rank " + std::to_string(peer) +
                                          " (so it said) did not prove it knows this job's "
                                          "token (COROCOLL_JOB_TOKEN)");
    }
    co_return peer;
}

COROCOLL_DECL task<io::socket> connect_to(io::reactor& r, std::string address, int rank, int peer,
                                          int size, const mesh_options& o, std::stop_token stop) {
    io::endpoint where = io::endpoint::parse(address);
    std::minstd_rand jitter(static_cast<unsigned>(rank * 7919 + peer));
    auto backoff = std::chrono::milliseconds(5);
    for (;;) {
        try {
            io::socket s = co_await io::socket::connect(r, where, io::op_options(o.deadline, stop));
            co_await connector_handshake(s, rank, peer, size, o, address, stop);
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
}  // namespace transport

namespace transport {

COROCOLL_DECL task<std::vector<io::socket>> connect_mesh(io::reactor& r, rendezvous::store& store,
                                                         int rank, int size, mesh_options o) {
    if (size == 1) co_return std::vector<io::socket>(1);
    detail::require_token_auth(rank, o);
    io::acceptor listener = io::acceptor::listen(r, o.listen_on);
    const std::string here = listener.local_endpoint().to_string();
    co_await store.set("mesh/addr/" + std::to_string(rank), here);
    COROCOLL_LOG(info, "INIT", "rank ", rank, "/", size, " listening on ", here);
    std::vector<bool> everyone(static_cast<std::size_t>(size), true);
    co_return co_await connect_pairs(r, store, rank, size, std::move(o), listener, here, everyone);
}

COROCOLL_DECL task<std::vector<io::socket>> connect_pairs(io::reactor& r, rendezvous::store& store,
                                                          int rank, int size, mesh_options o,
                                                          io::acceptor& listener,
                                                          const std::string& here,
                                                          const std::vector<bool>& wanted) {
    std::vector<io::socket> peers(static_cast<std::size_t>(size));
    auto want = [&](int p) { return p != rank && wanted[static_cast<std::size_t>(p)]; };
    // When one side fails, the other stops waiting instead of running into the deadline.
    std::stop_source stop;
    // Ends the accept loop and handshakes in flight: every higher rank came, or set-up failed.
    std::stop_source accepting;
    std::stop_callback forward(stop.get_token(), [&accepting] { accepting.request_stop(); });
    std::stop_callback from_caller(o.stop, [&stop] { stop.request_stop(); });
    int missing = 0;
    for (int p = rank + 1; p < size; ++p) missing += want(p) ? 1 : 0;
    std::string last_refusal;
    bool refusal_said_something = false;
    auto handshake = [&](io::socket s) -> task<> {
        std::string from = s.peer().to_string();
        try {
            int peer =
                co_await detail::listener_handshake(s, rank, size, o, here, accepting.get_token());
            if (peer < rank || !want(peer) || peers[static_cast<std::size_t>(peer)].is_open()) {
                COROCOLL_LOG(warn, "INIT", "rank ", rank, " dropped a connection from ", from,
                             ": rank ", peer, " is connected already, is lower, or connects later");
                co_return;
            }
            peers[static_cast<std::size_t>(peer)] = std::move(s);
            if (--missing == 0) accepting.request_stop();
        } catch (const std::exception& e) {
            if (accepting.stop_requested()) co_return;
            std::string refusal = "connection from " + from + ": " + e.what();
            COROCOLL_LOG(warn, "INIT", "rank ", rank, " dropped a connection: ", refusal);
            // A connection that said something wrong (a hello of another group or mode, a
            // proof that failed) tells more than one that said nothing before the deadline or
            // went: the error at the deadline names the last of the first kind, if any. (A
            // peer refused for its mode dials again and again; its last dial, as set-up ends,
            // would otherwise hide why.)
            const auto* se = dynamic_cast<const std::system_error*>(&e);
            bool said_something =
                se == nullptr ||
                (se->code() != std::errc::timed_out && se->code() != std::errc::connection_reset &&
                 se->code() != std::errc::broken_pipe &&
                 se->code() != std::errc::operation_canceled &&
                 se->code() != corocoll::errc::connection_closed);
            if (said_something || !refusal_said_something) last_refusal = std::move(refusal);
            refusal_said_something = refusal_said_something || said_something;
        }
    };
    auto accept_all = [&]() -> task<> {
        async_scope handshakes;
        std::optional<std::system_error> failed;
        while (missing > 0) {
            try {
                io::socket s =
                    co_await listener.accept(io::op_options(o.deadline, accepting.get_token()));
                handshakes.spawn(handshake(std::move(s)));
            } catch (const std::system_error& e) {
                if (missing > 0) failed = e;
                break;
            }
        }
        accepting.request_stop();
        co_await handshakes.join();
        if (!failed || missing == 0) co_return;
        std::string who;
        for (int p = rank + 1; p < size; ++p) {
            if (want(p) && !peers[static_cast<std::size_t>(p)].is_open()) {
                who += (who.empty() ? "" : ", ") + std::to_string(p);
            }
        }
        corocoll::detail::throw_error(
            failed->code(),
            "corocoll: init: rank " + std::to_string(rank) + " waited for " +
                std::to_string(missing) + " higher rank(s) to connect, rank(s) " + who +
                " never did" +
                (last_refusal.empty() ? "" : " (last refused: " + last_refusal + ")") + ": " +
                corocoll::detail::context_of(*failed));
    };
    auto connect_all = [&]() -> task<> {
        // Every wanted lower rank's address in one store round trip (a multi_get), not one
        // each.
        std::vector<int> lower_ranks;
        std::vector<std::string> keys;
        for (int p = 0; p < rank; ++p) {
            if (!want(p)) continue;
            lower_ranks.push_back(p);
            keys.push_back("mesh/addr/" + std::to_string(p));
        }
        if (keys.empty()) co_return;
        auto addresses = co_await store.multi_get(
            std::move(keys), std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::max(o.deadline - std::chrono::steady_clock::now(),
                                          std::chrono::steady_clock::duration{})));
        std::vector<task<io::socket>> lower;
        for (std::size_t k = 0; k < lower_ranks.size(); ++k) {
            lower.push_back(detail::connect_to(r, std::move(addresses[k]), rank, lower_ranks[k],
                                               size, o, stop.get_token()));
        }
        auto socks = co_await when_all(std::move(lower));
        for (std::size_t k = 0; k < lower_ranks.size(); ++k)
            peers[static_cast<std::size_t>(lower_ranks[k])] = std::move(socks[k]);
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
