#include <corocoll/core/async_scope.hpp>
#include <corocoll/core/sync_wait.hpp>
#include <corocoll/core/task.hpp>

#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>

#include "../support/core.hpp"
#include "../support/errors.hpp"

namespace cc = corocoll;
using namespace corocoll_test;

namespace {

/// Steps `step` to 1, waits for `event`, steps it to 2, then throws if asked to.
cc::task<> two_steps(int& step, manual_event& event, const char* error = nullptr) {
    step = 1;
    co_await event;
    step = 2;
    if (error != nullptr) throw std::runtime_error(error);
}

cc::task<> at_once(int& runs, const char* error = nullptr) {
    ++runs;
    if (error != nullptr) throw std::runtime_error(error);
    co_return;
}

}  // namespace

TEST_CASE("spawn runs the awaitable eagerly until its first suspension") {
    cc::async_scope scope;
    manual_event event;
    int step = 0;
    scope.spawn(two_steps(step, event));
    CHECK(step == 1);
    CHECK(event.has_waiter());
    CHECK(scope.pending() == 1);
    event.set();
    CHECK(step == 2);
    CHECK(scope.pending() == 0);
    cc::sync_wait(scope.join());
}

TEST_CASE("spawn of work that completes synchronously leaves nothing pending") {
    cc::async_scope scope;
    int runs = 0;
    for (int i = 0; i < 5; ++i) scope.spawn(at_once(runs));
    CHECK(runs == 5);
    CHECK(scope.pending() == 0);
    cc::sync_wait(scope.join());
}

TEST_CASE("join with nothing spawned completes immediately") {
    cc::async_scope scope;
    CHECK(scope.pending() == 0);
    outcome<void> out;
    run_detached(scope.join(), out);
    CHECK(out.done);
    CHECK_FALSE(out.error);
    cc::sync_wait(scope.join());
}

TEST_CASE("join waits until every spawned awaitable has finished") {
    cc::async_scope scope;
    std::array<manual_event, 3> events;
    std::array<int, 3> steps{};
    for (int i = 0; i < 3; ++i) scope.spawn(two_steps(steps[i], events[i]));
    CHECK(scope.pending() == 3);

    outcome<void> out;
    run_detached(scope.join(), out);
    CHECK_FALSE(out.done);
    events[1].set();
    CHECK_FALSE(out.done);
    events[0].set();
    CHECK_FALSE(out.done);
    events[2].set();
    REQUIRE(out.done);
    CHECK_FALSE(out.error);
    for (int s : steps) CHECK(s == 2);
    CHECK(scope.pending() == 0);
}

TEST_CASE("pending counts the spawned awaitables still running while a join waits") {
    cc::async_scope scope;
    std::array<manual_event, 2> events;
    std::array<int, 2> steps{};
    for (int i = 0; i < 2; ++i) scope.spawn(two_steps(steps[i], events[i]));
    outcome<void> out;
    run_detached(scope.join(), out);
    REQUIRE_FALSE(out.done);
    CHECK(scope.pending() == 2);
    events[0].set();
    CHECK(scope.pending() == 1);
    events[1].set();
    REQUIRE(out.done);
    CHECK(scope.pending() == 0);
}

TEST_CASE("join rethrows the first exception only after every spawned awaitable finished") {
    cc::async_scope scope;
    std::array<manual_event, 3> events;
    std::array<int, 3> steps{};
    scope.spawn(two_steps(steps[0], events[0], "zero"));
    scope.spawn(two_steps(steps[1], events[1], "one"));
    scope.spawn(two_steps(steps[2], events[2]));

    outcome<void> out;
    run_detached(scope.join(), out);
    events[1].set();  // the first to fail
    CHECK_FALSE(out.done);
    events[0].set();
    CHECK_FALSE(out.done);
    events[2].set();
    REQUIRE(out.done);
    REQUIRE(out.error);
    CHECK(what(out.error) == "one");
    for (int s : steps) CHECK(s == 2);
}

TEST_CASE("join rethrows an exception from work that failed before the join started") {
    cc::async_scope scope;
    int runs = 0;
    scope.spawn(at_once(runs, "early"));
    scope.spawn(at_once(runs, "later"));
    CHECK(runs == 2);
    CHECK(scope.pending() == 0);
    CHECK_THROWS_WITH_AS(cc::sync_wait(scope.join()), "early", std::runtime_error);
}

TEST_CASE("a scope can be used again after a join") {
    cc::async_scope scope;
    manual_event first;
    int step = 0;
    scope.spawn(two_steps(step, first, "round one"));
    first.set();
    CHECK_THROWS_WITH_AS(cc::sync_wait(scope.join()), "round one", std::runtime_error);

    // The error of the first round is gone; the second round reports its own.
    int runs = 0;
    scope.spawn(at_once(runs));
    cc::sync_wait(scope.join());
    CHECK(runs == 1);

    manual_event second;
    scope.spawn(two_steps(step, second, "round three"));
    CHECK(scope.pending() == 1);
    outcome<void> out;
    run_detached(scope.join(), out);
    CHECK_FALSE(out.done);
    second.set();
    REQUIRE(out.done);
    REQUIRE(out.error);
    CHECK(what(out.error) == "round three");

    scope.spawn(at_once(runs));
    cc::sync_wait(scope.join());
    CHECK(runs == 2);
}

TEST_CASE("join waits for spawned work that completes on other threads") {
    thread_hopper hopper;
    cc::async_scope scope;
    std::atomic<int> finished{0};
    auto remote = [&]() -> cc::task<> {
        co_await hopper.hop();
        co_await hopper.hop();
        ++finished;
    };
    for (int round = 0; round < 20; ++round) {
        for (int i = 0; i < 5; ++i) scope.spawn(remote());
        cc::sync_wait(scope.join());
        CHECK(finished.load() == (round + 1) * 5);
        CHECK(scope.pending() == 0);
    }
    hopper.join();
}

TEST_CASE("join rethrows a failure from work that completed on another thread") {
    thread_hopper hopper;
    cc::async_scope scope;
    auto remote = [&](bool fail) -> cc::task<> {
        co_await hopper.hop();
        if (fail) throw std::runtime_error("remote");
    };
    scope.spawn(remote(false));
    scope.spawn(remote(true));
    scope.spawn(remote(false));
    CHECK_THROWS_WITH_AS(cc::sync_wait(scope.join()), "remote", std::runtime_error);
    hopper.join();
    CHECK(scope.pending() == 0);
}

namespace {
// An awaitable that cannot be moved into the spawned coroutine's frame.
struct unmovable_in_practice {
    unmovable_in_practice() = default;
    // Throwing is the point: it stands for a frame that cannot be created.
    // NOLINTNEXTLINE(performance-noexcept-move-constructor,bugprone-exception-escape)
    unmovable_in_practice(unmovable_in_practice&&) { throw std::runtime_error("no move"); }
    bool await_ready() const noexcept { return true; }
    void await_suspend(std::coroutine_handle<>) const noexcept {}
    void await_resume() const noexcept {}
};
}  // namespace

TEST_CASE("spawn that throws before starting anything leaves the scope with nothing pending") {
    cc::async_scope scope;
    CHECK_THROWS_AS(scope.spawn(unmovable_in_practice{}), std::runtime_error);
    CHECK(scope.pending() == 0);
    cc::sync_wait(scope.join());
}
