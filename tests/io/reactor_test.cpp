#include "../support/io.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

using namespace corocoll_test;

TEST_CASE("the reactor probes io_uring set-up flags and falls back to what the kernel has") {
    cc::io::reactor r;
    const auto& f = r.features();
    // DEFER_TASKRUN needs SINGLE_ISSUER, and COOP_TASKRUN is only the fallback for it.
    if (f.defer_taskrun) CHECK(f.single_issuer);
    CHECK_FALSE((f.defer_taskrun && f.coop_taskrun));
    // The flag is only asked for beside one of the two.
    if (f.taskrun_flag) CHECK((f.defer_taskrun || f.coop_taskrun));
    MESSAGE("single_issuer=" << f.single_issuer << " defer_taskrun=" << f.defer_taskrun
                             << " coop_taskrun=" << f.coop_taskrun << " submit_all=" << f.submit_all
                             << " taskrun_flag=" << f.taskrun_flag);
    CHECK(r.sq_entries() >= 256);
    CHECK(r.in_flight() == 0);
}

TEST_CASE("a thread can have only one reactor, and each thread can have its own") {
    cc::io::reactor r;
    CHECK(cc::io::reactor::current() == &r);
    CHECK_THROWS_AS(cc::io::reactor(), std::logic_error);
    bool other_ok = false;
    std::thread t([&] {
        cc::io::reactor mine;
        other_ok = cc::io::reactor::current() == &mine && (mine.run(mine.sleep_for(1ms)), true);
    });
    t.join();
    CHECK(other_ok);
    CHECK(cc::io::reactor::current() == &r);
}

// How late a timer fires is the machine's to decide: timing_test (suite "timing") looks.
TEST_CASE("a reactor sets its thread's timer slack while it lives, and gives the old one back") {
    REQUIRE(::prctl(PR_SET_TIMERSLACK, 50000ul, 0, 0, 0) == 0);
    {
        cc::io::reactor r;
        CHECK(::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == 1000);
    }
    CHECK(::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == 50000);
    {
        cc::io::reactor_options o;
        o.timer_slack = std::chrono::nanoseconds(0);  // left alone
        cc::io::reactor r(o);
        CHECK(::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == 50000);
    }
}

TEST_CASE("a timer never fires early") {
    cc::io::reactor r;
    for (auto d : {1ms, 20ms, 60ms}) {
        auto t0 = std::chrono::steady_clock::now();
        r.run(r.sleep_for(d));
        CAPTURE(d.count());
        CHECK(elapsed_ms(t0) >= static_cast<double>(d.count()) - 0.5);
    }
    auto until = std::chrono::steady_clock::now() + 30ms;
    r.run(r.sleep_until(until));
    CHECK(std::chrono::steady_clock::now() >= until);
}

TEST_CASE("timers run concurrently: ten 50 ms sleeps are all in flight at once") {
    cc::io::reactor r;
    std::vector<std::size_t> others_in_flight;
    auto one = [&]() -> cc::task<> {
        co_await r.sleep_for(50ms);
        others_in_flight.push_back(r.in_flight());
    };
    std::vector<cc::task<>> sleeps;
    for (int i = 0; i < 10; ++i) sleeps.push_back(one());
    auto t0 = std::chrono::steady_clock::now();
    r.run(cc::when_all(std::move(sleeps)));
    CHECK(elapsed_ms(t0) >= 49.0);
    // Whichever woke first found the nine others still waiting, however late it woke.
    REQUIRE(others_in_flight.size() == 10);
    CHECK(others_in_flight.front() == 9);
}

TEST_CASE("a timer cancelled through its stop token ends early with operation_canceled") {
    cc::io::reactor r;
    std::stop_source stop;
    auto body = [&]() -> cc::task<> {
        auto sleeper = [&]() -> cc::task<> { co_await r.sleep_for(10s, stop.get_token()); };
        auto canceller = [&]() -> cc::task<> {
            co_await r.sleep_for(10ms);
            stop.request_stop();
        };
        co_await cc::when_all(sleeper(), canceller());
    };
    // Only the cancellation can end a 10 s sleep with operation_canceled.
    auto e = expect_system_error([&] { r.run(body()); });
    CHECK(e.code() == std::errc::operation_canceled);
    CHECK(r.in_flight() == 0);
}

