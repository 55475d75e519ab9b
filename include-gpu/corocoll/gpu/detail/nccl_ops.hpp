#pragma once

// The op machinery of an NCCL group (<corocoll/gpu/nccl_group.hpp>): how one NCCL call (or
// group of calls) is enqueued and awaited, and how the first failure aborts the communicator.
//
// How an operation runs: under the group's enqueue lock (so that every rank issues its NCCL
// calls in program order, and no call is made while the non-blocking communicator is still
// busy with the previous one), the NCCL call is made on the group's stream; if NCCL answers
// ncclInProgress, the reactor polls ncclCommGetAsyncError until it is done; then an event is
// recorded on the stream and the lock released. The awaiting coroutine then waits for the
// event, which the reactor polls on every turn together with the communicator's asynchronous
// error and the op's deadline. A failure or a deadline aborts the communicator (ncclCommAbort)
// and fails that op and every pending and later op of the group with a message naming the
// first failed op and the rank.

#include <corocoll/collectives/checks.hpp>
#include <corocoll/collectives/reduce_op.hpp>
#include <corocoll/core/async_mutex.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/core/work.hpp>
#include <corocoll/gpu/cuda.hpp>
#include <corocoll/gpu/nccl.hpp>
#include <corocoll/gpu/wait.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/version.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <coroutine>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace gpu::detail {

/// Whether the non-blocking communicator `c` has finished its last call (one
/// ncclCommGetAsyncError); on failure `why` says NCCL's reason.
inline progress comm_progress(ncclComm_t c, std::string& why) noexcept {
    ncclResult_t state = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(c, &state);
    if (rc != ncclSuccess) {
        why = "ncclCommGetAsyncError: " + describe_nccl(rc, c);
        return progress::failed;
    }
    if (state == ncclInProgress) return progress::pending;
    if (state != ncclSuccess) {
        why = "NCCL: " + describe_nccl(state, c);
        return progress::failed;
    }
    return progress::done;
}

/// What one NCCL call was asked to do, for the error NCCL returns for it: "8 float32
/// elements, sum". No `op`: a call without a reduction; no `count`: a call of several parts
/// (all_to_all, batched send/recv), which the error does not spell out.
struct nccl_call {
    std::optional<std::size_t> count;
    ncclDataType_t type = ncclFloat32;
    std::optional<reduce_op> op = std::nullopt;

    std::string describe() const {
        if (!count) return {};
        std::string out =
            " (asked: " + std::to_string(*count) + " " + nccl_type_name(type) + " elements";
        if (op) out += std::string(", ") + op_name(*op);
        return out + ")";
    }
};

/// `calls()` between ncclGroupStart and ncclGroupEnd; the first error of the two.
template <class F>
ncclResult_t grouped(F calls) {
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) return rc;
    ncclResult_t inner = calls();
    ncclResult_t end = ncclGroupEnd();
    return inner != ncclSuccess ? inner : end;
}

/// The one completion that the operations of a `batch_isend_irecv` wait for.
struct nccl_batch {
    work<> run;
    bool finished = false;
    std::exception_ptr error;
    std::vector<std::coroutine_handle<>> waiters;
};

/// Ends `batch` with `error` (null: success) and wakes every waiter.
inline void fail_batch(nccl_batch& batch, std::exception_ptr error) noexcept {
    batch.error = std::move(error);
    batch.finished = true;
    auto waiters = std::move(batch.waiters);
    for (auto h : waiters) h.resume();
}

/// Awaits `op`, the batch's NCCL group, then wakes every waiter of `batch` with its outcome.
inline task<> finish_batch(task<> op, std::shared_ptr<nccl_batch> batch) {
    std::exception_ptr error;
    try {
        co_await std::move(op);
    } catch (...) {
        error = std::current_exception();
    }
    fail_batch(*batch, std::move(error));
}

/// `t`'s completion without its value.
inline task<> discard(task<int> t) { (void)co_await std::move(t); }

