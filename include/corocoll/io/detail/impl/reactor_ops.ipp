// The bodies of the non-template functions declared in <corocoll/io/detail/reactor_ops.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/io/detail/reactor_ops.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace io {
namespace detail {

COROCOLL_DECL step timer_op::on_result(int res) noexcept {
    // -ETIME is the timer expiring, which is success here.
    if (res < 0 && res != -ETIME) fail(-res);
    return step::done;
}

COROCOLL_DECL int cancel_fd_op::await_resume() {
    throw_if_failed("cancel operations on fd " + std::to_string(fd_));
    return cancelled_;
}

COROCOLL_DECL step cancel_fd_op::on_result(int res) noexcept {
    if (res >= 0) {
        cancelled_ = res;
    } else if (res != -ENOENT) {  // ENOENT: there was nothing to cancel
        fail(-res);
    }
    return step::done;
}

COROCOLL_DECL std::size_t read_some_op::await_resume() {
    throw_if_failed("read from fd " + std::to_string(fd_));
    return read_;
}

COROCOLL_DECL void read_some_op::prep(io_uring_sqe* sqe) noexcept {
    // Offset -1: the file's current position, which is what a pipe needs.
    io_uring_prep_read(
        sqe, fd_, data_.data(),
        static_cast<unsigned>(std::min<std::size_t>(data_.size(), std::size_t{1} << 30)),
        static_cast<__u64>(-1));
}

COROCOLL_DECL step read_some_op::on_result(int res) noexcept {
    if (res < 0) {
        fail(-res);
    } else {
        read_ = static_cast<std::size_t>(res);
    }
    return step::done;
}

COROCOLL_DECL unsigned poll_op::await_resume() {
    throw_if_failed("poll fd " + std::to_string(fd_));
    return revents_;
}

COROCOLL_DECL step poll_op::on_result(int res) noexcept {
    if (res < 0) {
        fail(-res);
    } else {
        revents_ = static_cast<unsigned>(res);
    }
    return step::done;
}

COROCOLL_DECL void schedule_op::await_suspend(std::coroutine_handle<> h) noexcept {
    continuation_ = h;
    reactor_.post(*this);
}

}  // namespace detail
}  // namespace io

COROCOLL_END_NAMESPACE