namespace {

// What `r`'s loop did while `body` ran.
template <class F>
cc::io::reactor_stats stats_during(cc::io::reactor& r, F body) {
    const cc::io::reactor_stats before = r.stats();
    body();
    const cc::io::reactor_stats& after = r.stats();
    return {.turns = after.turns - before.turns,
            .polls = after.polls - before.polls,
            .yields = after.yields - before.yields,
            .kernel_waits = after.kernel_waits - before.kernel_waits,
            .enters = after.enters - before.enters,
            .wakeups = after.wakeups - before.wakeups};
}

}  // namespace

TEST_CASE("the idle reactor sleeps in the kernel instead of spinning") {
    // Whether other programs keep this host busy (then polls yield) is not ours to know here.
    cc::io::reactor r({.yield_when_host_busy = false, .yield_after = 50us});
    auto s = stats_during(r, [&] { r.run(r.sleep_for(200ms)); });
    CAPTURE(s.turns);
    CAPTURE(s.polls);
    // It polls for busy_poll (50 µs) at most, then sleeps in the kernel until the timer's
    // completion: one wait, not a turn of the loop per look at the ring.
    CHECK(s.kernel_waits >= 1);
    CHECK(s.turns <= 3);
    CHECK(s.yields == 0);
}

TEST_CASE("a spinning reactor still completes operations, never sleeping in the kernel") {
    cc::io::reactor r({.spin = true});
    auto t0 = std::chrono::steady_clock::now();
    auto s = stats_during(r, [&] { r.run(r.sleep_for(200ms)); });
    CHECK(elapsed_ms(t0) >= 199.0);
    CAPTURE(s.polls);
    CHECK(s.kernel_waits == 0);
    CHECK(s.polls >= 2);
    CHECK(s.turns >= s.polls);
}

TEST_CASE("1,000 concurrent timers on a ring with 4 SQ entries all complete") {
    cc::io::reactor r({.sq_entries = 4});
    REQUIRE(r.sq_entries() == 4);
    std::atomic<int> fired{0};
    std::vector<cc::task<>> timers;
    auto one = [](cc::io::reactor& rr, int i, std::atomic<int>& n) -> cc::task<> {
        co_await rr.sleep_for(std::chrono::microseconds(100 * (i % 50)));
        ++n;
    };
    for (int i = 0; i < 1000; ++i) timers.push_back(one(r, i, fired));
    r.run(cc::when_all(std::move(timers)));
    CHECK(fired == 1000);
    CHECK(r.in_flight() == 0);
}

TEST_CASE("a read whose data comes after it was armed completes while others complete at once") {
    // Eight readers find a byte in their pipes every time they read, so each of their reads
    // completes when it is submitted, and with a queue of 4 entries the loop submits while
    // it reaps: completions keep coming. One more reader's read is armed on an empty pipe and
    // its byte written later; with deferred task work the kernel posts that completion only
    // when the reactor asks for events. It must not wait for the busy readers to run dry
    // (65,536 reads each): count their reads before it completes, not the time.
    cc::io::reactor r({.sq_entries = 4});
    constexpr int busy = 8;
    constexpr std::size_t bytes_each = 1 << 16;
    std::vector<std::array<int, 2>> pipes(busy + 1);
    for (auto& p : pipes) REQUIRE(::pipe2(p.data(), O_CLOEXEC) == 0);
    for (int i = 0; i < busy; ++i) {
        auto& p = pipes[static_cast<std::size_t>(i)];
        REQUIRE(::fcntl(p[1], F_SETPIPE_SZ, static_cast<int>(bytes_each)) >= 0);
        std::string fill(bytes_each, 'b');
        REQUIRE(::write(p[1], fill.data(), fill.size()) == static_cast<ssize_t>(fill.size()));
    }
    auto& late = pipes.back();
    std::size_t busy_reads = 0;
    std::size_t busy_reads_when_late_done = 0;
    bool late_done = false;
    auto late_reader = [&]() -> cc::task<> {
        std::array<std::byte, 1> b{};
        CHECK(co_await r.read_some(late[0], b) == 1);
        late_done = true;
        busy_reads_when_late_done = busy_reads;
    };
    auto busy_reader = [&](int fd) -> cc::task<> {
        std::array<std::byte, 1> b{};
        for (std::size_t i = 0; i < bytes_each && !late_done; ++i) {
            CHECK(co_await r.read_some(fd, b) == 1);
            // The late byte goes in once the late read has surely been submitted.
            if (++busy_reads == 64) CHECK(::write(late[1], "x", 1) == 1);
        }
    };
    std::vector<cc::task<>> readers;
    readers.push_back(late_reader());
    for (int i = 0; i < busy; ++i)
        readers.push_back(busy_reader(pipes[static_cast<std::size_t>(i)][0]));
    r.run(cc::when_all(std::move(readers)));
    for (auto& p : pipes) {
        ::close(p[0]);
        ::close(p[1]);
    }
    CHECK(late_done);
    MESSAGE("busy reads before the late one completed: "
            << busy_reads_when_late_done << " (deferred task work: " << r.features().defer_taskrun
            << ")");
    // At most a few turns of the loop after the byte was written, not 8 x 65,536.
    CHECK(busy_reads_when_late_done < 1000);
}

