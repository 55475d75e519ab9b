// The bodies of <corocoll/transport/tcp/lazy_mesh.hpp>: inline where corocoll is header-only,
// compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/tcp/channel.hpp>
#include <corocoll/transport/tcp/lazy_mesh.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

namespace detail {

// The verdict byte that ends a lazy connection's handshake.
inline constexpr std::uint8_t verdict_take = 'T';
inline constexpr std::uint8_t verdict_refuse = 'R';

}  // namespace detail

COROCOLL_DECL task<std::unique_ptr<channel>> lazy_mesh::dial(int p, time_point deadline,
                                                             std::stop_token stop) {
    const std::string& address = address_of(p);
    mesh_options o = options_;
    o.deadline = deadline;
    // The peer published this address itself: the handshake may take as long as the send that
    // dials (a peer's reactor busy elsewhere answers late), and the stall checks watch it.
    o.hello_timeout = std::chrono::hours(24 * 365);
    std::uint8_t verdict = 0;
    io::socket s;
    std::unique_ptr<channel> shared;
    try {
        io::endpoint where = io::endpoint::parse(address);
        s = co_await io::socket::connect(reactor_, where, io::op_options(deadline, stop));
        co_await detail::connector_handshake(s, rank_, p, size_, o, address, stop);
        co_await s.recv(detail::bytes_of(verdict), io::op_options(detail::hello_deadline(o), stop));
        if (verdict == detail::verdict_take && shm_ && shm_->may_share(p))
            shared = co_await shm_->share(s, p, deadline, stop);
    } catch (const std::system_error& e) {
        corocoll::detail::throw_error(e.code(),
                                      "connecting to rank " + std::to_string(p) + " at " + address +
                                          " on first use: " + corocoll::detail::context_of(e));
    }
    if (verdict == detail::verdict_refuse) co_return nullptr;
    if (verdict != detail::verdict_take) {
        corocoll::detail::throw_error(corocoll::errc::protocol_error,
                                      "connecting to rank " + std::to_string(p) + " at " + address +
                                          " on first use: its verdict was byte " +
                                          std::to_string(verdict) + ", neither take nor refuse");
    }
    COROCOLL_LOG(info, "P2P", "rank ", rank_, " connected to rank ", p, " at ", address,
                 " on first use");
    if (shared) co_return shared;
    co_return tcp_channel::make(std::move(s), send_buffer_);
}

COROCOLL_DECL task<int> lazy_mesh::greet(io::socket& s, std::stop_token stop) {
    mesh_options o = options_;
    o.deadline = io::deadline_after(o.hello_timeout);
    co_return co_await detail::listener_handshake(s, rank_, size_, o, here_, std::move(stop));
}

COROCOLL_DECL task<std::unique_ptr<channel>> lazy_mesh::answer(io::socket s, int p, bool take,
                                                               std::stop_token stop) {
    std::uint8_t verdict = take ? detail::verdict_take : detail::verdict_refuse;
    co_await s.send(detail::bytes_of(verdict),
                    io::op_options(io::deadline_after(options_.hello_timeout), stop));
    if (!take) co_return nullptr;
    COROCOLL_LOG(info, "P2P", "rank ", rank_, " took the connection of rank ", p, " (",
                 s.peer().to_string(), ") on its first use");
    if (shm_ && shm_->may_share(p)) {
        auto shared =
            co_await shm_->share(s, p, io::deadline_after(options_.hello_timeout), std::move(stop));
        if (shared) co_return shared;
    }
    co_return tcp_channel::make(std::move(s), send_buffer_);
}

}  // namespace transport

COROCOLL_END_NAMESPACE
