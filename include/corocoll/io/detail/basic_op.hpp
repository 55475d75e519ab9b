#pragma once

// The operation base of every awaitable I/O operation (sockets, timers, futex waits, channels).

#include <corocoll/core/error.hpp>
#include <corocoll/core/event_loop.hpp>
#include <corocoll/io/detail/io_op.hpp>
#include <corocoll/version.hpp>

#include <liburing.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <coroutine>
#include <optional>
#include <stop_token>
#include <string>
#include <system_error>

COROCOLL_BEGIN_NAMESPACE

namespace io {

class reactor;

/// Options every awaitable I/O operation takes: a deadline, a stop token, both or neither. A
/// deadline or a token converts to it, so `s.recv(buf, deadline_after(5s))` reads as it says.
///
/// Not an aggregate on purpose: g++ 12 destroys an aggregate temporary twice when it appears in
/// a `co_await` expression whose `await_resume` throws (seen with g++ 12.2; clang 14 is right),
/// and a double-destroyed `std::stop_token` corrupts its shared state. Types with a
/// constructor are not affected.
struct op_options {
    using time_point = std::chrono::steady_clock::time_point;

    op_options() noexcept = default;
    op_options(time_point d) noexcept : deadline(d) {}  // NOLINT(google-explicit-constructor)
    op_options(std::stop_token s) noexcept : stop(std::move(s)) {}  // NOLINT
    op_options(time_point d, std::stop_token s) noexcept : deadline(d), stop(std::move(s)) {}

    /// When the operation fails with `std::errc::timed_out` if not complete (a linked
    /// timeout in the kernel, on the steady clock). The default is no deadline.
    time_point deadline = time_point::max();
    /// Requesting a stop cancels the operation; it then fails with
    /// `std::errc::operation_canceled`, and its buffer is not touched afterwards.
    std::stop_token stop{};
    /// Socket transfers: try at once with a non-blocking system call, and use the ring only
    /// for what is left. Saves the ring's round trip when the socket is ready (room in the
    /// send buffer, bytes already received); costs a wasted system call when it is not. Only
    /// for a socket with no other transfer in the same direction in flight.
    bool try_now = false;
};

/// A deadline `timeout` from now, for `op_options::deadline`.
template <class Rep, class Period>
std::chrono::steady_clock::time_point deadline_after(std::chrono::duration<Rep, Period> timeout) {
    auto now = std::chrono::steady_clock::now();
    if (timeout >= std::chrono::steady_clock::time_point::max() - now) {
        return std::chrono::steady_clock::time_point::max();
    }
    return now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
}

namespace detail {
/// The resolution of CLOCK_MONOTONIC_COARSE (one scheduler tick: 1-10 ms), read once.
COROCOLL_DECL std::chrono::nanoseconds coarse_resolution() noexcept;
}  // namespace detail

/// A deadline at least `timeout` from now and at most one scheduler tick (1-10 ms) later,
/// read from CLOCK_MONOTONIC_COARSE (the steady clock's own time, kept by the kernel at tick
/// resolution): a few nanoseconds instead of the 25 ns of a precise read, for what every
/// operation of a process group computes and whose timeout is counted in seconds.
template <class Rep, class Period>
std::chrono::steady_clock::time_point coarse_deadline_after(
    std::chrono::duration<Rep, Period> timeout) {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    auto now = std::chrono::steady_clock::time_point(std::chrono::seconds(ts.tv_sec) +
                                                     std::chrono::nanoseconds(ts.tv_nsec)) +
               detail::coarse_resolution();
    if (timeout >= std::chrono::steady_clock::time_point::max() - now) {
        return std::chrono::steady_clock::time_point::max();
    }
    return now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
}

namespace detail {

/// An absolute CLOCK_MONOTONIC time as io_uring's timeouts take it (steady_clock is
/// CLOCK_MONOTONIC on Linux, in libstdc++ and libc++ alike).
COROCOLL_DECL __kernel_timespec to_kernel_time(std::chrono::steady_clock::time_point t) noexcept;

/// What an operation does after a CQE: finish, or submit again for the rest of its work.
enum class step { done, again };

/// The machinery that every awaitable I/O operation shares, as a CRTP base. `Derived`
/// provides `prep(io_uring_sqe*)` to fill its SQE and `on_result(int res) -> step` to account
/// for a CQE (calling `fail` on errors); it may provide `bool finished_early()` for work that
/// needs no kernel call (a 0-byte transfer).
///
/// Deadline: when set, the SQE is linked to an IORING_OP_LINK_TIMEOUT at the absolute
/// deadline, renewed with every resubmission.
///
/// Cancellation through `std::stop_token`: the stop callback may run on any thread, so it only
/// posts a work item to the reactor; the reactor's thread then withdraws the operation from
/// the backlog or submits IORING_OP_ASYNC_CANCEL for it. The coroutine is resumed once the
/// operation's own CQE has arrived (the kernel is done with the buffer) and, if a cancel was
/// posted, once that item has run too (it lives in this frame). `state_` tracks the two.
template <class Derived>
class basic_op : protected io_op, private corocoll::detail::work_item {
public:
    basic_op(reactor& r, const op_options& options) noexcept
        : reactor_(r), deadline_(options.deadline), stop_(options.stop), try_now_(options.try_now) {
        init();
    }
    /// Operations may be moved (into `when_all`, say) only before they are first awaited.
    basic_op(basic_op&& o) noexcept
        : io_op(),
          work_item(),
          reactor_(o.reactor_),
          deadline_(o.deadline_),
          stop_(o.stop_),
          try_now_(o.try_now_) {
        init();
    }
    basic_op(const basic_op&) = delete;
    basic_op& operator=(const basic_op&) = delete;
    basic_op& operator=(basic_op&&) = delete;