TEST_CASE("schedule moves a coroutine from another thread onto the reactor's thread") {
    cc::io::reactor r;
    auto reactor_thread = std::this_thread::get_id();
    std::thread::id resumed_on;
    std::atomic<bool> done{false};
    auto hop = [&]() -> cc::task<> {
        co_await r.schedule();
        resumed_on = std::this_thread::get_id();
    };
    // Started on a plain thread (no reactor there), it must finish on ours.
    std::thread t([&] {
        cc::sync_wait(hop());
        done = true;
    });
    // Keep the reactor running until the other thread is done.
    auto wait_done = [&]() -> cc::task<> {
        while (!done) co_await r.sleep_for(1ms);
    };
    r.run(wait_done());
    t.join();
    CHECK(resumed_on == reactor_thread);
}

TEST_CASE("wake from another thread ends sync_wait's sleep when work completes elsewhere") {
    cc::io::reactor r;
    // A hand-made event that another thread completes: the reactor sleeps in the kernel until
    // the completing thread wakes it through the eventfd.
    struct event {
        std::coroutine_handle<> waiter;
        std::atomic<bool> armed{false};
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<> h) noexcept {
            waiter = h;
            armed = true;
        }
        void await_resume() const noexcept {}
    } ev;
    std::thread t([&] {
        while (!ev.armed) std::this_thread::yield();
        std::this_thread::sleep_for(20ms);
        ev.waiter.resume();  // resumes on this thread; sync_wait's signal wakes the reactor
    });
    auto t0 = std::chrono::steady_clock::now();
    auto s = stats_during(r, [&] { r.run(ev); });
    t.join();
    CHECK(elapsed_ms(t0) >= 19.0);
    // Nothing was in flight to poll for: the reactor slept, and the other thread woke it.
    CHECK(s.polls == 0);
    CHECK(s.kernel_waits >= 1);
    CHECK(s.wakeups >= 1);
}

TEST_CASE("offload runs work on a pool thread and resumes on the reactor, which keeps going") {
    cc::io::reactor r;
    auto reactor_thread = std::this_thread::get_id();
    std::atomic<int> ticks{0};
    std::atomic<bool> computing{true};
    auto body = [&]() -> cc::task<> {
        auto compute = [&]() -> cc::task<std::thread::id> {
            auto worker = co_await cc::offload([&] {
                // Stands in for CPU work that lasts until the reactor has ticked a few times.
                while (ticks.load() < 3) std::this_thread::sleep_for(1ms);
                computing = false;
                return std::this_thread::get_id();
            });
            CHECK(std::this_thread::get_id() == reactor_thread);
            co_return worker;
        };
        auto ticker = [&]() -> cc::task<> {
            while (computing) {
                co_await r.sleep_for(5ms);
                ++ticks;
            }
        };
        auto [worker, unused] = co_await cc::when_all(compute(), ticker());
        CHECK(worker != reactor_thread);
    };
    r.run(body());
    // The pool's work could end only because the reactor ran timers meanwhile.
    CHECK(ticks >= 3);
}