/// Waits for `batch` to finish; yields `peer`, or rethrows the batch's error.
inline task<int> await_batch(std::shared_ptr<nccl_batch> batch, int peer) {
    struct awaiter {
        nccl_batch& b;
        bool await_ready() const noexcept { return b.finished; }
        void await_suspend(std::coroutine_handle<> h) { b.waiters.push_back(h); }
        void await_resume() const {
            if (b.error) std::rethrow_exception(b.error);
        }
    };
    co_await awaiter{*batch};
    co_return peer;
}

/// The op machinery of one NCCL group: the communicator, the stream operations are enqueued
/// on, the enqueue lock, a pool of events and the first failure. `run` is one operation (see
/// the top of this file). Bound to the reactor of the thread that created it.
class nccl_ops {
public:
    using duration = std::chrono::milliseconds;

    /// Takes `comm`; a null `stream` makes a stream of its own.
    nccl_ops(io::reactor& r, int rank, int device, duration timeout, ncclComm_t comm,
             cudaStream_t stream)
        : reactor_(r), rank_(rank), device_(device), timeout_(timeout), comm_(comm) {
        if (stream == nullptr) {
            device_guard on(device_);  // the caller may be on another device by now
            own_stream_.emplace();
            stream = own_stream_->get();
        }
        group_stream_ = stream_ = stream;
    }
    nccl_ops(const nccl_ops&) = delete;
    nccl_ops& operator=(const nccl_ops&) = delete;

    io::reactor& reactor() const noexcept { return reactor_; }
    int rank() const noexcept { return rank_; }
    int device() const noexcept { return device_; }
    duration timeout() const noexcept { return timeout_; }
    /// Null once closed or aborted.
    ncclComm_t comm() const noexcept { return comm_; }
    cudaStream_t stream() const noexcept { return stream_; }
    /// Null goes back to the stream given at construction (or the own one).
    void set_stream(cudaStream_t s) noexcept { stream_ = s != nullptr ? s : group_stream_; }
    /// The first failure; empty if there was none.
    const std::string& failure() const noexcept { return failure_; }

    /// "corocoll: rank R: `what`: ", the start of this rank's errors. Allocates.
    std::string prefix(const char* what) const { return collectives::error_prefix(rank_, what); }

    /// Runs one NCCL call (or group) `enqueue(comm, stream)` and waits for the GPU to finish
    /// it (see the top of this file). Bounded by the timeout; any failure fails every later
    /// op: NCCL keeps even an argument error on a non-blocking communicator and returns it
    /// from every later call (enqueue.cc ≈ 2675, init.cc ≈ 373-389 at v2.28.9-1). The
    /// caller's current device is left as it was.
    template <class Enqueue>
    task<> run(const char* op, Enqueue enqueue, nccl_call call = {}) {
        wait_label label{op, rank_};
        if (closed_ || comm_ == nullptr) throw std::runtime_error(prefix(op) + unusable());
        auto deadline = io::deadline_after(timeout_);
        co_await lock_.lock();
        cudaEvent_t done = nullptr;
        std::exception_ptr error;
        try {
            if (closed_ || comm_ == nullptr) throw std::runtime_error(prefix(op) + unusable());
            cudaStream_t stream = stream_;  // once: set_stream may run while this op waits
            ncclResult_t rc = ncclSuccess;
            {
                device_guard on(device_);
                rc = enqueue(comm_, stream);
            }
            if (rc == ncclInProgress) {
                co_await until(
                    reactor_, [this](std::string& why) noexcept { return enqueue_progress(why); },
                    deadline, label);
            } else if (rc != ncclSuccess) {
                throw nccl_error(
                    rc, prefix(op) + "NCCL: " + describe_nccl(rc, comm_) + call.describe());
            }
            // After the wait: another coroutine of this thread may have switched devices, and
            // the event must be of the stream's device.
            device_guard on(device_);
            done = events_.take();
            check_cuda(cudaEventRecord(done, stream), "cudaEventRecord");
        } catch (...) {
            error = std::current_exception();
        }
        lock_.unlock();
        if (!error) {
            try {
                co_await until(
                    reactor_,
                    [this, done](std::string& why) noexcept { return op_progress(done, why); },
                    deadline, label);
                events_.give(done);
                co_return;
            } catch (...) {
                error = std::current_exception();
            }
        }
        if (done != nullptr) (void)cudaEventDestroy(done);
        if (!closed_) fail(op, error);
        std::rethrow_exception(error);
    }