    bool await_ready() const noexcept { return false; }

    bool await_suspend(std::coroutine_handle<> h) {
        continuation_ = h;
        if (stop_.stop_requested()) {
            fail(ECANCELED);
            return false;
        }
        if (derived().finished_early()) return false;
        submit();
        if (stop_.stop_possible()) {
            cancellable_ = true;
            stop_callback_.emplace(stop_, canceller{this});
        }
        return true;
    }

    // Defaults for Derived.
    bool finished_early() noexcept { return false; }

protected:
    Derived& derived() noexcept { return static_cast<Derived&>(*this); }

    void submit() noexcept;

    /// Records errno value `err` as the operation's failure.
    void fail(int err) noexcept { error_ = err; }
    /// Records a corocoll error as the operation's failure.
    void fail(corocoll::errc e) noexcept { library_error_ = e; }
    bool failed() const noexcept { return error_ != 0 || library_error_ != corocoll::errc{}; }
    /// Whether the caller asked for `op_options::try_now`.
    bool try_now() const noexcept { return try_now_; }

    /// Ends the operation for `await_resume`: drops the stop callback (waiting for it if it
    /// runs on another thread right now) and gives the failure, if any, as an error code.
    std::error_code finish() noexcept {
        stop_callback_.reset();
        if (library_error_ != corocoll::errc{}) return make_error_code(library_error_);
        if (error_ == ECANCELED) {
            // A linked timeout and a cancel both end the operation with ECANCELED; the clock
            // tells which, unless the caller asked for the stop.
            if (!cancel_requested_ && !stop_.stop_requested() &&
                deadline_ != std::chrono::steady_clock::time_point::max() &&
                std::chrono::steady_clock::now() >= deadline_) {
                return std::make_error_code(std::errc::timed_out);
            }
            return std::make_error_code(std::errc::operation_canceled);
        }
        if (error_ != 0) return {error_, std::system_category()};
        return {};
    }

    /// Throws the failure as `std::system_error("corocoll: <what>: <reason>")`, if any.
    void throw_if_failed(const std::string& what) {
        if (std::error_code ec = finish()) {
            corocoll::detail::throw_error(ec, "corocoll: " + what);
        }
    }

    reactor& reactor_;

private:
    enum : unsigned char { cqe_done = 1, cancel_posted = 2, cancel_drained = 4 };

