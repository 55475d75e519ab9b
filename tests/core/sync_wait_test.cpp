#include <corocoll/core/event_loop.hpp>
#include <corocoll/core/sync_wait.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/core/when_all.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <coroutine>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../support/core.hpp"

namespace cc = corocoll;
using namespace corocoll_test;

namespace {

cc::task<int> value_of(int v) { co_return v; }

/// An awaiter with no `operator co_await` and no task around it.
struct ready_awaiter {
    int value_;
    bool await_ready() const noexcept { return true; }
    void await_suspend(std::coroutine_handle<>) const noexcept {}
    int await_resume() const noexcept { return value_; }
};

/// An awaiter that can be neither copied nor moved, as offload's is; it suspends and resumes
/// at once.
struct pinned_awaiter {
    int value_;
    explicit pinned_awaiter(int v) : value_(v) {}
    pinned_awaiter(const pinned_awaiter&) = delete;
    pinned_awaiter& operator=(const pinned_awaiter&) = delete;
    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<>) const noexcept { return false; }
    int await_resume() const noexcept { return value_; }
};

/// A minimal event loop for the calling thread: a locked queue of work items and a condition
/// variable. It stands in for the io layer's reactor, which core does not know.
class test_loop final : public cc::detail::event_loop {
public:
    test_loop() { current_ref() = this; }
    ~test_loop() { current_ref() = nullptr; }

    void post(cc::detail::work_item& item) noexcept override {
        {
            std::lock_guard lock(mutex_);
            queue_.push_back(&item);
        }
        cv_.notify_one();
    }
    void run_until(const std::atomic<bool>& done) override {
        ++runs_;
        std::unique_lock lock(mutex_);
        while (!done.load(std::memory_order_acquire)) {
            if (!queue_.empty()) {
                cc::detail::work_item* item = queue_.front();
                queue_.pop_front();
                lock.unlock();
                ++items_run_;
                item->run_(item);
                lock.lock();
                continue;
            }
            cv_.wait(lock, [&] { return !queue_.empty(); });
        }
    }

    bool run_until(bool (*ready)(const void*) noexcept, const void* arg,
                   std::chrono::steady_clock::time_point deadline) override {
        ++runs_;
        std::unique_lock lock(mutex_);
        while (!ready(arg)) {
            if (!queue_.empty()) {
                cc::detail::work_item* item = queue_.front();
                queue_.pop_front();
                lock.unlock();
                ++items_run_;
                item->run_(item);
                lock.lock();
                continue;
            }
            if (!cv_.wait_until(lock, deadline, [&] { return !queue_.empty(); })) break;
        }
        return ready(arg);
    }

    int runs() const noexcept { return runs_; }
    int items_run() const noexcept { return items_run_; }

private:
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<cc::detail::work_item*> queue_;
    int runs_ = 0;
    int items_run_ = 0;
};

/// Suspends, and has another thread post the continuation to `loop`, which resumes it on the
/// loop's thread: what an io completion does.
class post_from_other_thread : private cc::detail::work_item {
public:
    explicit post_from_other_thread(test_loop& loop) : loop_(loop) {}
    post_from_other_thread(const post_from_other_thread&) = delete;
    post_from_other_thread& operator=(const post_from_other_thread&) = delete;

    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) {
        continuation_ = h;
        run_ = &on_loop;
        poster_ = std::thread([this] { loop_.post(*this); });
    }
    void await_resume() { poster_.join(); }

private:
    static void on_loop(cc::detail::work_item* item) noexcept {
        static_cast<post_from_other_thread*>(item)->continuation_.resume();
    }

    test_loop& loop_;
    std::coroutine_handle<> continuation_;
    std::thread poster_;
};

}  // namespace

TEST_CASE("sync_wait returns the value of the awaitable") {
    CHECK(cc::sync_wait(value_of(3)) == 3);
    CHECK(cc::sync_wait([]() -> cc::task<std::string> { co_return "text"; }()) == "text");
    auto p = cc::sync_wait(
        []() -> cc::task<std::unique_ptr<int>> { co_return std::make_unique<int>(4); }());
    static_assert(std::is_same_v<decltype(p), std::unique_ptr<int>>);
    REQUIRE(p);
    CHECK(*p == 4);
    CHECK(cc::sync_wait(ready_awaiter{9}) == 9);
}

TEST_CASE("sync_wait accepts an awaiter that can be neither copied nor moved") {
    CHECK(cc::sync_wait(pinned_awaiter(4)) == 4);
    pinned_awaiter lvalue(5);
    CHECK(cc::sync_wait(lvalue) == 5);
    CHECK(cc::sync_wait(std::move(lvalue)) == 5);
}

