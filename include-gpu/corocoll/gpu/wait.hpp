#pragma once

// Waiting for the GPU without blocking the reactor: a condition the reactor polls on every
// turn (io::poll_entry), with a deadline. CUDA events and NCCL's asynchronous state are both
// awaited through it.

#include <corocoll/core/event_loop.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/gpu/cuda.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/version.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <coroutine>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

COROCOLL_BEGIN_NAMESPACE

namespace gpu {

/// What a polled condition reports.
enum class progress { pending, done, failed };

/// Names a wait in its errors: "corocoll: rank 3: all_reduce: ...".
struct wait_label {
    const char* op = "wait";
    int rank = -1;

    std::string prefix() const {
        return "corocoll: " + (rank >= 0 ? "rank " + std::to_string(rank) + ": " : std::string()) +
               op + ": ";
    }
};

/// Awaitable: suspends until `check(why)` says done or failed (the reactor asks it on every
/// turn, see io::poll_entry) or the deadline passes. Fails with `std::runtime_error` naming
/// the op, the rank and `why`; a deadline with `std::system_error` (std::errc::timed_out).
/// `check` is `progress(std::string& why) noexcept`; it is asked once before suspending, so a
/// finished condition costs no reactor turn.
template <class Check>
class polled_wait : public io::poll_entry, public corocoll::detail::work_item {
public:
    polled_wait(io::reactor& r, Check check, std::chrono::steady_clock::time_point deadline,
                wait_label label)
        : reactor_(r), check_(std::move(check)), deadline_(deadline), label_(label) {
        poll = &on_poll;
        run_ = &on_run;
    }
    polled_wait(const polled_wait&) = delete;
    polled_wait& operator=(const polled_wait&) = delete;
    /// A coroutine destroyed while it waits here leaves no entry behind in the reactor.
    ~polled_wait() { reactor_.unwatch(*this); }

    bool await_ready() noexcept {
        state_ = check_(why_);
        return state_ != progress::pending;
    }
    void await_suspend(std::coroutine_handle<> h) noexcept {
        waiter_ = h;
        reactor_.watch(*this);
    }
    void await_resume() const {
        if (state_ == progress::done) return;
        if (timed_out_) {
            throw std::system_error(std::make_error_code(std::errc::timed_out),
                                    label_.prefix() + why_);
        }
        throw std::runtime_error(label_.prefix() + why_);
    }

private:
    static bool on_poll(io::poll_entry& e) noexcept {
        auto& self = static_cast<polled_wait&>(e);
        self.state_ = self.check_(self.why_);
        if (self.state_ == progress::pending) {
            if (std::chrono::steady_clock::now() < self.deadline_) return false;
            self.state_ = progress::failed;
            self.timed_out_ = true;
            if (self.why_.empty()) self.why_ = "the GPU did not finish before the deadline";
        }
        self.reactor_.unwatch(self);
        self.reactor_.post(self);
        return true;
    }
    static void on_run(corocoll::detail::work_item* item) noexcept {
        std::exchange(static_cast<polled_wait*>(item)->waiter_, {}).resume();
    }

    io::reactor& reactor_;
    Check check_;
    std::chrono::steady_clock::time_point deadline_;
    wait_label label_;
    progress state_ = progress::pending;
    bool timed_out_ = false;
    std::string why_;
    std::coroutine_handle<> waiter_;
};

/// `co_await gpu::until(reactor, check, deadline, label)`: see `polled_wait`.
template <class Check>
polled_wait<Check> until(io::reactor& r, Check check,
                         std::chrono::steady_clock::time_point deadline, wait_label label) {
    return polled_wait<Check>(r, std::move(check), deadline, label);
}

/// The check of a CUDA event: done once the work recorded before it has run.
inline progress query_event(cudaEvent_t e, std::string& why) noexcept {
    cudaError_t rc = cudaEventQuery(e);
    if (rc == cudaSuccess) return progress::done;
    if (rc == cudaErrorNotReady) return progress::pending;
    (void)cudaGetLastError();
    why = std::string("cudaEventQuery: ") + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) +
          ")";
    return progress::failed;
}

/// Awaitable: waits until the work enqueued on `s` so far has run, polling an event the
/// reactor checks on every turn: the thread goes on running other coroutines meanwhile
/// (cudaStreamSynchronize would block it). The event is created and destroyed here, on the
/// stream's device (cudaEventRecord fails for an event of another device); the GPU layer's
/// groups keep theirs in a pool. The caller's current device is left as it was.
inline task<> synchronize(
    io::reactor& r, cudaStream_t s,
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max(),
    wait_label label = {"synchronize", -1}) {
    int device = 0;
    check_cuda(cudaStreamGetDevice(s, &device), "cudaStreamGetDevice");
    std::optional<event> e;
    {
        device_guard on(device);
        e.emplace();
        e->record(s);
    }
    cudaEvent_t raw = e->get();
    co_await until(
        r, [raw](std::string& why) noexcept { return query_event(raw, why); }, deadline, label);
}

}  // namespace gpu

COROCOLL_END_NAMESPACE
