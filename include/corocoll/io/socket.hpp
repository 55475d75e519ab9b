#pragma once

// Awaitable TCP sockets and acceptors on the reactor: connect, accept, send, receive, with
// deadlines and stop tokens.

#include <corocoll/core/error.hpp>
#include <corocoll/io/endpoint.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/version.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>

COROCOLL_BEGIN_NAMESPACE

namespace io {

class socket;

namespace detail {

// One SQE moves at most this much; larger transfers continue in further SQEs.
inline constexpr std::size_t max_transfer_per_sqe = std::size_t{1} << 30;
// A MSG_WAITALL receive moves at most this much per SQE. io_uring hands a waiting-for-all
// receive that stays short through many poll retries to its worker threads, where it blocks
// in the kernel; 64 KiB pieces complete in the submitting thread, and later pieces are
// resubmitted as earlier ones end (docs/performance.md, "Why the defaults").
inline constexpr std::size_t max_waitall_recv_per_sqe = std::size_t{64} << 10;

inline std::string progress(std::size_t done, std::size_t total) {
    return " after " + std::to_string(done) + " of " + std::to_string(total) + " bytes";
}

/// Accounts for an operation's non-blocking first attempt (`op_options::try_now`) as if the
/// ring had returned it; true when that ended the operation, false when the ring must do the
/// rest (nothing was ready, or not all of it).
template <class Op>
bool took_now(Op& op, ssize_t got) noexcept {
    if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
        op.fail(errno);
        return true;
    }
    return op.on_result(static_cast<int>(got)) == step::done;
}

/// `socket::send` / `socket::recv`: moves the whole buffer, resubmitting after short
/// transfers. A receive that meets end-of-stream first fails with errc::connection_closed.
template <bool Send>
class transfer_op final : public basic_op<transfer_op<Send>> {
    using base = basic_op<transfer_op<Send>>;

public:
    using buffer = std::conditional_t<Send, std::span<const std::byte>, std::span<std::byte>>;

    transfer_op(reactor& r, int fd, const endpoint& peer, buffer data, const op_options& o)
        : base(r, o), fd_(fd), peer_(peer), data_(data) {}

    void await_resume() {
        if (this->failed()) {
            this->throw_if_failed(std::string(Send ? "send to " : "recv from ") +
                                  peer_.to_string() + progress(done_, data_.size()));
        }
        this->finish();
    }

private:
    friend base;
    template <class Op>
    friend bool took_now(Op&, ssize_t) noexcept;

    bool finished_early() noexcept {
        if (data_.empty()) return true;
        if (!this->try_now()) return false;
        std::size_t n = std::min(data_.size(), max_transfer_per_sqe);
        ssize_t got = 0;
        if constexpr (Send) {
            got = ::send(fd_, data_.data(), n, MSG_DONTWAIT | MSG_NOSIGNAL);
        } else {
            got = ::recv(fd_, data_.data(), n, MSG_DONTWAIT);
        }
        return took_now(*this, got);
    }

    void prep(io_uring_sqe* sqe) noexcept {
        std::size_t n =
            std::min(data_.size() - done_, Send ? max_transfer_per_sqe : max_waitall_recv_per_sqe);
        if constexpr (Send) {
            io_uring_prep_send(sqe, fd_, data_.data() + done_, n, MSG_NOSIGNAL);
        } else {
            io_uring_prep_recv(sqe, fd_, data_.data() + done_, n, MSG_WAITALL);
        }
    }

    step on_result(int res) noexcept {
        if (res < 0) {
            this->fail(-res);
            return step::done;
        }
        if (res == 0 && !Send) {
            this->fail(corocoll::errc::connection_closed);
            return step::done;
        }
        done_ += static_cast<std::size_t>(res);
        if constexpr (!Send) {
            if (done_ < data_.size() && !drain()) return step::done;
        }
        return done_ < data_.size() ? step::again : step::done;
    }