    /// ncclCommAbort: every pending and later op fails with `why`. Idempotent; the first
    /// reason stays.
    void abort(const std::string& why) noexcept {
        if (failure_.empty()) failure_ = why.empty() ? "aborted" : why;
        aborted_ = true;
        if (comm_ != nullptr) {
            (void)ncclCommAbort(comm_);
            comm_ = nullptr;
        }
    }

    /// Finishes the communicator (ncclCommFinalize, polled, then ncclCommDestroy; an aborted
    /// one is already gone) under the enqueue lock: ops queued before run first, later ones
    /// fail as closed. Aborts it if it does not finalize, and rethrows why. Idempotent.
    task<> close() {
        auto deadline = io::deadline_after(timeout_);
        std::exception_ptr error;
        // Under the lock: ops queued before run first, and no NCCL call may meet a
        // communicator that is still in progress. Ops queued after fail as closed.
        co_await lock_.lock();
        closed_ = true;
        if (comm_ != nullptr) {
            try {
                ncclResult_t rc = ncclCommFinalize(comm_);
                if (rc == ncclInProgress) {
                    // Through comm_: a failing op may abort (and free) it meanwhile.
                    co_await until(
                        reactor_,
                        [this](std::string& why) noexcept { return enqueue_progress(why); },
                        deadline, {"close", rank_});
                } else if (rc != ncclSuccess) {
                    throw nccl_error(
                        rc, prefix("close") + "ncclCommFinalize: " + describe_nccl(rc, comm_));
                }
                if (comm_ != nullptr) (void)ncclCommDestroy(comm_);
                comm_ = nullptr;
                if (failure_.empty()) failure_ = "the NCCL group was closed";
            } catch (...) {
                error = std::current_exception();
            }
            if (error) abort(prefix("close") + "the communicator did not finalize");
        }
        lock_.unlock();
        if (error) std::rethrow_exception(error);
    }

private:
    // Why an op cannot run: closed, or aborted by an earlier failure.
    std::string unusable() const {
        return aborted_ && !failure_.empty() ? "the NCCL group was aborted: " + failure_
                                             : std::string("the NCCL group is closed");
    }

    // The first failure aborts the communicator; its text is what every later op reports.
    void fail(const char* op, std::exception_ptr error) noexcept {
        if (!failure_.empty()) return;
        std::string why = prefix(op) + "failed";
        try {
            std::rethrow_exception(error);
        } catch (const std::exception& e) {
            why = e.what();
        } catch (...) {
        }
        abort(why);
    }

    progress enqueue_progress(std::string& why) noexcept {
        if (comm_ == nullptr) {
            why = unusable();
            return progress::failed;
        }
        return comm_progress(comm_, why);
    }

    // An op's event: after an abort the op failed, whatever the event says (ncclCommAbort
    // ends the kernels, and the event then completes). After close it is done once the event
    // is: finalize waited for NCCL's part, and the event only for work queued after it.
    progress op_progress(cudaEvent_t done, std::string& why) noexcept {
        if (aborted_) {
            why = unusable();
            return progress::failed;
        }
        progress p = query_event(done, why);
        if (p != progress::pending || comm_ == nullptr) return p;
        // A peer that died or a network error shows here, not in the event.
        p = comm_progress(comm_, why);
        return p == progress::failed ? p : progress::pending;
    }

    io::reactor& reactor_;
    int rank_;
    int device_;
    duration timeout_;
    ncclComm_t comm_;
    std::optional<gpu::stream> own_stream_;
    cudaStream_t group_stream_ = nullptr;
    cudaStream_t stream_ = nullptr;
    async_mutex lock_;
    event_pool events_;
    std::string failure_;
    bool closed_ = false;
    bool aborted_ = false;
};

}  // namespace gpu::detail

COROCOLL_END_NAMESPACE
