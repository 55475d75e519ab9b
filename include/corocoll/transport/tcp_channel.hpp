#pragma once

// The channel to a peer over a TCP socket on the reactor.

#include <corocoll/core/task.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/io/socket.hpp>
#include <corocoll/transport/channel.hpp>
#include <corocoll/version.hpp>

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// A connected socket as a channel. Receives and sends go through the ring; `try_*` make one
/// non-blocking system call.
class tcp_channel final : public channel {
public:
    /// A channel over the connected socket `s`.
    explicit tcp_channel(io::socket s) : sock_(std::move(s)), address_(sock_.peer().to_string()) {}

    /// The channel over `s`, its send buffer sized as `size_send_buffer` says.
    static std::unique_ptr<channel> make(io::socket s, std::size_t same_host_send_buffer);

    const char* kind() const noexcept override { return "tcp"; }
    std::string address() const override { return address_; }

    COROCOLL_DECL std::size_t try_recv(std::span<std::byte> out,
                                       bool may_call_kernel) noexcept override;
    COROCOLL_DECL task<std::size_t> recv_some(std::span<std::byte> out, io::op_options o) override;
    COROCOLL_DECL task<> recv(std::span<std::byte> out, io::op_options o) override;

    COROCOLL_DECL std::size_t try_send(std::span<iovec> iov) noexcept override;
    COROCOLL_DECL task<> send(std::span<iovec> iov, io::op_options o) override;
    COROCOLL_DECL void send_now(std::span<iovec> iov) noexcept override;

    void shutdown() noexcept override { sock_.shutdown(); }
    COROCOLL_DECL task<> close() override;
    /// False after `close`.
    bool is_open() const noexcept override { return sock_.is_open(); }

    /// A send buffer of `bytes` where both ends have the same address (a peer on this host;
    /// see engine_options::same_host_send_buffer); 0 leaves the kernel's autotuning.
    void size_send_buffer(std::size_t bytes) const;

private:
    io::socket sock_;
    std::string address_;
};

}  // namespace transport

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace transport {

COROCOLL_DECL std::unique_ptr<channel> tcp_channel::make(io::socket s,
                                                         std::size_t same_host_send_buffer) {
    auto c = std::make_unique<tcp_channel>(std::move(s));
    c->size_send_buffer(same_host_send_buffer);
    return c;
}

COROCOLL_DECL std::size_t tcp_channel::try_recv(std::span<std::byte> out,
                                                bool may_call_kernel) noexcept {
    if (!may_call_kernel || out.empty()) return 0;
    ssize_t n = ::recv(sock_.native_handle(), out.data(), out.size(), MSG_DONTWAIT);
    return n > 0 ? static_cast<std::size_t>(n) : 0;
}

COROCOLL_DECL task<std::size_t> tcp_channel::recv_some(std::span<std::byte> out, io::op_options o) {
    co_return co_await sock_.recv_some(out, std::move(o));
}

COROCOLL_DECL task<> tcp_channel::recv(std::span<std::byte> out, io::op_options o) {
    co_await sock_.recv(out, std::move(o));
}

COROCOLL_DECL std::size_t tcp_channel::try_send(std::span<iovec> iov) noexcept {
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = std::min<std::size_t>(iov.size(), IOV_MAX);
    ssize_t n = ::sendmsg(sock_.native_handle(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    return n > 0 ? static_cast<std::size_t>(n) : 0;
}

COROCOLL_DECL task<> tcp_channel::send(std::span<iovec> iov, io::op_options o) {
    co_await sock_.send_vec(iov, std::move(o));
}

COROCOLL_DECL void tcp_channel::send_now(std::span<iovec> iov) noexcept {
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = iov.size();
    [[maybe_unused]] auto n = ::sendmsg(sock_.native_handle(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
}

COROCOLL_DECL task<> tcp_channel::close() {
    sock_.close();
    co_return;
}

COROCOLL_DECL void tcp_channel::size_send_buffer(std::size_t bytes) const {
    if (bytes == 0 || sock_.local_endpoint().host() != sock_.peer().host()) return;
    int n = static_cast<int>(std::min<std::size_t>(bytes, std::size_t{1} << 30));
    // Best effort: a refusal leaves the kernel's autotuning, which works too.
    ::setsockopt(sock_.native_handle(), SOL_SOCKET, SO_SNDBUF, &n, sizeof(n));
}

}  // namespace transport

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