TEST_CASE("work posted from the reactor's own thread while posted work runs is not stranded") {
    // Each schedule() posts from the loop's thread, during the drain that resumed the previous
    // one; no eventfd wake is written for those, so the loop must see them before it sleeps.
    cc::io::reactor r;
    auto hops = [&]() -> cc::task<int> {
        int n = 0;
        for (; n < 10000; ++n) co_await r.schedule();
        co_return n;
    };
    auto guard = [&]() -> cc::task<> { co_await r.sleep_for(10ms); };
    auto [n, unused] = r.run(cc::when_all(hops(), guard()));
    CHECK(n == 10000);
}

TEST_CASE("posted work items run on the reactor's thread in the order they were posted") {
    cc::io::reactor r;
    struct item : cc::detail::work_item {
        std::vector<int>* out;
        int value;
    };
    std::vector<int> order;
    std::vector<item> items(100);
    for (int i = 0; i < 100; ++i) {
        items[i].out = &order;
        items[i].value = i;
        items[i].run_ = [](cc::detail::work_item* w) noexcept {
            auto* it = static_cast<item*>(w);
            it->out->push_back(it->value);
        };
    }
    std::thread t([&] {
        for (auto& it : items) r.post(it);
    });
    t.join();
    auto wait = [&]() -> cc::task<> {
        while (order.size() < 100) co_await r.sleep_for(1ms);
    };
    r.run(wait());
    std::vector<int> expected(100);
    for (int i = 0; i < 100; ++i) expected[i] = i;
    CHECK(order == expected);
}

TEST_CASE("rings set up as older kernels would (no DEFER_TASKRUN, or no flags) work the same") {
    for (unsigned allowed : {unsigned{IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL}, 0u}) {
        CAPTURE(allowed);
        cc::io::reactor r({.sq_entries = 8, .allowed_setup_flags = allowed});
        CHECK_FALSE(r.features().defer_taskrun);
        CHECK_FALSE(r.features().single_issuer);
        CHECK(r.features().coop_taskrun == (allowed != 0));
        auto conn = r.run(connected_pair(r));
        // Plain references: clang 14 cannot capture structured bindings in lambdas.
        auto& a = conn.first;
        auto& b = conn.second;
        auto out = pattern(3 << 20, 11);
        std::vector<std::byte> in(out.size());
        r.run(cc::when_all(a.send(out), b.recv(in)));
        CHECK(in == out);
        auto t0 = std::chrono::steady_clock::now();
        auto e = expect_system_error([&] { r.run(b.recv(in, cc::io::deadline_after(20ms))); });
        CHECK(e.code() == std::errc::timed_out);
        CHECK(elapsed_ms(t0) >= 19.0);
        // Cross-thread wake-ups go through the same eventfd on every set-up.
        std::stop_source stop;
        std::thread t([&] {
            std::this_thread::sleep_for(10ms);
            stop.request_stop();
        });
        auto c = expect_system_error([&] { r.run(r.sleep_for(10s, stop.get_token())); });
        t.join();
        CHECK(c.code() == std::errc::operation_canceled);
    }
}

TEST_CASE("read_some reads a pipe as data arrives and returns 0 at its end") {
    cc::io::reactor r;
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    std::thread writer([w = fds[1]] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        [[maybe_unused]] auto n = ::write(w, "hello", 5);
        ::close(w);
    });
    std::string got;
    std::size_t reads = 0;
    r.run([&]() -> cc::task<> {
        std::array<std::byte, 64> buf{};
        for (;;) {
            std::size_t n = co_await r.read_some(fds[0], buf);
            ++reads;
            if (n == 0) break;
            got.append(reinterpret_cast<const char*>(buf.data()), n);
        }
    }());
    writer.join();
    ::close(fds[0]);
    CHECK(got == "hello");
    CHECK(reads >= 2);
}

TEST_CASE("read_some with a deadline on a silent pipe times out; a bad fd names itself") {
    cc::io::reactor r;
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    std::error_code timed_out;
    std::string bad;
    r.run([&]() -> cc::task<> {
        std::array<std::byte, 8> buf{};
        try {
            co_await r.read_some(fds[0], buf,
                                 cc::io::deadline_after(std::chrono::milliseconds(30)));
        } catch (const std::system_error& e) {
            timed_out = e.code();
        }
        try {
            co_await r.read_some(-5, buf);
        } catch (const std::system_error& e) {
            bad = e.what();
        }
    }());
    ::close(fds[0]);
    ::close(fds[1]);
    CHECK(timed_out == std::errc::timed_out);
    CHECK(bad.find("read from fd -5") != std::string::npos);
}

