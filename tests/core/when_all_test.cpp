#include <corocoll/core/sync_wait.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/core/when_all.hpp>

#include <doctest/doctest.h>

#include <array>
#include <coroutine>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../support/core.hpp"
#include "../support/errors.hpp"

namespace cc = corocoll;
using namespace corocoll_test;

namespace {

cc::task<int> value_of(int v) { co_return v; }

cc::task<std::string> string_of(const char* s) { co_return std::string(s); }

cc::task<> nothing(int& runs) {
    ++runs;
    co_return;
}

/// Waits for `event`, notes that it finished, then returns `id` or throws an error naming it.
cc::task<int> child(manual_event& event, int id, bool fail, int& finished) {
    co_await event;
    ++finished;
    if (fail) throw std::runtime_error("child " + std::to_string(id));
    co_return id;
}

}  // namespace

TEST_CASE("when_all yields the results of its children in argument order") {
    int runs = 0;
    auto all = cc::when_all(value_of(1), string_of("two"), nothing(runs), value_of(4));
    static_assert(
        std::is_same_v<decltype(all),
                       cc::task<std::tuple<int, std::string, cc::detail::void_value, int>>>);
    auto [a, b, c, d] = cc::sync_wait(std::move(all));
    CHECK(a == 1);
    CHECK(b == "two");
    CHECK(c == cc::detail::void_value{});
    CHECK(d == 4);
    CHECK(runs == 1);
}

TEST_CASE("when_all over void children yields one void_value per child") {
    int runs = 0;
    auto result = cc::sync_wait(cc::when_all(nothing(runs), nothing(runs), nothing(runs)));
    static_assert(
        std::is_same_v<decltype(result), std::tuple<cc::detail::void_value, cc::detail::void_value,
                                                    cc::detail::void_value>>);
    CHECK(runs == 3);
}

TEST_CASE("when_all with no children completes at once with an empty tuple") {
    auto result = cc::sync_wait(cc::when_all());
    static_assert(std::is_same_v<decltype(result), std::tuple<>>);
}

TEST_CASE("when_all accepts awaitables that are not tasks") {
    auto [a, b] = cc::sync_wait(cc::when_all(std::suspend_never{}, value_of(2)));
    CHECK(a == cc::detail::void_value{});
    CHECK(b == 2);
}

TEST_CASE("when_all over a vector yields results in the vector's order") {
    SUBCASE("children that complete synchronously") {
        std::vector<cc::task<int>> tasks;
        tasks.reserve(5);
        for (int i = 0; i < 5; ++i) tasks.push_back(value_of(i * 10));
        auto all = cc::when_all(std::move(tasks));
        static_assert(std::is_same_v<decltype(all), cc::task<std::vector<int>>>);
        CHECK(cc::sync_wait(std::move(all)) == std::vector<int>{0, 10, 20, 30, 40});
    }
    SUBCASE("children that complete in reverse order") {
        std::array<manual_event, 4> events;
        int finished = 0;
        std::vector<cc::task<int>> tasks;
        tasks.reserve(4);
        for (int i = 0; i < 4; ++i) tasks.push_back(child(events[i], i, false, finished));
        outcome<std::vector<int>> out;
        run_detached(cc::when_all(std::move(tasks)), out);
        // Every child ran to its first suspension before the parent suspended.
        for (auto& e : events) CHECK(e.has_waiter());
        for (int i = 3; i >= 0; --i) {
            CHECK_FALSE(out.done);
            events[i].set();
        }
        REQUIRE(out.done);
        CHECK_FALSE(out.error);
        CHECK(out.value == std::vector<int>{0, 1, 2, 3});
        CHECK(finished == 4);
    }
}

TEST_CASE("when_all over an empty vector completes at once with an empty vector") {
    auto result = cc::sync_wait(cc::when_all(std::vector<cc::task<int>>{}));
    CHECK(result.empty());

    outcome<std::vector<int>> out;
    run_detached(cc::when_all(std::vector<cc::task<int>>{}), out);
    CHECK(out.done);
    CHECK(out.value == std::vector<int>{});

    cc::sync_wait(cc::when_all(std::vector<cc::task<>>{}));
}

TEST_CASE("when_all over a vector of task<void> runs every child and yields nothing") {
    int runs = 0;
    std::vector<cc::task<>> tasks;
    tasks.reserve(7);
    for (int i = 0; i < 7; ++i) tasks.push_back(nothing(runs));
    auto all = cc::when_all(std::move(tasks));
    static_assert(std::is_same_v<decltype(all), cc::task<>>);
    cc::sync_wait(std::move(all));
    CHECK(runs == 7);
}