    // A receive's 64 KiB piece is in, and more of the stream usually waits behind it: takes
    // all that is there now in one system call rather than a ring trip per piece. A reader
    // that falls behind otherwise leaves megabytes queued in its socket, and the kernel,
    // past its buffer, drops segments for the sender to send again (docs/performance.md,
    // "Early messages over TCP"). False when that ended the operation with an error.
    bool drain() noexcept {
        while (done_ < data_.size()) {
            std::size_t n = std::min(data_.size() - done_, max_transfer_per_sqe);
            ssize_t got = ::recv(fd_, data_.data() + done_, n, MSG_DONTWAIT);
            if (got > 0) {
                done_ += static_cast<std::size_t>(got);
                continue;
            }
            if (got == 0) {
                this->fail(corocoll::errc::connection_closed);
                return false;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
            this->fail(errno);
            return false;
        }
        return true;
    }

    int fd_;
    const endpoint& peer_;
    buffer data_;
    std::size_t done_ = 0;
};

/// `socket::send_vec` / `socket::recv_vec`: the vectored forms, with the same whole-buffer
/// semantics. After a short transfer the first unfinished iovec is trimmed in place and
/// restored when the operation ends, so the caller's array is as it was afterwards.
template <bool Send>
class vector_op final : public basic_op<vector_op<Send>> {
    using base = basic_op<vector_op<Send>>;

public:
    vector_op(reactor& r, int fd, const endpoint& peer, std::span<iovec> iov, const op_options& o)
        : base(r, o), fd_(fd), peer_(peer), iov_(iov) {
        for (const iovec& v : iov_) total_ += v.iov_len;
        skip_empty();
    }

    std::size_t await_resume() {
        restore();
        if (this->failed()) {
            this->throw_if_failed(std::string(Send ? "vectored send to " : "vectored recv from ") +
                                  peer_.to_string() + progress(done_, total_));
        }
        this->finish();
        return done_;
    }

private:
    friend base;
    template <class Op>
    friend bool took_now(Op&, ssize_t) noexcept;

    bool finished_early() noexcept {
        if (index_ == iov_.size()) return true;
        if (!this->try_now()) return false;
        msghdr msg{};
        msg.msg_iov = &iov_[index_];
        msg.msg_iovlen = std::min<std::size_t>(iov_.size() - index_, IOV_MAX);
        ssize_t got = 0;
        if constexpr (Send) {
            got = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        } else {
            got = ::recvmsg(fd_, &msg, MSG_DONTWAIT);
        }
        return took_now(*this, got);
    }

    void prep(io_uring_sqe* sqe) noexcept {
        msg_ = {};
        msg_.msg_iov = &iov_[index_];
        msg_.msg_iovlen = std::min<std::size_t>(iov_.size() - index_, IOV_MAX);
        if constexpr (Send) {
            io_uring_prep_sendmsg(sqe, fd_, &msg_, MSG_NOSIGNAL);
        } else {
            io_uring_prep_recvmsg(sqe, fd_, &msg_, MSG_WAITALL);
        }
    }

    step on_result(int res) noexcept {
        if (res < 0) {
            this->fail(-res);
            return step::done;
        }
        if (res == 0 && !Send) {
            this->fail(corocoll::errc::connection_closed);
            return step::done;
        }
        done_ += static_cast<std::size_t>(res);
        advance(static_cast<std::size_t>(res));
        return index_ < iov_.size() ? step::again : step::done;
    }

    void advance(std::size_t n) noexcept {
        while (n > 0) {
            iovec& v = iov_[index_];
            if (n < v.iov_len) {
                if (!trimmed_) {
                    saved_ = v;
                    trimmed_ = true;
                }
                v.iov_base = static_cast<char*>(v.iov_base) + n;
                v.iov_len -= n;
                return;
            }
            n -= v.iov_len;
            restore();
            ++index_;
        }
        skip_empty();
    }

    void skip_empty() noexcept {
        while (index_ < iov_.size() && iov_[index_].iov_len == 0) ++index_;
    }

    void restore() noexcept {
        if (trimmed_) {
            iov_[index_] = saved_;
            trimmed_ = false;
        }
    }

    int fd_;
    const endpoint& peer_;
    std::span<iovec> iov_;
    std::size_t total_ = 0;
    std::size_t done_ = 0;
    std::size_t index_ = 0;
    iovec saved_{};
    bool trimmed_ = false;
    msghdr msg_{};
};

/// `socket::recv_some`: one receive of up to the buffer's size; 0 means end of stream.
class recv_some_op final : public basic_op<recv_some_op> {
public:
    recv_some_op(reactor& r, int fd, const endpoint& peer, std::span<std::byte> data,
                 const op_options& o)
        : basic_op(r, o), fd_(fd), peer_(peer), data_(data) {}