TEST_CASE("poll on a pidfd wakes when the child exits") {
    cc::io::reactor r;
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::usleep(30'000);
        ::_exit(7);
    }
    int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    REQUIRE(pidfd >= 0);
    unsigned events = 0;
    r.run([&]() -> cc::task<> { events = co_await r.poll(pidfd, POLLIN); }());
    int status = 0;
    REQUIRE(::waitpid(pid, &status, WNOHANG) == pid);
    ::close(pidfd);
    CHECK((events & POLLIN) != 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 7);
}

namespace {

// Suspends until `fire` resumes it: what a timer entry's owner does with a waiting coroutine.
struct timer_probe : cc::io::timer_entry {
    std::vector<int>* order = nullptr;
    int id = 0;
    std::coroutine_handle<> waiter;
};

void record(cc::io::timer_entry& t) noexcept {
    auto& p = static_cast<timer_probe&>(t);
    p.order->push_back(p.id);
    if (p.waiter) std::exchange(p.waiter, {}).resume();
}

struct until_fired {
    timer_probe& p;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) noexcept { p.waiter = h; }
    void await_resume() const noexcept {}
};

}  // namespace

TEST_CASE("timer entries fire in deadline order; a disarmed one never fires; re-arming moves one") {
    cc::io::reactor r;
    std::vector<int> order;
    auto now = std::chrono::steady_clock::now();
    std::array<timer_probe, 6> t;
    const int ms[] = {30, 10, 50, 20, 40, 5};
    for (int i = 0; i < 6; ++i) {
        t[i].order = &order;
        t[i].id = i;
        t[i].fire = &record;
        t[i].when = now + std::chrono::milliseconds(ms[i]);
        r.arm(t[i]);
        CHECK(t[i].armed());
    }
    r.disarm(t[4]);  // 40 ms: never fires
    CHECK_FALSE(t[4].armed());
    r.disarm(t[4]);  // twice is harmless
    t[2].when = now + std::chrono::milliseconds(1);
    r.arm(t[2]);  // moved from 50 ms to 1 ms
    auto due = t[0].when;
    r.run([&]() -> cc::task<> { co_await until_fired{t[0]}; }());  // the 30 ms one
    // Never early: measured against the entry's own deadline (arming six entries took time
    // of its own, which a clock started after them would not count).
    CHECK(std::chrono::steady_clock::now() >= due);
    r.run(r.sleep_for(30ms));
    CHECK(order == std::vector<int>{2, 5, 1, 3, 0});
    for (auto& e : t) CHECK_FALSE(e.armed());
}

TEST_CASE("a timer entry wakes a reactor that has nothing in flight, without spinning") {
    cc::io::reactor r;
    std::vector<int> order;
    timer_probe p;
    p.order = &order;
    p.fire = &record;
    p.when = std::chrono::steady_clock::now() + 150ms;
    auto due = p.when;
    r.arm(p);
    auto s = stats_during(r, [&] { r.run([&]() -> cc::task<> { co_await until_fired{p}; }()); });
    CHECK(std::chrono::steady_clock::now() >= due);  // never early
    CHECK(order == std::vector<int>{0});
    // Busy polling is for operations in flight; with none, it sleeps until the entry's time.
    CHECK(s.polls == 0);
    CHECK(s.kernel_waits >= 1);
    CHECK(s.turns <= 3);
}

// Here and below: a 60 ms poll window before a longer timer. The reactor polls, then sleeps in
// the kernel until the timer. How much processor time the window costs: timing_test.
TEST_CASE("busy polling is bounded: the reactor polls for busy_poll, then sleeps in the kernel") {
    // Whether other programs keep this host busy is not ours to know here.
    cc::io::reactor r({.busy_poll = 60ms, .yield_when_host_busy = false, .yield_after = 60ms});
    auto s = stats_during(r, [&] { r.run(r.sleep_for(400ms)); });
    CAPTURE(s.polls);
    CHECK(s.polls >= 1);
    CHECK(s.kernel_waits >= 1);
    CHECK(s.turns <= 3);
    if (!cc::io::reactor::crowded()) CHECK(s.yields == 0);
}

