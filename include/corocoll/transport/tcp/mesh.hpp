#pragma once

// The TCP mesh of a group: every pair of ranks gets one connection, whose two ends prove the
// job token to each other.

#include <corocoll/core/async_scope.hpp>
#include <corocoll/core/auth.hpp>
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
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
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
    /// A secret shared by the job's ranks (COROCOLL_JOB_TOKEN); empty: none. With one, both
    /// ends of every connection prove that they know it by HMAC-SHA256 over fresh nonces of
    /// both sides; the token itself is never sent. Needs libcrypto (see docs/security.md).
    std::string job_token;
    /// Where this rank listens (port 0: an ephemeral port). See `choose_listen_address`.
    io::endpoint listen_on = io::endpoint::loopback(0);
    /// How long one connection's handshake may take, each on its own: a connection that
    /// says nothing (or something wrong) is dropped after it without holding up the others.
    std::chrono::milliseconds hello_timeout = std::chrono::seconds(5);
    /// Ends the set-up early when stopped (the set-up of a subgroup whose parent group
    /// failed: a rank died); it then throws std::errc::operation_canceled.
    std::stop_token stop;
    /// The group opens its connections on first use (`connect_mode::lazy`): said in the hello,
    /// so that ranks set up differently refuse each other with a reason, and every connection
    /// ends its handshake with the listener's verdict (`lazy_mesh`).
    bool lazy = false;
};

/// The address this rank listens on for its peers: the first IPv4 (else IPv6) address of the
/// interface named by COROCOLL_SOCKET_IFNAME (or GLOO_SOCKET_IFNAME); otherwise the local
/// address this host uses to reach `master` (found by connecting a UDP socket, which sends
/// nothing); loopback when `master` is loopback or unknown. Port 0.
COROCOLL_DECL io::endpoint choose_listen_address(const std::optional<io::endpoint>& master);

namespace detail {

// Throws, naming the rank, when `o` has a job token that this build cannot prove (no
// libcrypto).
COROCOLL_DECL void require_token_auth(int rank, const mesh_options& o);

// The hello each side sends first: group (a hash of its name), ranks, world size, whether a
// job token is in use (`tag`), and how many bytes follow it (nonce, and the proof).
COROCOLL_DECL frame_header make_hello(int rank, int peer, int size, const mesh_options& o,
                                      std::size_t follows);

// What is wrong with a hello `h` that this rank reads ("" if nothing): `expected_peer` < 0
// means any rank (the accepting side), `follows` the bytes that must come after it.
COROCOLL_DECL std::string hello_problem(const frame_header& h, int rank, int size,
                                        int expected_peer, const mesh_options& o,
                                        std::size_t follows);

// The proof by side `role` ("connector" or "listener") of the connection from `connector` to the
// listener that `listener_address` names knows the token: HMAC-SHA256 over the group, both ranks,
// that address and both nonces. Each side proves over the other's fresh nonce, so a proof cannot be
// replayed, and over the address it was dialled at, so a stranger whose address was written into
// the store cannot relay the handshake to the real rank.
COROCOLL_DECL corocoll::detail::auth_proof mesh_proof(
    const mesh_options& o, std::string_view role, int connector, int listener,
    const std::string& listener_address, const corocoll::detail::auth_nonce& connector_nonce,
    const corocoll::detail::auth_nonce& listener_nonce);

inline std::chrono::steady_clock::time_point hello_deadline(const mesh_options& o) {
    return std::min(o.deadline, io::deadline_after(o.hello_timeout));
}

template <class T>
std::span<std::byte> bytes_of(T& value) {
    return std::as_writable_bytes(std::span(&value, 1));
}

// The connecting side's handshake with the listener at `where`, published as rank `peer`'s:
// a hello and a fresh nonce out; the listener's hello, nonce and proof in; with a
// token, the listener's proof checked before this rank's own goes out. Nothing sent depends on
// the token until the listener has shown that it knows it.
COROCOLL_DECL task<> connector_handshake(io::socket& s, int rank, int peer, int size,
                                         const mesh_options& o, const std::string& where,
                                         std::stop_token stop);

// The listening side's handshake on an accepted connection; returns the peer's rank, or
// throws why the connection is refused. `here` is the address this rank published.
COROCOLL_DECL task<int> listener_handshake(io::socket& s, int rank, int size, const mesh_options& o,
                                           const std::string& here, std::stop_token stop);

// Connects to lower rank `peer`, which listens at `address` (as it published it), retrying
// with backoff and jitter until the deadline.
COROCOLL_DECL task<io::socket> connect_to(io::reactor& r, std::string address, int rank, int peer,
                                          int size, const mesh_options& o, std::stop_token stop);

}  // namespace detail

/// Connects this rank to the peers `wanted` marks (one entry per rank; the marks must agree
/// on both ends of a pair) as `connect_mesh` does, over `listener`, whose address `here` every
/// rank published under "mesh/addr/<rank>" already. The listener stays open. Unmarked peers'
/// sockets stay closed.
COROCOLL_DECL task<std::vector<io::socket>> connect_pairs(io::reactor& r, rendezvous::store& store,
                                                          int rank, int size, mesh_options o,
                                                          io::acceptor& listener,
                                                          const std::string& here,
                                                          const std::vector<bool>& wanted);

/// Builds the full mesh of TCP connections of a group: rank `rank` listens on
/// `o.listen_on`, publishes host:port under "mesh/addr/<rank>" in `store` (give each group
/// its own prefix store), connects to every lower rank (retrying with backoff and jitter
/// while they start) and accepts every higher one. Accepted connections are handled
/// concurrently, each handshake bounded by `o.hello_timeout`: a connection that is not a
/// peer of this group (bad or no hello, another group, a wrong proof of the token, silence)
/// is dropped with a WARN and set-up goes on. Each connection starts with a hello each way
/// that checks group, ranks, world size and protocol version, and with a job token, a
/// challenge-response proof from each side (`mesh_options::job_token`). A listener that
/// answers a connecting rank wrongly is an error naming both. Everything is bounded by
/// `o.deadline`; at the deadline the error names the ranks still missing. Returns one
/// socket per rank, indexed by rank (the own entry stays closed).
COROCOLL_DECL task<std::vector<io::socket>> connect_mesh(io::reactor& r, rendezvous::store& store,
                                                         int rank, int size, mesh_options o);

}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/tcp/impl/mesh.ipp>
#endif