    std::size_t await_resume();

private:
    friend class basic_op<recv_some_op>;

    bool finished_early() const noexcept { return data_.empty(); }
    void prep(io_uring_sqe* sqe) noexcept {
        io_uring_prep_recv(sqe, fd_, data_.data(), std::min(data_.size(), max_transfer_per_sqe), 0);
    }
    step on_result(int res) noexcept;

    int fd_;
    const endpoint& peer_;
    std::span<std::byte> data_;
    std::size_t received_ = 0;
};

class accept_op;
class connect_op;

}  // namespace detail

/// A connected TCP socket (or an unconnected one that owns nothing). Move-only; closes its
/// descriptor when destroyed. Its operations are awaitables that run on the reactor given at
/// construction, each with optional deadline and stop token (`op_options`), and fail with a
/// `std::system_error` that names the operation, the peer address and the reason.
class socket {
public:
    socket() noexcept = default;
    /// Takes ownership of connected descriptor `fd` whose peer is `peer`.
    socket(reactor& r, int fd, endpoint peer) noexcept : reactor_(&r), fd_(fd), peer_(peer) {}
    /// Takes over `o`'s descriptor; `o` is closed.
    socket(socket&& o) noexcept
        : reactor_(o.reactor_), fd_(std::exchange(o.fd_, -1)), peer_(o.peer_) {}
    /// Closes the descriptor held and takes over `o`'s.
    socket& operator=(socket&& o) noexcept;
    socket(const socket&) = delete;
    socket& operator=(const socket&) = delete;
    ~socket() { close(); }

    /// Awaitable: connects to `peer` (TCP, with TCP_NODELAY) and yields the socket.
    static detail::connect_op connect(reactor& r, const endpoint& peer, op_options o = {});

    /// Awaitable: sends all of `data`. A 0-byte send completes without a system call.
    [[nodiscard]] auto send(std::span<const std::byte> data, op_options o = {}) {
        return detail::transfer_op<true>(*reactor_, fd_, peer_, data, o);
    }
    /// Awaitable: fills all of `data`; fails with `corocoll::errc::connection_closed` if the
    /// peer closes first.
    [[nodiscard]] auto recv(std::span<std::byte> data, op_options o = {}) {
        return detail::transfer_op<false>(*reactor_, fd_, peer_, data, o);
    }
    /// Awaitable: receives what is there, up to `data.size()` bytes; yields the count, 0 at
    /// end of stream.
    [[nodiscard]] auto recv_some(std::span<std::byte> data, op_options o = {}) {
        return detail::recv_some_op(*reactor_, fd_, peer_, data, o);
    }
    /// Awaitable: sends every byte of the buffers in `iov` (sendmsg); yields the byte count.
    /// The array must stay alive until the await ends; it is left as it was.
    [[nodiscard]] auto send_vec(std::span<iovec> iov, op_options o = {}) {
        return detail::vector_op<true>(*reactor_, fd_, peer_, iov, o);
    }
    /// Awaitable: fills every buffer in `iov` (recvmsg); yields the byte count.
    [[nodiscard]] auto recv_vec(std::span<iovec> iov, op_options o = {}) {
        return detail::vector_op<false>(*reactor_, fd_, peer_, iov, o);
    }

    /// Shuts down one or both directions (`SHUT_WR`, `SHUT_RD`, `SHUT_RDWR`).
    void shutdown(int how = SHUT_RDWR) noexcept {
        if (fd_ >= 0) ::shutdown(fd_, how);
    }
    /// Closes the descriptor. Operations still in flight on it must have been awaited first.
    void close() noexcept {
        if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    }

    /// True while a descriptor is held.
    bool is_open() const noexcept { return fd_ >= 0; }
    /// The descriptor, -1 when closed.
    int native_handle() const noexcept { return fd_; }
    /// The address connected to or accepted from.
    const endpoint& peer() const noexcept { return peer_; }
    /// The reactor the socket's operations run on.
    reactor& owner() const noexcept { return *reactor_; }

    /// The local address the socket is bound to.
    endpoint local_endpoint() const;

