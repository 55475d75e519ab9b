#include <corocoll/core/async_mutex.hpp>
#include <corocoll/core/sync_wait.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/core/when_all.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "../support/core.hpp"

namespace cc = corocoll;

TEST_CASE("async_mutex: waiters get the lock one at a time, in the order they asked") {
    cc::async_mutex m;
    corocoll_test::manual_event release;
    std::vector<int> order;
    bool inside = false;
    auto holder = [&]() -> cc::task<> {
        auto g = co_await m.scoped_lock();
        co_await release;  // hold the lock until the test says so
    };
    auto contender = [&](int id) -> cc::task<> {
        auto g = co_await m.scoped_lock();
        CHECK_FALSE(inside);
        inside = true;
        order.push_back(id);
        inside = false;
    };
    auto run = [&]() -> cc::task<> {
        auto setter = [&]() -> cc::task<> {
            release.set();
            co_return;
        };
        co_await cc::when_all(holder(), contender(1), contender(2), contender(3), setter());
    };
    cc::sync_wait(run());
    CHECK(order == std::vector<int>{1, 2, 3});
    CHECK(m.try_lock());
    m.unlock();
}

TEST_CASE("async_mutex: try_lock fails while held and succeeds once released") {
    cc::async_mutex m;
    CHECK(m.try_lock());
    CHECK_FALSE(m.try_lock());
    m.unlock();
    CHECK(m.try_lock());
    m.unlock();
}

TEST_CASE("async_mutex: coroutines on several threads never overlap inside the lock") {
    cc::async_mutex m;
    long counter = 0;
    std::atomic<int> inside{0};
    bool overlapped = false;
    auto worker = [&]() -> cc::task<> {
        for (int i = 0; i < 2000; ++i) {
            auto g = co_await m.scoped_lock();
            if (inside.fetch_add(1) != 0) overlapped = true;
            ++counter;
            inside.fetch_sub(1);
        }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) threads.emplace_back([&] { cc::sync_wait(worker()); });
    for (auto& t : threads) t.join();
    CHECK_FALSE(overlapped);
    CHECK(counter == 8000);
}
