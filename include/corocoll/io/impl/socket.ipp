// The bodies of the non-template functions declared in <corocoll/io/socket.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/io/socket.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace io {
namespace detail {

COROCOLL_DECL std::size_t recv_some_op::await_resume() {
    // The message is spelled only on failure: this is a reader's per-message path.
    if (failed()) throw_if_failed("recv from " + peer_.to_string());
    finish();
    return received_;
}

COROCOLL_DECL step recv_some_op::on_result(int res) noexcept {
    if (res < 0) {
        fail(-res);
    } else {
        received_ = static_cast<std::size_t>(res);
    }
    return step::done;
}

}  // namespace detail
}  // namespace io

namespace io {

COROCOLL_DECL socket& socket::operator=(socket&& o) noexcept {
    if (this != &o) {
        close();
        reactor_ = o.reactor_;
        fd_ = std::exchange(o.fd_, -1);
        peer_ = o.peer_;
    }
    return *this;
}

COROCOLL_DECL endpoint socket::local_endpoint() const {
    endpoint e;
    socklen_t len = endpoint::capacity();
    if (::getsockname(fd_, e.data(), &len) != 0) {
        corocoll::detail::throw_errno(errno, "corocoll: getsockname");
    }
    e.resize(len);
    return e;
}

COROCOLL_DECL void socket::set_nodelay(bool on) {
    int v = on ? 1 : 0;
    if (::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &v, sizeof(v)) != 0) {
        corocoll::detail::throw_errno(
            errno, "corocoll: setsockopt TCP_NODELAY on socket to " + peer_.to_string());
    }
}

COROCOLL_DECL acceptor& acceptor::operator=(acceptor&& o) noexcept {
    if (this != &o) {
        close();
        reactor_ = o.reactor_;
        fd_ = std::exchange(o.fd_, -1);
        local_ = o.local_;
    }
    return *this;
}

COROCOLL_DECL acceptor acceptor::listen(reactor& r, const endpoint& where, int backlog) {
    acceptor a = listen_unattached(where, backlog);
    a.attach(r);
    return a;
}

COROCOLL_DECL acceptor acceptor::listen_unattached(const endpoint& where, int backlog) {
    acceptor a;
    a.fd_ = ::socket(where.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (a.fd_ < 0) corocoll::detail::throw_errno(errno, "corocoll: socket for listening");
    int one = 1;
    ::setsockopt(a.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(a.fd_, where.data(), where.size()) != 0) {
        corocoll::detail::throw_errno(errno, "corocoll: bind to " + where.to_string());
    }
    if (::listen(a.fd_, backlog) != 0) {
        corocoll::detail::throw_errno(errno, "corocoll: listen on " + where.to_string());
    }
    socklen_t len = endpoint::capacity();
    if (::getsockname(a.fd_, a.local_.data(), &len) != 0) {
        corocoll::detail::throw_errno(errno, "corocoll: getsockname");
    }
    a.local_.resize(len);
    return a;
}

COROCOLL_DECL std::optional<socket> acceptor::accept_ready() {
    pollfd ready{fd_, POLLIN, 0};
    if (fd_ < 0 || ::poll(&ready, 1, 0) != 1 || (ready.revents & POLLIN) == 0) return std::nullopt;
    endpoint peer;
    socklen_t len = endpoint::capacity();
    int fd = ::accept4(fd_, peer.data(), &len, SOCK_CLOEXEC);
    if (fd < 0) return std::nullopt;
    peer.resize(len);
    detail::set_nodelay(fd);
    return socket(*reactor_, fd, peer);
}

}  // namespace io

namespace io {
namespace detail {

COROCOLL_DECL void set_nodelay(int fd) noexcept {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

COROCOLL_DECL socket accept_op::await_resume() {
    throw_if_failed("accept on " + local_.to_string());
    peer_.resize(peer_len_);
    set_nodelay(accepted_);
    return socket(reactor_, accepted_, peer_);
}

COROCOLL_DECL void accept_op::prep(io_uring_sqe* sqe) noexcept {
    peer_len_ = endpoint::capacity();
    io_uring_prep_accept(sqe, fd_, peer_.data(), &peer_len_, SOCK_CLOEXEC);
}

COROCOLL_DECL step accept_op::on_result(int res) noexcept {
    if (res < 0) {
        fail(-res);
    } else {
        accepted_ = res;
    }
    return step::done;
}

COROCOLL_DECL connect_op::connect_op(reactor& r, const endpoint& peer, const op_options& o)
    : basic_op(r, o), peer_(peer) {
    fd_ = ::socket(peer_.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) create_error_ = errno;
}

COROCOLL_DECL socket connect_op::await_resume() {
    if (create_error_ != 0) {
        corocoll::detail::throw_errno(create_error_,
                                      "corocoll: socket to connect to " + peer_.to_string());
    }
    throw_if_failed("connect to " + peer_.to_string());
    set_nodelay(fd_);
    return socket(reactor_, std::exchange(fd_, -1), peer_);
}

COROCOLL_DECL step connect_op::on_result(int res) noexcept {
    if (res < 0) fail(-res);
    return step::done;
}

}  // namespace detail
}  // namespace io

COROCOLL_END_NAMESPACE