TEST_CASE("a wait that outlasts yield_after yields between its further polls, still bounded") {
    // 20 ms of plain polls, then 40 ms of polls with a yield between them, then a kernel wait.
    cc::io::reactor r({.busy_poll = 60ms, .yield_when_host_busy = false, .yield_after = 20ms});
    auto s = stats_during(r, [&] { r.run(r.sleep_for(400ms)); });
    CAPTURE(s.polls);
    CAPTURE(s.yields);
    if (!cc::io::reactor::crowded()) {
        CHECK(s.yields >= 1);
        CHECK(s.yields < s.polls - 1);  // the first 20 ms did not yield
    }
    CHECK(s.kernel_waits >= 1);
    CHECK(s.turns <= 3);
}

TEST_CASE("a yield that finds nothing else to run is quicker than a hand-over") {
    // The cheapest of 200 yields found nothing else to run, unless another task ran here at
    // every one of them: it must not count as a hand-over (reactor::yield_processor), or ranks
    // on processors of their own yield at every wait and move. A fixed 1 us threshold failed
    // this on an AMD EPYC VM (system calls 1.0 us, the cheapest yield 1.24 us).
    auto cheapest = std::chrono::steady_clock::duration::max();
    for (int i = 0; i < 200; ++i) {
        const auto before = std::chrono::steady_clock::now();
        ::sched_yield();
        cheapest = std::min(cheapest, std::chrono::steady_clock::now() - before);
    }
    const double cheapest_us = std::chrono::duration<double, std::micro>(cheapest).count();
    const double handover_us =
        std::chrono::duration<double, std::micro>(cc::io::reactor::handover_time()).count();
    CAPTURE(cheapest_us);
    CAPTURE(handover_us);
    CHECK(cheapest < cc::io::reactor::handover_time());
    CHECK(cc::io::reactor::handover_time() >= std::chrono::microseconds(1));
}

TEST_CASE("where reactors outnumber processors, busy polling yields between polls, still bounded") {
    cc::io::reactor r({.busy_poll = 60ms});
    CHECK_FALSE(cc::io::reactor::crowded());
    cc::io::reactor::set_local_processes(100000);  // as if that many ranks shared this host
    CHECK(cc::io::reactor::crowded());
    auto s = stats_during(r, [&] { r.run(r.sleep_for(300ms)); });
    cc::io::reactor::set_local_processes(1);
    CHECK_FALSE(cc::io::reactor::crowded());
    CAPTURE(s.polls);
    CAPTURE(s.yields);
    // One poll window: a yield after every look at the ring but the last, then a kernel wait.
    CHECK(s.yields >= 1);
    CHECK(s.yields == s.polls - 1);
    CHECK(s.kernel_waits >= 1);
}

TEST_CASE(
    "busy_poll_when_crowded polls without yielding even where reactors outnumber processors") {
    cc::io::reactor r({.busy_poll = 60ms, .busy_poll_when_crowded = true});
    cc::io::reactor::set_local_processes(100000);
    auto s = stats_during(r, [&] { r.run(r.sleep_for(400ms)); });
    cc::io::reactor::set_local_processes(1);
    CAPTURE(s.polls);
    CHECK(s.polls >= 1);
    CHECK(s.yields == 0);
    CHECK(s.kernel_waits >= 1);
}

TEST_CASE("a watched poll entry is asked every turn, then less often: a long wait costs little") {
    // A busy window of 60 ms, not the default 50 µs: a loaded machine (CI's ASan build) could
    // take longer than 50 µs to come back to the loop after the entry was watched, and then
    // the wait never busy polled at all.
    cc::io::reactor r({.busy_poll = 60ms});
    std::atomic<bool> flag{false};
    flag_wait w(r, flag);
    // The clock starts before the setter's, so the wait can only look longer than 300 ms.
    auto t0 = std::chrono::steady_clock::now();
    auto setter = set_after(300ms, flag);
    auto s = stats_during(r, [&] { r.run([&]() -> cc::task<> { co_await w.wait(); }()); });
    CHECK(elapsed_ms(t0) >= 299.0);
    CAPTURE(w.polls);
    CAPTURE(s.polls);
    CAPTURE(s.kernel_waits);
    // Busy turns for busy_poll first, then pauses in the kernel; the entry is asked
    // on every turn, whichever kind. How late the wait ends: timing_test.
    CHECK(s.polls >= 1);
    CHECK(s.kernel_waits >= 1);
    CHECK(w.polls >= s.polls + s.kernel_waits);
    CHECK_FALSE(w.watched);
    CHECK_FALSE(r.watching());
}

