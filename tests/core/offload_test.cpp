#include <corocoll/core/offload.hpp>
#include <corocoll/core/sync_wait.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/core/thread_pool.hpp>
#include <corocoll/core/when_all.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../support/core.hpp"

namespace cc = corocoll;
using namespace corocoll_test;

namespace {

bool is_operation_canceled(const std::system_error& e) {
    return e.code() == std::errc::operation_canceled;
}

}  // namespace

TEST_CASE("offload runs the function on a pool thread") {
    cc::thread_pool pool(2);
    const auto main_id = std::this_thread::get_id();
    auto ran_on = cc::sync_wait([](cc::thread_pool& p) -> cc::task<std::thread::id> {
        co_return co_await cc::offload(p, [] { return std::this_thread::get_id(); });
    }(pool));
    CHECK(ran_on != main_id);
    CHECK(ran_on != std::thread::id{});
}

TEST_CASE("offload on the default pool runs the function on a pool thread") {
    const auto main_id = std::this_thread::get_id();
    auto ran_on = cc::sync_wait(cc::offload([] { return std::this_thread::get_id(); }));
    CHECK(ran_on != main_id);
    CHECK(cc::thread_pool::default_pool().size() >= 2);
}

TEST_CASE("offload returns the function's value") {
    cc::thread_pool pool(1);
    CHECK(cc::sync_wait(cc::offload(pool, [] { return 6 * 7; })) == 42);
    CHECK(cc::sync_wait(cc::offload(pool, [] { return std::string("text"); })) == "text");
    auto p = cc::sync_wait(cc::offload(pool, [] { return std::make_unique<int>(5); }));
    static_assert(std::is_same_v<decltype(p), std::unique_ptr<int>>);
    REQUIRE(p);
    CHECK(*p == 5);

    // A move-only function object is moved into the awaiter, not copied.
    auto owned = std::make_unique<int>(9);
    CHECK(cc::sync_wait(cc::offload(pool, [o = std::move(owned)] { return *o; })) == 9);

    auto outer = [](cc::thread_pool& p) -> cc::task<int> {
        int a = co_await cc::offload(p, [] { return 1; });
        int b = co_await cc::offload(p, [] { return 2; });
        co_return a + b;
    };
    CHECK(cc::sync_wait(outer(pool)) == 3);
}

TEST_CASE("offload of a void function completes after the function ran") {
    cc::thread_pool pool(1);
    std::atomic<int> calls{0};
    cc::sync_wait(cc::offload(pool, [&] { ++calls; }));
    static_assert(std::is_void_v<decltype(cc::sync_wait(cc::offload(pool, [] {})))>);
    CHECK(calls.load() == 1);
}

TEST_CASE("offload rethrows the function's exception in the awaiter") {
    cc::thread_pool pool(1);
    CHECK_THROWS_WITH_AS(
        cc::sync_wait(cc::offload(pool, []() -> int { throw std::domain_error("in fn"); })),
        "in fn", std::domain_error);
    CHECK_THROWS_AS(cc::sync_wait(cc::offload(pool, [] { throw 7; })), int);

    auto outer = [](cc::thread_pool& p) -> cc::task<std::string> {
        try {
            co_await cc::offload(p, [] { throw std::runtime_error("caught in coroutine"); });
        } catch (const std::runtime_error& e) {
            co_return e.what();
        }
        co_return "not thrown";
    };
    CHECK(cc::sync_wait(outer(pool)) == "caught in coroutine");
}

TEST_CASE("without an event loop on the awaiting thread offload resumes on the worker") {
    REQUIRE(cc::detail::event_loop::current() == nullptr);
    cc::thread_pool pool(1);
    const auto main_id = std::this_thread::get_id();
    std::thread::id fn_id;
    std::thread::id resumed_id;
    cc::sync_wait([&]() -> cc::task<> {
        co_await cc::offload(pool, [&] { fn_id = std::this_thread::get_id(); });
        resumed_id = std::this_thread::get_id();
    }());
    CHECK(fn_id != main_id);
    CHECK(resumed_id == fn_id);
}

TEST_CASE(
    "offload with a stop_token already stopped throws operation_canceled without calling fn") {
    cc::thread_pool pool(1);
    std::stop_source source;
    source.request_stop();
    std::atomic<int> calls{0};

    SUBCASE("a function without a stop_token parameter") {
        try {
            cc::sync_wait(cc::offload(
                pool,
                [&] {
                    ++calls;
                    return 1;
                },
                source.get_token()));
            FAIL("offload did not throw");
        } catch (const std::system_error& e) {
            CHECK(is_operation_canceled(e));
        }
    }
    SUBCASE("a function that takes a stop_token") {
        try {
            cc::sync_wait(cc::offload(
                pool, [&](std::stop_token) { ++calls; }, source.get_token()));
            FAIL("offload did not throw");
        } catch (const std::system_error& e) {
            CHECK(is_operation_canceled(e));
        }
    }
    CHECK(calls.load() == 0);
}