TEST_CASE("sync_wait of a task<void> runs it to the end") {
    bool ran = false;
    cc::sync_wait([](bool& r) -> cc::task<> {
        r = true;
        co_return;
    }(ran));
    CHECK(ran);
    static_assert(std::is_void_v<decltype(cc::sync_wait(std::declval<cc::task<>>()))>);
    cc::sync_wait(std::suspend_never{});
}

TEST_CASE("sync_wait returns references, not copies") {
    int target = 0;
    int& r = cc::sync_wait([](int& x) -> cc::task<int&> { co_return x; }(target));
    static_assert(std::is_same_v<decltype(cc::sync_wait(std::declval<cc::task<int&>>())), int&>);
    CHECK(&r == &target);

    // An lvalue task: the result stays in the task and sync_wait refers to it.
    auto t = value_of(5);
    static_assert(std::is_same_v<decltype(cc::sync_wait(t)), int&>);
    int& in_task = cc::sync_wait(t);
    CHECK(in_task == 5);
    in_task = 6;
    CHECK(cc::sync_wait(t) == 6);
    CHECK(&cc::sync_wait(t) == &in_task);

    counts.reset();
    {
        auto ct = []() -> cc::task<counted> { co_return counted(1); }();
        counted& c1 = cc::sync_wait(ct);
        counted& c2 = cc::sync_wait(ct);
        CHECK(&c1 == &c2);
        CHECK(counts.alive() == 1);
        CHECK(counts.copied.load() == 0);
    }
    CHECK(counts.alive() == 0);
    CHECK(counts.bad_destroys.load() == 0);
}

TEST_CASE("sync_wait rethrows the exception of the awaitable") {
    CHECK_THROWS_WITH_AS(cc::sync_wait([]() -> cc::task<int> {
                             throw std::invalid_argument("bad");
                             co_return 0;
                         }()),
                         "bad", std::invalid_argument);
    CHECK_THROWS_AS(cc::sync_wait([]() -> cc::task<> {
                        throw 42;
                        co_return;
                    }()),
                    int);
}

TEST_CASE("sync_wait blocks until an awaitable completes on another thread") {
    const auto main_id = std::this_thread::get_id();
    REQUIRE(cc::detail::event_loop::current() == nullptr);
    for (int round = 0; round < 50; ++round) {
        manual_event event;
        std::thread::id resumed_on;
        // The setter waits until the task has suspended, so sync_wait must block and be woken.
        std::thread setter([&] {
            if (wait_until([&] { return event.has_waiter(); })) event.set();
        });
        int v = cc::sync_wait([](manual_event& e, std::thread::id& id) -> cc::task<int> {
            co_await e;
            id = std::this_thread::get_id();
            co_return 11;
        }(event, resumed_on));
        setter.join();
        CHECK(v == 11);
        CHECK(resumed_on != main_id);
    }
}

TEST_CASE("sync_wait returns promptly when completion on another thread races with its wait") {
    thread_hopper hopper;
    for (int round = 0; round < 200; ++round) {
        int v = cc::sync_wait([](thread_hopper& h, int r) -> cc::task<int> {
            co_await h.hop();
            co_return r;
        }(hopper, round));
        REQUIRE(v == round);
    }
    hopper.join();
}

TEST_CASE("sync_wait of when_all returns every child's result") {
    thread_hopper hopper;
    auto remote = [&](int v) -> cc::task<int> {
        co_await hopper.hop();
        co_return v;
    };
    auto [a, b, c] = cc::sync_wait(cc::when_all(value_of(1), remote(2), remote(3)));
    hopper.join();
    CHECK(a == 1);
    CHECK(b == 2);
    CHECK(c == 3);
}

TEST_CASE("sync_wait runs the thread's event loop until the awaitable completes") {
    const auto main_id = std::this_thread::get_id();
    test_loop loop;
    REQUIRE(cc::detail::event_loop::current() == &loop);

    SUBCASE("work posted to the loop resumes on the waiting thread") {
        std::thread::id resumed_on;
        int v = cc::sync_wait([](test_loop& l, std::thread::id& id) -> cc::task<int> {
            co_await post_from_other_thread(l);
            id = std::this_thread::get_id();
            co_return 8;
        }(loop, resumed_on));
        CHECK(v == 8);
        CHECK(resumed_on == main_id);
        CHECK(loop.runs() == 1);
        CHECK(loop.items_run() == 1);
    }
    SUBCASE("completion on another thread reaches the loop as a posted item") {
        manual_event event;
        std::thread setter([&] {
            if (wait_until([&] { return event.has_waiter(); })) event.set();
        });
        cc::sync_wait([](manual_event& e) -> cc::task<> { co_await e; }(event));
        setter.join();
        CHECK(loop.runs() == 1);
        CHECK(loop.items_run() == 1);
    }
    SUBCASE("completion on the loop's own thread needs no post") {
        CHECK(cc::sync_wait(value_of(1)) == 1);
        CHECK(loop.items_run() == 0);
    }
}
