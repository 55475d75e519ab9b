// The bodies of the non-template functions declared in <corocoll/transport/tcp/channel.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/tcp/channel.hpp>

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
