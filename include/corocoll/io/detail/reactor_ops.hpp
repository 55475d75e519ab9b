#pragma once

// Included at the end of <corocoll/io/reactor.hpp>, once both the reactor and basic_op are
// complete; not meant to be included on its own.

#include <corocoll/io/detail/basic_op.hpp>
#include <corocoll/version.hpp>

#include <chrono>
#include <coroutine>
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
    step on_result(int res) noexcept {
        // -ETIME is the timer expiring, which is success here.
        if (res < 0 && res != -ETIME) fail(-res);
        return step::done;
    }

    __kernel_timespec when_;
};

/// `reactor::cancel_fd`: IORING_OP_ASYNC_CANCEL keyed on a file descriptor (Linux 5.19).
class cancel_fd_op final : public basic_op<cancel_fd_op> {
public:
    cancel_fd_op(reactor& r, int fd) : basic_op(r, op_options{}), fd_(fd) {}

    int await_resume() {
        throw_if_failed("cancel operations on fd " + std::to_string(fd_));
        return cancelled_;
    }

private:
    friend class basic_op<cancel_fd_op>;

    void prep(io_uring_sqe* sqe) noexcept {
        io_uring_prep_cancel_fd(sqe, fd_, IORING_ASYNC_CANCEL_ALL);
    }
    step on_result(int res) noexcept {
        if (res >= 0) {
            cancelled_ = res;
        } else if (res != -ENOENT) {  // ENOENT: there was nothing to cancel
            fail(-res);
        }
        return step::done;
    }

    int fd_;
    int cancelled_ = 0;
};

/// `reactor::schedule`: resumes the awaiting coroutine from the reactor's posted queue.
class schedule_op : private corocoll::detail::work_item {
public:
    explicit schedule_op(reactor& r) noexcept : reactor_(r) { run_ = &resume; }
    schedule_op(const schedule_op&) = delete;
    schedule_op& operator=(const schedule_op&) = delete;

    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) noexcept {
        continuation_ = h;
        reactor_.post(*this);
    }
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

}  // namespace io

COROCOLL_END_NAMESPACE