TEST_CASE("busy_poll_for keeps a watched wait busy polling past busy_poll, without pauses") {
    // Without it, the same wait pauses in the kernel once busy_poll (10 µs here) has passed;
    // with it, the loop polls until the flag (set after 50 ms) ends the wait.
    for (bool extended : {false, true}) {
        CAPTURE(extended);
        cc::io::reactor r({.busy_poll = 10us, .yield_when_host_busy = false});
        std::atomic<bool> flag{false};
        flag_wait w(r, flag);
        auto setter = set_after(50ms, flag);
        auto s = stats_during(r, [&] {
            r.run([&]() -> cc::task<> {
                if (extended) r.busy_poll_for(10s);
                co_await w.wait();
            }());
        });
        CAPTURE(s.polls);
        CAPTURE(s.kernel_waits);
        if (extended) {
            CHECK(s.kernel_waits == 0);
            CHECK(s.polls >= 1);
        } else {
            // How many busy turns fit in 10 µs is the machine's business (none, under TSan).
            CHECK(s.kernel_waits >= 1);
        }
    }
}

TEST_CASE("a watched wait whose yields hand the processor to nobody yields at few of its turns") {
    // yield_after 0: the wait yields from its first poll. Where its yields keep coming back at
    // once (nothing else to run here), it yields at one full turn in 16, looking at the entry
    // at the turns between. Before, every poll yielded: 4 ranks on 2 processors, two of them
    // ping-ponging while the others slept, yielded 1.3 times a message (coll_perf --stats).
    // Whether a yield came back at once is the machine's business, so one wait of 20 in which
    // at most half the polls yielded is enough: the others may have handed over to other
    // programs (the test runs alone: tests/meson.build).
    bool thinned = false;
    std::uint64_t polls = 0, yields = 0;
    for (int round = 0; round < 20 && !thinned; ++round) {
        cc::io::reactor r({.busy_poll = 10s, .yield_when_host_busy = false, .yield_after = 0us});
        std::atomic<bool> flag{false};
        flag_wait w(r, flag);
        auto setter = set_after(20ms, flag);
        auto s = stats_during(r, [&] { r.run([&]() -> cc::task<> { co_await w.wait(); }()); });
        CHECK(s.kernel_waits == 0);
        CHECK(s.yields >= 1);
        polls = s.polls;
        yields = s.yields;
        thinned = yields * 2 <= polls;
    }
    CAPTURE(polls);
    CAPTURE(yields);
    CHECK(thinned);
}

TEST_CASE("while an entry is watched, I/O, timers and other entries still complete") {
    cc::io::reactor r;
    std::atomic<bool> late{false}, early{false};
    flag_wait long_wait(r, late), short_wait(r, early);
    int fds[2];
    REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
    std::jthread writer([&] {
        std::this_thread::sleep_for(20ms);
        early.store(true, std::memory_order_release);
        std::this_thread::sleep_for(20ms);
        REQUIRE(write(fds[1], "x", 1) == 1);
    });
    std::vector<std::string> order;
    auto body = [&]() -> cc::task<> {
        auto waits = [&]() -> cc::task<> {
            co_await short_wait.wait();  // its poll unwatches it while the long one stays watched
            order.emplace_back("entry");
            std::array<std::byte, 4> buf{};
            auto n = co_await r.read_some(fds[0], buf);
            CHECK(n == 1);
            order.emplace_back("read");
            co_await r.sleep_for(10ms);
            order.emplace_back("sleep");
            late.store(true, std::memory_order_release);
        };
        co_await cc::when_all(waits(), [&]() -> cc::task<> { co_await long_wait.wait(); }());
    };
    r.run(body());
    writer.join();  // before closing the pipe it wrote to (TSan: a race on the descriptor)
    close(fds[0]);
    close(fds[1]);
    CHECK(order == std::vector<std::string>{"entry", "read", "sleep"});
    CHECK_FALSE(r.watching());
}

