#pragma once

// Included at the end of <corocoll/io/reactor.hpp>, once both the reactor and basic_op are
// complete; not meant to be included on its own.

#include <corocoll/io/detail/basic_op.hpp>
#include <corocoll/version.hpp>

#include <algorithm>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <span>
#include <stop_token>
#include <string>

COROCOLL_BEGIN_NAMESPACE

namespace io {

namespace detail {

template <class Derived>
void basic_op<Derived>::submit() noexcept {
    reactor_.submit(*this);
}

template <class Derived>
void basic_op<Derived>::post_cancel() noexcept {
    reactor_.post(*this);
}

template <class Derived>
bool basic_op<Derived>::withdraw_self() noexcept {
    return reactor_.withdraw(*this);
}

template <class Derived>
void basic_op<Derived>::withdraw_cancel() noexcept {
    reactor_.withdraw(cancel_);
}

template <class Derived>
void basic_op<Derived>::submit_cancel() noexcept {
    reactor_.submit(cancel_);
}

/// `reactor::sleep_until`: an IORING_OP_TIMEOUT at an absolute steady-clock time.
class timer_op final : public basic_op<timer_op> {
public:
    timer_op(reactor& r, std::chrono::steady_clock::time_point when, std::stop_token stop)
        : basic_op(r, op_options(std::move(stop))), when_(to_kernel_time(when)) {}

    void await_resume() { throw_if_failed("sleep"); }

private:
    friend class basic_op<timer_op>;

    void prep(io_uring_sqe* sqe) noexcept {
        io_uring_prep_timeout(sqe, &when_, 0, IORING_TIMEOUT_ABS);
    }
    step on_result(int res) noexcept;

    __kernel_timespec when_;
};

/// `reactor::cancel_fd`: IORING_OP_ASYNC_CANCEL keyed on a file descriptor (Linux 5.19).
class cancel_fd_op final : public basic_op<cancel_fd_op> {
public:
    cancel_fd_op(reactor& r, int fd) : basic_op(r, op_options{}), fd_(fd) {}

    int await_resume();

private:
    friend class basic_op<cancel_fd_op>;

    void prep(io_uring_sqe* sqe) noexcept {
        io_uring_prep_cancel_fd(sqe, fd_, IORING_ASYNC_CANCEL_ALL);
    }
    step on_result(int res) noexcept;

    int fd_;
    int cancelled_ = 0;
};

/// `reactor::read_some`: one IORING_OP_READ at the descriptor's current offset.
class read_some_op final : public basic_op<read_some_op> {
public:
    read_some_op(reactor& r, int fd, std::span<std::byte> data, const op_options& o)
        : basic_op(r, o), fd_(fd), data_(data) {}

    std::size_t await_resume();

private:
    friend class basic_op<read_some_op>;

    bool finished_early() const noexcept { return data_.empty(); }
    void prep(io_uring_sqe* sqe) noexcept;
    step on_result(int res) noexcept;

    int fd_;
    std::span<std::byte> data_;
    std::size_t read_ = 0;
};

/// `reactor::poll`: a one-shot IORING_OP_POLL_ADD.
class poll_op final : public basic_op<poll_op> {
public:
    poll_op(reactor& r, int fd, unsigned events, const op_options& o)
        : basic_op(r, o), fd_(fd), events_(events) {}

    unsigned await_resume();

private:
    friend class basic_op<poll_op>;

    void prep(io_uring_sqe* sqe) noexcept { io_uring_prep_poll_add(sqe, fd_, events_); }
    step on_result(int res) noexcept;

    int fd_;
    unsigned events_;
    unsigned revents_ = 0;
};

/// `reactor::schedule`: resumes the awaiting coroutine from the reactor's posted queue.
class schedule_op : private corocoll::detail::work_item {
public:
    explicit schedule_op(reactor& r) noexcept : reactor_(r) { run_ = &resume; }
    schedule_op(const schedule_op&) = delete;
    schedule_op& operator=(const schedule_op&) = delete;

    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) noexcept;
    void await_resume() const noexcept {}

private:
    static void resume(corocoll::detail::work_item* item) noexcept {
        static_cast<schedule_op*>(item)->continuation_.resume();
    }

    reactor& reactor_;
    std::coroutine_handle<> continuation_;
};

}  // namespace detail

template <class Rep, class Period>
auto reactor::sleep_for(std::chrono::duration<Rep, Period> d, std::stop_token stop) {
    return detail::timer_op(*this, deadline_after(d), std::move(stop));
}

inline auto reactor::sleep_until(std::chrono::steady_clock::time_point t, std::stop_token stop) {
    return detail::timer_op(*this, t, std::move(stop));
}

inline auto reactor::schedule() noexcept { return detail::schedule_op(*this); }

inline auto reactor::cancel_fd(int fd) { return detail::cancel_fd_op(*this, fd); }

inline auto reactor::read_some(int fd, std::span<std::byte> data) {
    return detail::read_some_op(*this, fd, data, op_options{});
}

inline auto reactor::read_some(int fd, std::span<std::byte> data, const op_options& o) {
    return detail::read_some_op(*this, fd, data, o);
}

inline auto reactor::poll(int fd, unsigned events) {
    return detail::poll_op(*this, fd, events, op_options{});
}

inline auto reactor::poll(int fd, unsigned events, const op_options& o) {
    return detail::poll_op(*this, fd, events, o);
}

}  // namespace io

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/io/detail/impl/reactor_ops.ipp>
#endif
