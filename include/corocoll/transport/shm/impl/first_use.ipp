// The bodies of <corocoll/transport/shm/first_use.hpp>: inline where corocoll is header-only,
// compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/shm/channel.hpp>
#include <corocoll/transport/shm/first_use.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {
namespace detail {

COROCOLL_DECL task<std::unique_ptr<channel>> first_use_shm::share(io::socket& s, int p,
                                                                  time_point deadline,
                                                                  std::stop_token stop) {
    // The lower rank of the pair offers, whichever of the two dialled.
    if (rank_ < p) co_return co_await offer(s, p, deadline, std::move(stop));
    co_return co_await take(s, p, deadline, std::move(stop));
}

COROCOLL_DECL std::unique_ptr<channel> first_use_shm::stay_on_tcp(int p,
                                                                  const std::string& why) const {
    std::string pair = "rank " + std::to_string(rank_) + " - rank " + std::to_string(p);
    if (options_.mine == transport_choice::shm ||
        info_[static_cast<std::size_t>(p)].choice == transport_choice::shm) {
        corocoll::detail::throw_error(
            std::make_error_code(std::errc::operation_not_supported),
            "corocoll: first use of " + pair +
                ": no shared memory, which COROCOLL_TRANSPORT=shm asks for: " + why);
    }
    COROCOLL_LOG(info, "P2P", pair, ": tcp on first use (", why, ")");
    return nullptr;
}

COROCOLL_DECL task<std::unique_ptr<channel>> first_use_shm::offer(io::socket& s, int p,
                                                                  time_point deadline,
                                                                  std::stop_token stop) {
    auto o = co_await offer_segment(reactor_, info_[static_cast<std::size_t>(p)].socket_name,
                                    options_.ring_bytes, options_.group, rank_, deadline);
    shm_verdict& v = o.verdict;
    mapping& map = o.map;
    fd_guard& sock = o.sock;
    std::string& why = o.why;
    co_await s.send(bytes_of(v), io::op_options(deadline, stop));
    if (v.offered != offered) co_return stay_on_tcp(p, why);
    shm_reply reply;
    // With `stop`: a group that fails while rank p is silent (its own group failed before it
    // answered, say) ends this wait at once, not at the deadline.
    bool answered = co_await exchange_reply(sock.fd, reply, false, p, deadline, stop);
    if (!answered || reply.mapped != 1) {
        co_return stay_on_tcp(p, "rank " + std::to_string(p) + " could not map the segment");
    }
    auto* seg = static_cast<shm_segment*>(map.addr);
    seg->can_read_peer[0].store(can_read(seg->pid[1], reply.address, v.nonce) ? 1 : 0);
    auto ch = std::make_unique<shm_channel>(reactor_, 0, map.addr, map.bytes, sock.release(),
                                            options_.single_copy_bytes, options_.futex_wait,
                                            options_.publish_without_fence);
    map.addr = nullptr;  // the channel owns it now
    COROCOLL_LOG(info, "P2P", "rank ", rank_, " - rank ", p,
                 ": shm on first use (one segment mapped by both; sleeps on a ", ch->sleeps_on(),
                 ")");
    co_return ch;
}

COROCOLL_DECL task<std::unique_ptr<channel>> first_use_shm::take(io::socket& s, int p,
                                                                 time_point deadline,
                                                                 std::stop_token stop) {
    shm_verdict v;
    co_await s.recv(bytes_of(v), io::op_options(deadline, stop));
    if (v.magic != shm_verdict{}.magic) {
        corocoll::detail::throw_error(corocoll::errc::protocol_error,
                                      "corocoll: first use of rank " + std::to_string(rank_) +
                                          " - rank " + std::to_string(p) + ": rank " +
                                          std::to_string(p) + " sent no channel verdict");
    }
    if (v.offered != offered) co_return stay_on_tcp(p, verdict_text(v.offered, p));
    arrival a = co_await arrival_of(p, v.nonce, deadline, stop);
    std::string why;
    mapping map;
    shm_reply reply = take_offered(a.memfd.fd, a.intro, v.nonce, map, why);
    if (!co_await exchange_reply(a.conn.fd, reply, true, p, deadline, stop)) {
        corocoll::detail::throw_error(corocoll::errc::connection_closed,
                                      "corocoll: first use of rank " + std::to_string(rank_) +
                                          " - rank " + std::to_string(p) + ": rank " +
                                          std::to_string(p) + " left while handing a segment over");
    }
    if (map.addr == nullptr) co_return stay_on_tcp(p, why);
    auto ch = std::make_unique<shm_channel>(reactor_, 1, map.addr, map.bytes, a.conn.release(),
                                            options_.single_copy_bytes, options_.futex_wait,
                                            options_.publish_without_fence);
    map.addr = nullptr;  // the channel owns it now
    co_return ch;
}

COROCOLL_DECL task<bool> first_use_shm::exchange_reply(int fd, shm_reply& reply, bool send, int p,
                                                       time_point deadline, std::stop_token stop) {
    try {
        co_return co_await unix_exchange(reactor_, fd, &reply, sizeof(reply), send, deadline,
                                         std::move(stop));
    } catch (const std::system_error& e) {
        corocoll::detail::throw_error(
            e.code(),
            "corocoll: first use of rank " + std::to_string(rank_) + " - rank " +
                std::to_string(p) +
                (send ? ": answering rank " + std::to_string(p) + " on its unix socket"
                      : ": waiting for rank " + std::to_string(p) + " to map the segment"));
    }
}

COROCOLL_DECL void first_use_shm::gather_arrivals() {
    for (;;) {
        fd_guard conn(::accept4(listener_.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (conn.fd < 0) break;
        arrival a;
        a.conn = std::move(conn);
        a.since = std::chrono::steady_clock::now();
        arrivals_.push_back(std::move(a));
    }
    auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < arrivals_.size();) {
        auto& a = arrivals_[i];
        bool drop = false;
        if (!a.read) {
            pollfd pf{a.conn.fd, POLLIN, 0};
            if (::poll(&pf, 1, 0) == 1) {
                a.read = recv_intro(a.conn.fd, a.intro, a.memfd) && a.intro.group == options_.group;
                drop = !a.read;
            }
        }
        // A connection that says nothing for a few seconds, or whose intro nobody claims for a
        // minute (its rank's handshake failed), is a stray.
        auto patience = a.read ? std::chrono::seconds(60) : std::chrono::seconds(5);
        if (drop || now - a.since > patience) {
            COROCOLL_LOG(warn, "P2P", "rank ", rank_,
                         " drops a stray connection to its unix socket");
            arrivals_.erase(arrivals_.begin() + static_cast<std::ptrdiff_t>(i));
            continue;
        }
        ++i;
    }
}

COROCOLL_DECL task<first_use_shm::arrival> first_use_shm::arrival_of(int p, std::uint64_t nonce,
                                                                     time_point deadline,
                                                                     std::stop_token stop) {
    // The lower rank connected and sent its intro before it told the nonce over TCP, but
    // several pairs may hand segments over at once: each waiter takes its own from the arrivals
    // that any of them accepted.
    for (;;) {
        gather_arrivals();
        for (std::size_t i = 0; i < arrivals_.size(); ++i) {
            auto& a = arrivals_[i];
            if (a.read && a.intro.rank == static_cast<std::uint32_t>(p) && a.intro.nonce == nonce) {
                arrival out = std::move(a);
                arrivals_.erase(arrivals_.begin() + static_cast<std::ptrdiff_t>(i));
                co_return out;
            }
        }
        if (stop.stop_requested()) {
            corocoll::detail::throw_error(std::make_error_code(std::errc::operation_canceled),
                                          "corocoll: first use of rank " + std::to_string(rank_) +
                                              " - rank " + std::to_string(p) +
                                              ": stopped while waiting for its segment");
        }
        if (std::chrono::steady_clock::now() >= deadline) {
            corocoll::detail::throw_error(
                std::make_error_code(std::errc::timed_out),
                "corocoll: first use of rank " + std::to_string(rank_) + " - rank " +
                    std::to_string(p) + ": rank " + std::to_string(p) +
                    "'s shared-memory segment did not reach this rank's unix socket by the "
                    "deadline");
        }
        co_await reactor_.sleep_for(std::chrono::milliseconds(1));
    }
}

}  // namespace detail
}  // namespace transport

COROCOLL_END_NAMESPACE
