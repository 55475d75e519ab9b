// What only a clock can tell: how late timers, deadlines and watched waits end, and how much
// processor time busy polling costs. These depend on what the machine grants the test, so
// they form the suite "timing", which `meson test` leaves out (run it with
// `meson test --suite timing` on a quiet machine). Every other test asserts what the code
// did instead (see reactor_stats), and at most lower bounds of time.

#include "../support/io.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

using namespace corocoll_test;

TEST_CASE("a timer fires at most 100 ms late") {
    cc::io::reactor r;
    for (auto d : {1ms, 20ms, 60ms}) {
        auto due = std::chrono::steady_clock::now() + d;
        r.run(r.sleep_for(d));
        CHECK(std::chrono::steady_clock::now() - due < 100ms);
    }
}

TEST_CASE("ten concurrent 50 ms sleeps end within 200 ms") {
    cc::io::reactor r;
    std::vector<cc::task<>> sleeps;
    auto one = [](cc::io::reactor& rr) -> cc::task<> { co_await rr.sleep_for(50ms); };
    for (int i = 0; i < 10; ++i) sleeps.push_back(one(r));
    auto t0 = std::chrono::steady_clock::now();
    r.run(cc::when_all(std::move(sleeps)));
    CHECK(elapsed_ms(t0) < 200.0);
}

TEST_CASE("an idle reactor waiting 200 ms costs under 20 ms of processor time") {
    cc::io::reactor idle;
    double cpu0 = thread_cpu_ms();
    idle.run(idle.sleep_for(200ms));
    double used = thread_cpu_ms() - cpu0;
    CAPTURE(used);
    CHECK(used < 20.0);
}

TEST_CASE("a spinning reactor takes its core while it waits") {
    cc::io::reactor r({.spin = true});
    double cpu0 = thread_cpu_ms();
    r.run(r.sleep_for(200ms));
    double used = thread_cpu_ms() - cpu0;
    CAPTURE(used);
    CHECK(used > 20.0);
}

TEST_CASE("a 60 ms busy-poll window costs about 60 ms of processor time, not the whole wait") {
    cc::io::reactor r({.busy_poll = 60ms});
    double cpu0 = thread_cpu_ms();
    r.run(r.sleep_for(400ms));
    double used = thread_cpu_ms() - cpu0;
    CAPTURE(used);
    CHECK(used > 10.0);
    CHECK(used < 200.0);
}

TEST_CASE("a watched wait of 300 ms ends within 100 ms of its flag and costs under 150 ms") {
    cc::io::reactor r;
    std::atomic<bool> flag{false};
    flag_wait w(r, flag);
    auto setter = set_after(300ms, flag);
    double cpu0 = thread_cpu_ms();
    auto t0 = std::chrono::steady_clock::now();
    r.run([&]() -> cc::task<> { co_await w.wait(); }());
    double took = elapsed_ms(t0), used = thread_cpu_ms() - cpu0;
    CAPTURE(took);
    CAPTURE(used);
    CHECK(took < 400.0);  // the pauses grow to 500 µs at most
    CHECK(used < 150.0);  // 50 µs of polling, then pauses
}

TEST_CASE("a socket receive's deadline fires at most 200 ms late") {
    cc::io::reactor r;
    auto conn = r.run(connected_pair(r));
    std::vector<std::byte> in(16);
    auto t0 = std::chrono::steady_clock::now();
    auto e =
        expect_system_error([&] { r.run(conn.second.recv(in, cc::io::deadline_after(50ms))); });
    CHECK(e.code() == std::errc::timed_out);
    CHECK(elapsed_ms(t0) < 250.0);
}