TEST_CASE("a watched wait enters the kernel only when it holds completions (taskrun flag)") {
    // Where the ring raises IORING_SQ_TASKRUN, a loop that busy polls watched entries (shared
    // memory) enters the kernel only when that flag or a submission asks for it: a system call
    // costs a microsecond on some virtual machines, and a message that lands while the loop is
    // in one waits for it. Without the flag the loop has to ask every 10 µs. Both ways, what
    // completes in the kernel meanwhile (a pipe's read) is picked up, and a plain busy poll
    // (nothing watched) still enters at every step.
    for (unsigned allowed :
         {cc::io::reactor_options{}.allowed_setup_flags,
          cc::io::reactor_options{}.allowed_setup_flags & ~unsigned{IORING_SETUP_TASKRUN_FLAG}}) {
        cc::io::reactor r({.busy_poll = 10s,
                           .busy_poll_when_crowded = true,
                           .yield_when_host_busy = false,
                           .yield_after = 10s,
                           .allowed_setup_flags = allowed});
        const auto& f = r.features();
        const bool flagged = (allowed & IORING_SETUP_TASKRUN_FLAG) != 0;
        CAPTURE(flagged);
        if (!f.defer_taskrun && !f.coop_taskrun) {
            MESSAGE("this kernel has neither DEFER_TASKRUN nor COOP_TASKRUN: nothing to hold");
            break;
        }
        // Both task-run set-ups came with 5.19 or later, as the flag did.
        CHECK(f.taskrun_flag == flagged);

        // A watched entry that another thread's store ends after 50 ms, with nothing of ours
        // in the kernel but the wake-up read that is always there.
        std::atomic<bool> flag{false};
        flag_wait w(r, flag);
        auto setter = set_after(50ms, flag);
        auto s = stats_during(r, [&] { r.run([&]() -> cc::task<> { co_await w.wait(); }()); });
        CAPTURE(s.polls);
        CAPTURE(s.enters);
        CHECK(s.kernel_waits == 0);
        if (f.taskrun_flag) CHECK(s.enters <= 1);

        // The same wait with a read on a pipe in flight, written to after 20 ms: the read
        // completes (the kernel holds its completion until we enter), the wait goes on.
        int fds[2];
        REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
        std::atomic<bool> late{false};
        flag_wait long_wait(r, late);
        std::jthread writer([&] {
            std::this_thread::sleep_for(20ms);
            CHECK(write(fds[1], "x", 1) == 1);
            std::this_thread::sleep_for(30ms);
            late.store(true, std::memory_order_release);
        });
        std::vector<std::string> order;
        auto watched = stats_during(r, [&] {
            r.run(cc::when_all(
                [&]() -> cc::task<> {
                    std::array<std::byte, 4> buf{};
                    CHECK(co_await r.read_some(fds[0], buf) == 1);
                    order.emplace_back("read");
                }(),
                [&]() -> cc::task<> {
                    co_await long_wait.wait();
                    order.emplace_back("entry");
                }()));
        });
        writer.join();
        CHECK(order == std::vector<std::string>{"read", "entry"});
        CAPTURE(watched.enters);
        CHECK(watched.enters >= 1);
        if (f.taskrun_flag) CHECK(watched.enters <= 4);

        // A plain busy poll (nothing watched) for a read whose data comes after 20 ms.
        std::jthread late_writer([&] {
            std::this_thread::sleep_for(20ms);
            CHECK(write(fds[1], "y", 1) == 1);
        });
        auto plain = stats_during(r, [&] {
            std::array<std::byte, 4> buf{};
            CHECK(r.run(r.read_some(fds[0], buf)) == 1);
        });
        late_writer.join();
        close(fds[0]);
        close(fds[1]);
        CAPTURE(plain.polls);
        CAPTURE(plain.enters);
        CHECK(plain.kernel_waits == 0);
        CHECK(plain.enters >= 1);
    }
}