    void init() noexcept {
        io_op::prepare_ = &prepare_fn;
        io_op::complete_ = &complete_fn;
        if (deadline_ != std::chrono::steady_clock::time_point::max()) {
            timeout_ = to_kernel_time(deadline_);
            io_op::sqes_ = 2;
        }
        cancel_.target_ = this;
        cancel_.prepare_ = &prepare_cancel;
        cancel_.tracked_ = false;
        work_item::run_ = &drain_cancel;
    }

    struct canceller {
        basic_op* self_;
        void operator()() const noexcept { self_->on_stop_requested(); }
    };

    struct cancel_sqe : io_op {
        basic_op* target_ = nullptr;
    };

    static void prepare_fn(io_op* op, io_uring* ring) noexcept {
        auto* self = static_cast<basic_op*>(op);
        io_uring_sqe* sqe = io_uring_get_sqe(ring);
        self->derived().prep(sqe);
        io_uring_sqe_set_data(sqe, op);
        if (self->sqes_ == 2) {
            sqe->flags |= IOSQE_IO_LINK;
            io_uring_sqe* t = io_uring_get_sqe(ring);
            io_uring_prep_link_timeout(t, &self->timeout_, IORING_TIMEOUT_ABS);
            io_uring_sqe_set_data64(t, ignored_user_data);
        }
    }

    static void complete_fn(io_op* op, int res) noexcept {
        auto* self = static_cast<basic_op*>(op);
        step s = self->derived().on_result(res);
        if (s == step::again) {
            if (!self->cancel_requested_) {
                self->submit();
                return;
            }
            self->fail(ECANCELED);
        }
        self->on_final_cqe();
    }

    void on_final_cqe() noexcept {
        if (cancellable_) {
            auto old = state_.fetch_or(cqe_done, std::memory_order_acq_rel);
            // A cancel item is on its way to the reactor and points into this frame: let
            // it resume us when it runs.
            if ((old & cancel_posted) != 0 && (old & cancel_drained) == 0) return;
        }
        resume();
    }

    void resume() noexcept {
        withdraw_cancel();
        continuation_.resume();
    }

    // Any thread.
    void on_stop_requested() noexcept {
        auto old = state_.fetch_or(cancel_posted, std::memory_order_acq_rel);
        if ((old & cqe_done) != 0) return;
        post_cancel();
    }

    void post_cancel() noexcept;
    void withdraw_cancel() noexcept;
    bool withdraw_self() noexcept;
    void submit_cancel() noexcept;

    // The reactor's thread, from the posted work item.
    static void drain_cancel(corocoll::detail::work_item* item) noexcept {
        auto* self = static_cast<basic_op*>(item);
        auto old = self->state_.fetch_or(cancel_drained, std::memory_order_acq_rel);
        if ((old & cqe_done) != 0) {
            self->resume();
            return;
        }
        self->cancel_requested_ = true;
        if (self->withdraw_self()) {
            // Never reached the kernel: nothing to wait for.
            self->fail(ECANCELED);
            self->state_.fetch_or(cqe_done, std::memory_order_acq_rel);
            self->resume();
            return;
        }
        self->submit_cancel();
    }

    static void prepare_cancel(io_op* op, io_uring* ring) noexcept {
        auto* c = static_cast<cancel_sqe*>(op);
        io_uring_sqe* sqe = io_uring_get_sqe(ring);
        io_uring_prep_cancel64(sqe, reinterpret_cast<__u64>(static_cast<io_op*>(c->target_)), 0);
        io_uring_sqe_set_data64(sqe, ignored_user_data);
    }

    std::chrono::steady_clock::time_point deadline_;
    std::stop_token stop_;
    bool try_now_ = false;
    std::coroutine_handle<> continuation_;
    __kernel_timespec timeout_{};
    int error_ = 0;
    corocoll::errc library_error_{};
    bool cancellable_ = false;
    bool cancel_requested_ = false;
    std::atomic<unsigned char> state_{0};
    cancel_sqe cancel_;
    std::optional<std::stop_callback<canceller>> stop_callback_;
};

}  // namespace detail

}  // namespace io

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/io/detail/impl/basic_op.ipp>
#endif