TEST_CASE("when_all moves move-only results out of its children") {
    auto make = [](int v) -> cc::task<std::unique_ptr<int>> { co_return std::make_unique<int>(v); };
    auto [a, b] = cc::sync_wait(cc::when_all(make(1), make(2)));
    REQUIRE(a);
    REQUIRE(b);
    CHECK(*a + *b == 3);

    std::vector<cc::task<std::unique_ptr<int>>> tasks;
    tasks.push_back(make(3));
    tasks.push_back(make(4));
    auto v = cc::sync_wait(cc::when_all(std::move(tasks)));
    REQUIRE(v.size() == 2);
    CHECK(*v[0] == 3);
    CHECK(*v[1] == 4);
}

TEST_CASE("when_all rethrows only after every child finished, with the first failure's error") {
    std::array<manual_event, 3> events;
    int finished = 0;

    SUBCASE("variadic") {
        // Child 1 fails first in time, child 0 fails later, child 2 succeeds last.
        outcome<std::tuple<int, int, int>> out;
        run_detached(
            cc::when_all(child(events[0], 0, true, finished), child(events[1], 1, true, finished),
                         child(events[2], 2, false, finished)),
            out);
        for (auto& e : events) CHECK(e.has_waiter());
        events[1].set();
        CHECK(finished == 1);
        CHECK_FALSE(out.done);
        events[0].set();
        CHECK(finished == 2);
        CHECK_FALSE(out.done);
        events[2].set();
        CHECK(finished == 3);
        REQUIRE(out.done);
        CHECK_FALSE(out.value);
        REQUIRE(out.error);
        CHECK(what(out.error) == "child 1");
    }
    SUBCASE("over a vector") {
        std::vector<cc::task<int>> tasks;
        tasks.push_back(child(events[0], 0, false, finished));
        tasks.push_back(child(events[1], 1, true, finished));
        tasks.push_back(child(events[2], 2, true, finished));
        outcome<std::vector<int>> out;
        run_detached(cc::when_all(std::move(tasks)), out);
        events[2].set();
        CHECK_FALSE(out.done);
        events[1].set();
        CHECK_FALSE(out.done);
        events[0].set();
        CHECK(finished == 3);
        REQUIRE(out.done);
        REQUIRE(out.error);
        CHECK(what(out.error) == "child 2");
    }
}

TEST_CASE("when_all waits for pending children even when one fails while being started") {
    manual_event event;
    int finished = 0;
    auto fail_now = []() -> cc::task<int> {
        throw std::logic_error("at once");
        co_return 0;
    };
    outcome<std::tuple<int, int>> out;
    run_detached(cc::when_all(fail_now(), child(event, 1, false, finished)), out);
    CHECK(event.has_waiter());
    CHECK_FALSE(out.done);
    event.set();
    REQUIRE(out.done);
    CHECK(finished == 1);
    REQUIRE(out.error);
    CHECK(what(out.error) == "at once");
    CHECK_THROWS_AS(std::rethrow_exception(out.error), std::logic_error);
}

TEST_CASE("when_all works when its children complete on other threads") {
    const auto main_id = std::this_thread::get_id();
    thread_hopper hopper;
    auto hop_and_return = [&](int v) -> cc::task<std::pair<int, std::thread::id>> {
        co_await hopper.hop();
        co_return std::pair{v, std::this_thread::get_id()};
    };
    for (int round = 0; round < 20; ++round) {
        std::vector<cc::task<std::pair<int, std::thread::id>>> tasks;
        tasks.reserve(6);
        for (int i = 0; i < 6; ++i) tasks.push_back(hop_and_return(round * 100 + i));
        auto results = cc::sync_wait(cc::when_all(std::move(tasks)));
        auto [a, b] = cc::sync_wait(cc::when_all(hop_and_return(1), hop_and_return(2)));
        hopper.join();
        REQUIRE(results.size() == 6);
        for (int i = 0; i < 6; ++i) {
            CHECK(results[i].first == round * 100 + i);
            CHECK(results[i].second != main_id);
        }
        CHECK(a.first == 1);
        CHECK(b.first == 2);
        CHECK(a.second != b.second);
    }
}

TEST_CASE("when_all rethrows a failure from a child that completed on another thread") {
    thread_hopper hopper;
    auto hop_then = [&](bool fail) -> cc::task<int> {
        co_await hopper.hop();
        if (fail) throw std::runtime_error("remote");
        co_return 1;
    };
    CHECK_THROWS_WITH_AS(
        cc::sync_wait(cc::when_all(hop_then(false), hop_then(true), hop_then(false))), "remote",
        std::runtime_error);
    hopper.join();
}