TEST_CASE("offload whose stop is requested while it waits in the queue is not called") {
    cc::thread_pool pool(1);
    std::stop_source source;
    std::atomic<bool> first_started{false};
    std::atomic<bool> release_first{false};
    std::atomic<int> second_calls{0};

    auto blocker = [&](cc::thread_pool& p) -> cc::task<int> {
        co_return co_await cc::offload(p, [&] {
            first_started = true;
            // Holds the only worker until the test has requested stop for the queued job.
            wait_until([&] { return release_first.load(); });
            return 1;
        });
    };
    auto queued = [&](cc::thread_pool& p) -> cc::task<std::string> {
        try {
            co_await cc::offload(
                p, [&] { ++second_calls; }, source.get_token());
        } catch (const std::system_error& e) {
            co_return is_operation_canceled(e) ? "canceled" : e.what();
        }
        co_return "ran";
    };

    std::tuple<int, std::string> result;
    std::thread waiter([&] { result = cc::sync_wait(cc::when_all(blocker(pool), queued(pool))); });
    REQUIRE(wait_until([&] { return first_started.load(); }));
    source.request_stop();
    release_first = true;
    waiter.join();
    CHECK(std::get<0>(result) == 1);
    CHECK(std::get<1>(result) == "canceled");
    CHECK(second_calls.load() == 0);
}

TEST_CASE("a function taking a stop_token receives the one given to offload") {
    cc::thread_pool pool(1);

    SUBCASE("the token is tied to the caller's stop_source") {
        std::stop_source source;
        auto [possible, requested_before, requested_after] = cc::sync_wait(cc::offload(
            pool,
            [&](std::stop_token token) {
                bool before = token.stop_requested();
                source.request_stop();
                return std::tuple{token.stop_possible(), before, token.stop_requested()};
            },
            source.get_token()));
        CHECK(possible);
        CHECK_FALSE(requested_before);
        CHECK(requested_after);
    }
    SUBCASE("a running function sees a stop requested from another thread") {
        std::stop_source source;
        std::atomic<bool> started{false};
        int iterations = 0;
        std::thread waiter([&] {
            iterations = cc::sync_wait(cc::offload(
                pool,
                [&](std::stop_token token) {
                    started = true;
                    int n = 0;
                    while (!token.stop_requested()) {
                        ++n;
                        std::this_thread::yield();
                    }
                    return n;
                },
                source.get_token()));
        });
        REQUIRE(wait_until([&] { return started.load(); }));
        source.request_stop();
        waiter.join();
        CHECK(iterations >= 0);
    }
    SUBCASE("without a token the function gets one that can never stop") {
        bool possible = cc::sync_wait(
            cc::offload(pool, [](std::stop_token token) { return token.stop_possible(); }));
        CHECK_FALSE(possible);
    }
}

TEST_CASE("a pool of three threads runs a hundred concurrent offloads through when_all") {
    cc::thread_pool pool(3);
    REQUIRE(pool.size() == 3);
    const auto main_id = std::this_thread::get_id();
    std::mutex mutex;
    std::set<std::thread::id> workers;
    std::atomic<int> running{0};
    std::atomic<int> most_running{0};

    auto job = [&](int i) -> cc::task<long> {
        co_return co_await cc::offload(pool, [&, i] {
            int now = ++running;
            int seen = most_running.load();
            while (now > seen && !most_running.compare_exchange_weak(seen, now)) {
            }
            {
                std::lock_guard lock(mutex);
                workers.insert(std::this_thread::get_id());
            }
            std::this_thread::yield();
            --running;
            return long{i} * i;
        });
    };
    std::vector<cc::task<long>> jobs;
    jobs.reserve(100);
    for (int i = 0; i < 100; ++i) jobs.push_back(job(i));
    auto results = cc::sync_wait(cc::when_all(std::move(jobs)));

    REQUIRE(results.size() == 100);
    for (int i = 0; i < 100; ++i) CHECK(results[i] == long{i} * i);
    CHECK(workers.size() >= 1);
    CHECK(workers.size() <= 3);
    CHECK(workers.count(main_id) == 0);
    CHECK(most_running.load() >= 1);
    CHECK(most_running.load() <= 3);
}

TEST_CASE("a thread pool runs every queued item before its destructor returns") {
    struct counting_item : cc::detail::work_item {
        std::atomic<int>* counter = nullptr;
    };
    std::atomic<int> counter{0};
    std::vector<counting_item> items(1000);
    {
        cc::thread_pool pool(2);
        for (auto& item : items) {
            item.counter = &counter;
            item.run_ = [](cc::detail::work_item* w) noexcept {
                ++*static_cast<counting_item*>(w)->counter;
            };
            pool.submit(item);
        }
    }
    CHECK(counter.load() == 1000);
}

TEST_CASE("a thread pool asked for zero threads has one") {
    cc::thread_pool pool(0);
    CHECK(pool.size() == 1);
    CHECK(cc::sync_wait(cc::offload(pool, [] { return 1; })) == 1);
}
