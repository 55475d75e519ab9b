#pragma once

// Helpers shared by the io tests and those built on sockets: a connected pair of sockets, the
// check that a call throws std::system_error, a poll entry that waits for a flag, and the
// clock readings that the timing suite needs. Test code only; not installed.

#include "pattern.hpp"

#include <corocoll/corocoll.hpp>

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

namespace corocoll_test {

namespace cc = corocoll;
using namespace std::chrono_literals;

/// A connected pair of loopback sockets on reactor `r` (accepted side first).
inline cc::task<std::pair<cc::io::socket, cc::io::socket>> connected_pair(cc::io::reactor& r) {
    auto listener = cc::io::acceptor::listen(r, cc::io::endpoint::loopback(0));
    auto guard = cc::io::op_options(cc::io::deadline_after(10s));
    auto [accepted, connected] = co_await cc::when_all(
        listener.accept(guard), cc::io::socket::connect(r, listener.local_endpoint(), guard));
    co_return std::pair{std::move(accepted), std::move(connected)};
}

/// Runs `body` and returns the std::system_error it throws (fails the test if none).
template <class F>
std::system_error expect_system_error(F&& body) {
    try {
        body();
    } catch (const std::system_error& e) {
        return e;
    }
    throw std::runtime_error("expected a std::system_error, none was thrown");
}

/// Waits, through a watched poll entry, until `flag` is set (by another thread): the shape of
/// the GPU layer's CUDA event waits, without a GPU. `polls` counts the times it was asked.
struct flag_wait : cc::io::poll_entry, cc::detail::work_item {
    cc::io::reactor* r = nullptr;
    const std::atomic<bool>* flag = nullptr;
    std::coroutine_handle<> waiter;
    int polls = 0;

    flag_wait(cc::io::reactor& reactor, const std::atomic<bool>& f) : r(&reactor), flag(&f) {
        poll = &on_poll;
        run_ = &on_run;
    }
    static bool on_poll(cc::io::poll_entry& e) noexcept {
        auto& w = static_cast<flag_wait&>(e);
        ++w.polls;
        if (!w.flag->load(std::memory_order_acquire)) return false;
        w.r->unwatch(w);
        w.r->post(w);
        return true;
    }
    static void on_run(cc::detail::work_item* i) noexcept {
        std::exchange(static_cast<flag_wait*>(i)->waiter, {}).resume();
    }
    flag_wait(const flag_wait&) = delete;
    flag_wait& operator=(const flag_wait&) = delete;

    // A separate awaiter: g++ 12 copies an lvalue awaiter into the coroutine frame.
    auto wait() noexcept {
        struct awaiter {
            flag_wait* w;
            bool await_ready() const noexcept { return false; }
            void await_suspend(std::coroutine_handle<> h) noexcept {
                w->waiter = h;
                w->r->watch(*w);
            }
            void await_resume() const noexcept {}
        };
        return awaiter{this};
    }
};

/// A thread that sets `flag` after `d` (joined when the returned object is destroyed).
inline std::jthread set_after(std::chrono::milliseconds d, std::atomic<bool>& flag) {
    return std::jthread([d, &flag] {
        std::this_thread::sleep_for(d);
        flag.store(true, std::memory_order_release);
    });
}

/// Milliseconds of wall time since `since`. Asserting that something took at least a time
/// holds on any machine; asserting that it took at most one belongs in the timing suite.
inline double elapsed_ms(std::chrono::steady_clock::time_point since) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since)
        .count();
}

/// CPU time the calling thread has used, in milliseconds; for the timing suite only (what a
/// loaded machine grants a thread is no property of the code).
inline double thread_cpu_ms() {
    rusage u{};
    getrusage(RUSAGE_THREAD, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

}  // namespace corocoll_test