    /// Sets TCP_NODELAY (on by default for connected and accepted sockets).
    void set_nodelay(bool on);

private:
    reactor* reactor_ = nullptr;
    int fd_ = -1;
    endpoint peer_;
};

/// A listening TCP socket. `listen` binds and listens at once (port 0: the kernel picks one;
/// `local_endpoint()` tells which); `accept()` is an awaitable that yields a connected
/// `socket`.
class acceptor {
public:
    acceptor() noexcept = default;
    /// Takes over `o`'s descriptor; `o` is closed.
    acceptor(acceptor&& o) noexcept
        : reactor_(o.reactor_), fd_(std::exchange(o.fd_, -1)), local_(o.local_) {}
    /// Closes the descriptor held and takes over `o`'s.
    acceptor& operator=(acceptor&& o) noexcept;
    acceptor(const acceptor&) = delete;
    acceptor& operator=(const acceptor&) = delete;
    ~acceptor() { close(); }

    /// Binds to `where` with SO_REUSEADDR and listens. Throws `std::system_error` naming the
    /// address ("address already in use" included) on failure.
    static acceptor listen(reactor& r, const endpoint& where, int backlog = SOMAXCONN);

    /// `listen` with no reactor yet, for a listener made on one thread and served on another
    /// (it may be moved there); `attach` it to that thread's reactor before `accept`.
    static acceptor listen_unattached(const endpoint& where, int backlog = SOMAXCONN);

    /// Serves this listener from `r` (the reactor of the thread that will accept).
    void attach(reactor& r) noexcept { reactor_ = &r; }

    /// Awaitable: waits for the next connection and yields it as a `socket`.
    detail::accept_op accept(op_options o = {});

    /// A connection that is already waiting in the listen queue, taken without waiting (a
    /// poll with no timeout, then accept4); nothing when none waits or the accept fails (the
    /// next `accept` meets the error and reports it). For a server that takes a burst of
    /// connections at once rather than one per turn of its loop, so that the queue does not
    /// overflow. Only one thread may accept from the listener: another's accept between the
    /// poll and accept4 would leave this one waiting.
    std::optional<socket> accept_ready();

    /// Closes the listening descriptor now (close(2)); closing twice does nothing.
    void close() noexcept {
        if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    }
    /// True while listening.
    bool is_open() const noexcept { return fd_ >= 0; }
    /// The listening descriptor, -1 when closed.
    int native_handle() const noexcept { return fd_; }
    /// The address bound, with the port the kernel chose for port 0.
    const endpoint& local_endpoint() const noexcept { return local_; }

private:
    reactor* reactor_ = nullptr;
    int fd_ = -1;
    endpoint local_;
};

namespace detail {

COROCOLL_DECL void set_nodelay(int fd) noexcept;

class accept_op final : public basic_op<accept_op> {
public:
    accept_op(reactor& r, int fd, const endpoint& local, const op_options& o)
        : basic_op(r, o), fd_(fd), local_(local) {}

    socket await_resume();

private:
    friend class basic_op<accept_op>;

    void prep(io_uring_sqe* sqe) noexcept;
    step on_result(int res) noexcept;

    int fd_;
    const endpoint& local_;
    endpoint peer_;
    socklen_t peer_len_ = 0;
    int accepted_ = -1;
};

class connect_op final : public basic_op<connect_op> {
public:
    connect_op(reactor& r, const endpoint& peer, const op_options& o);
    connect_op(connect_op&& o) noexcept
        : basic_op(std::move(o)),
          peer_(o.peer_),
          fd_(std::exchange(o.fd_, -1)),
          create_error_(o.create_error_) {}
    connect_op& operator=(connect_op&&) = delete;
    ~connect_op() {
        if (fd_ >= 0) ::close(fd_);
    }

    socket await_resume();

private:
    friend class basic_op<connect_op>;

    bool finished_early() const noexcept { return create_error_ != 0; }
    void prep(io_uring_sqe* sqe) noexcept {
        io_uring_prep_connect(sqe, fd_, peer_.data(), peer_.size());
    }
    step on_result(int res) noexcept;

    endpoint peer_;
    int fd_ = -1;
    int create_error_ = 0;
};

}  // namespace detail

inline detail::connect_op socket::connect(reactor& r, const endpoint& peer, op_options o) {
    return detail::connect_op(r, peer, o);
}

inline detail::accept_op acceptor::accept(op_options o) {
    return detail::accept_op(*reactor_, fd_, local_, o);
}

}  // namespace io

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/io/impl/socket.ipp>
#endif
