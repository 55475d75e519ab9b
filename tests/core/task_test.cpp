#include <corocoll/core/sync_wait.hpp>
#include <corocoll/core/task.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <coroutine>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../support/core.hpp"

namespace cc = corocoll;
using namespace corocoll_test;

// What awaiting a task yields: a value for an rvalue, a reference into the task for an lvalue.
static_assert(std::is_same_v<cc::await_result_t<cc::task<int>>, int>);
static_assert(std::is_same_v<cc::await_result_t<cc::task<int>&>, int&>);
static_assert(std::is_same_v<cc::await_result_t<cc::task<int&>>, int&>);
static_assert(std::is_same_v<cc::await_result_t<cc::task<int&>&>, int&>);
static_assert(std::is_same_v<cc::await_result_t<cc::task<>>, void>);
static_assert(
    std::is_same_v<cc::await_result_t<cc::task<std::unique_ptr<int>>>, std::unique_ptr<int>>);
static_assert(!std::is_copy_constructible_v<cc::task<int>>);
static_assert(std::is_nothrow_move_constructible_v<cc::task<int>>);
static_assert(std::is_nothrow_move_assignable_v<cc::task<int>>);

namespace {

cc::task<int> value_of(int v) { co_return v; }

cc::task<int> flag_then_return(bool& ran, int v) {
    ran = true;
    co_return v;
}

cc::task<counted> make_counted(int v) { co_return counted(v); }

cc::task<counted> make_counted_from_local(int v) {
    counted local(v);
    co_return local;  // implicitly moved
}

cc::task<int> take_counted(counted c) { co_return c.value(); }

cc::task<int> throw_counted(int v) {
    counted local(v);
    throw counted_error(v);
    co_return local.value();
}

cc::task<int> rethrow_through(int v) {
    counted local(v + 1);
    co_return co_await throw_counted(v) + local.value();
}

cc::task<int> catch_counted(int v) {
    try {
        co_return co_await rethrow_through(v);
    } catch (const counted_error& e) {
        co_return -e.payload.value();
    }
}

}  // namespace

TEST_CASE("a task does not run its body until it is awaited") {
    bool ran = false;
    auto t = flag_then_return(ran, 7);
    CHECK_FALSE(ran);
    CHECK(t);
    CHECK_FALSE(t.is_ready());
    CHECK(cc::sync_wait(std::move(t)) == 7);
    CHECK(ran);
}

TEST_CASE("a task destroyed without being awaited never runs its body") {
    bool ran = false;
    { auto t = flag_then_return(ran, 1); }
    CHECK_FALSE(ran);
}

TEST_CASE("a task yields the value it returns") {
    CHECK(cc::sync_wait(value_of(42)) == 42);
    auto outer = []() -> cc::task<int> { co_return co_await value_of(1) + co_await value_of(2); };
    CHECK(cc::sync_wait(outer()) == 3);
}

TEST_CASE("a task<void> runs its body to the end") {
    int steps = 0;
    auto inner = [](int& s) -> cc::task<> {
        ++s;
        co_return;
    };
    auto outer = [&](int& s) -> cc::task<> {
        co_await inner(s);
        co_await inner(s);
        ++s;
    };
    cc::sync_wait(outer(steps));
    CHECK(steps == 3);
}

TEST_CASE("a returned value is constructed and destroyed exactly once per copy, without copies") {
    counts.reset();
    SUBCASE("awaited as an rvalue") {
        auto outer = []() -> cc::task<int> {
            counted c = co_await make_counted(5);
            counted d = co_await make_counted_from_local(6);
            co_return c.value() + d.value();
        };
        CHECK(cc::sync_wait(outer()) == 11);
    }
    SUBCASE("returned through sync_wait") {
        counted c = cc::sync_wait(make_counted(8));
        CHECK(c.value() == 8);
        CHECK(counts.alive() == 1);
    }
    SUBCASE("moved out of a task that was moved") {
        auto outer = []() -> cc::task<int> {
            auto t1 = make_counted(9);
            cc::task<counted> t2(std::move(t1));
            CHECK_FALSE(t1);
            cc::task<counted> t3;
            t3 = std::move(t2);
            counted c = co_await std::move(t3);
            co_return c.value();
        };
        CHECK(cc::sync_wait(outer()) == 9);
    }
    CHECK(counts.alive() == 0);
    CHECK(counts.copied.load() == 0);
    CHECK(counts.bad_destroys.load() == 0);
}

TEST_CASE("a task awaited as an lvalue keeps its result until the task is destroyed") {
    counts.reset();
    auto outer = []() -> cc::task<int> {
        auto t = make_counted(3);
        counted& first = co_await t;
        CHECK(counts.alive() == 1);
        CHECK(t.is_ready());
        const int constructed = counts.constructed.load();
        // A finished task is ready: awaiting it again gives the same object without rerunning.
        counted& second = co_await t;
        CHECK(&first == &second);
        CHECK(counts.constructed.load() == constructed);
        co_return first.value();
    };
    CHECK(cc::sync_wait(outer()) == 3);
    CHECK(counts.alive() == 0);
    CHECK(counts.copied.load() == 0);
    CHECK(counts.bad_destroys.load() == 0);
}

TEST_CASE("a task destroyed without being awaited destroys its arguments once") {
    counts.reset();
    {
        auto t = take_counted(counted(4));
        CHECK(counts.alive() == 1);  // the copy in the frame
    }
    CHECK(counts.alive() == 0);
    CHECK(counts.bad_destroys.load() == 0);

    SUBCASE("and move-assigning over a task destroys the frame it held") {
        auto t = take_counted(counted(5));
        t = take_counted(counted(6));
        CHECK(counts.alive() == 1);
        CHECK(cc::sync_wait(std::move(t)) == 6);
    }
    CHECK(counts.alive() == 0);
    CHECK(counts.bad_destroys.load() == 0);
}

TEST_CASE("an exception thrown in a nested task is caught by the awaiting coroutine") {
    counts.reset();
    CHECK(cc::sync_wait(catch_counted(10)) == -10);
    CHECK(counts.alive() == 0);
    CHECK(counts.bad_destroys.load() == 0);
}

TEST_CASE("sync_wait rethrows the exception that escaped a task") {
    counts.reset();
    bool caught = false;
    try {
        cc::sync_wait(rethrow_through(20));
    } catch (const counted_error& e) {
        caught = true;
        CHECK(e.payload.value() == 20);
    }
    CHECK(caught);
    CHECK_THROWS_WITH_AS(cc::sync_wait([]() -> cc::task<> {
                             throw std::out_of_range("deep");
                             co_return;
                         }()),
                         "deep", std::out_of_range);
    CHECK(counts.alive() == 0);
    CHECK(counts.bad_destroys.load() == 0);
}

TEST_CASE("an exception stays in an lvalue-awaited task and is rethrown on every await") {
    counts.reset();
    auto outer = []() -> cc::task<int> {
        auto t = throw_counted(1);
        int caught = 0;
        for (int i = 0; i < 2; ++i) {
            try {
                co_await t;
            } catch (const counted_error&) {
                ++caught;
            }
        }
        co_return caught;
    };
    CHECK(cc::sync_wait(outer()) == 2);
    CHECK(counts.alive() == 0);
    CHECK(counts.bad_destroys.load() == 0);
}

namespace {

// ThreadSanitizer records the whole call stack at every allocation, so deep recursion costs it
// time quadratic in the depth (10,000 nested tasks: 6 s). These two tests are single-threaded
// and tell TSan nothing; under it they run smaller so that the executable stays quick.
#if defined(__SANITIZE_THREAD__)
constexpr int size_divisor = 10;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr int size_divisor = 10;
#else
constexpr int size_divisor = 1;
#endif
#else
constexpr int size_divisor = 1;
#endif

cc::task<std::int64_t> leaf(int i) { co_return i; }

cc::task<std::int64_t> sum_of_leaves(int n) {
    std::int64_t sum = 0;
    for (int i = 0; i < n; ++i) sum += co_await leaf(i);
    co_return sum;
}

cc::task<> void_leaf(int& n) {
    ++n;
    co_return;
}

cc::task<int> nested(int depth) {
    if (depth == 0) co_return 0;
    co_return 1 + co_await nested(depth - 1);
}

}  // namespace

TEST_CASE("a million synchronously completing awaits in a loop do not overflow the stack") {
    constexpr int n = 1'000'000 / size_divisor;
    CHECK(cc::sync_wait(sum_of_leaves(n)) == std::int64_t{n} * (n - 1) / 2);

    int calls = 0;
    cc::sync_wait([](int& c) -> cc::task<> {
        for (int i = 0; i < n; ++i) co_await void_leaf(c);
    }(calls));
    CHECK(calls == n);
}

TEST_CASE("tasks nested ten thousand deep awaiting each other complete") {
    // Each level of nesting is a few stack frames (the awaiter starts the task inline): about
    // 0.2 KiB at g++ -O0, 0.6 KiB under g++ ASan and over 0.8 KiB under clang++ 14 ASan, which
    // overflows a default 8 MiB stack at this depth. Run on a stack of known size instead.
    constexpr int depth = 10'000 / size_divisor;
    int result = -1;
    run_with_stack(64 << 20, [&] { result = cc::sync_wait(nested(depth)); });
    CHECK(result == depth);
}

TEST_CASE("a task can return a move-only type") {
    auto make = [](int v) -> cc::task<std::unique_ptr<int>> { co_return std::make_unique<int>(v); };
    auto outer = [&]() -> cc::task<int> {
        std::unique_ptr<int> a = co_await make(1);
        auto t = make(2);
        std::unique_ptr<int>& b = co_await t;  // lvalue await: the result stays in the task
        std::unique_ptr<int> c = std::move(b);
        CHECK(b == nullptr);
        co_return *a + *c;
    };
    CHECK(cc::sync_wait(outer()) == 3);
    std::unique_ptr<int> p = cc::sync_wait(make(5));
    REQUIRE(p);
    CHECK(*p == 5);
}

TEST_CASE("a task<T&> returns a reference to the object, not a copy") {
    int target = 1;
    auto ref_to = [](int& x) -> cc::task<int&> { co_return x; };
    auto outer = [&]() -> cc::task<int&> {
        int& r = co_await ref_to(target);
        CHECK(&r == &target);
        r = 2;
        auto t = ref_to(target);
        int& again = co_await t;
        CHECK(&again == &target);
        co_return again;
    };
    int& result = cc::sync_wait(outer());
    CHECK(&result == &target);
    CHECK(target == 2);

    counts.reset();
    {
        counted c(7);
        auto ref_counted = [](counted& x) -> cc::task<counted&> { co_return x; };
        counted& r = cc::sync_wait(ref_counted(c));
        CHECK(&r == &c);
    }
    CHECK(counts.constructed.load() == 1);
    CHECK(counts.alive() == 0);
}

TEST_CASE("awaiting a default-constructed task throws std::logic_error") {
    auto outer = []() -> cc::task<int> {
        cc::task<int> empty;
        CHECK_FALSE(empty);
        CHECK_FALSE(empty.is_ready());
        co_return co_await std::move(empty);
    };
    CHECK_THROWS_AS(cc::sync_wait(outer()), std::logic_error);
    CHECK_THROWS_AS(cc::sync_wait(cc::task<>{}), std::logic_error);
}

TEST_CASE("awaiting a moved-from task throws std::logic_error") {
    bool ran = false;
    auto outer = [&]() -> cc::task<int> {
        auto t = flag_then_return(ran, 1);
        auto keeper = std::move(t);
        co_return co_await t;  // NOLINT(bugprone-use-after-move): that is the point
    };
    CHECK_THROWS_AS(cc::sync_wait(outer()), std::logic_error);
    CHECK_FALSE(ran);
}

TEST_CASE("a task that completes on another thread after its awaiter suspended resumes it there") {
    manual_event event;
    std::thread::id inner_id;
    std::thread::id outer_id;
    auto inner = [&]() -> cc::task<int> {
        co_await event;
        inner_id = std::this_thread::get_id();
        co_return 5;
    };
    auto outer = [&]() -> cc::task<int> {
        int v = co_await inner();
        outer_id = std::this_thread::get_id();
        co_return v + 1;
    };
    outcome<int> out;
    run_detached(outer(), out);  // returns once outer, inner and the event all wait
    REQUIRE_FALSE(out.done);
    std::thread::id setter_id;
    std::thread setter([&] {
        setter_id = std::this_thread::get_id();
        event.set();
    });
    setter.join();
    REQUIRE(out.done);
    CHECK(out.value == 6);
    CHECK(inner_id == setter_id);
    CHECK(outer_id == setter_id);
}

TEST_CASE("a task racing to complete on another thread resumes its awaiter exactly once") {
    // The other thread may finish the task before or after the awaiter has suspended; either
    // way the awaiter goes on once, on one of the two threads.
    const auto main_id = std::this_thread::get_id();
    thread_hopper hopper;
    for (int round = 0; round < 100; ++round) {
        std::thread::id inner_id;
        std::thread::id outer_id;
        int resumed = 0;
        auto inner = [&]() -> cc::task<int> {
            co_await hopper.hop();
            inner_id = std::this_thread::get_id();
            co_return round;
        };
        auto outer = [&]() -> cc::task<int> {
            int v = co_await inner();
            ++resumed;
            outer_id = std::this_thread::get_id();
            co_return v + 1;
        };
        REQUIRE(cc::sync_wait(outer()) == round + 1);
        hopper.join();
        CHECK(resumed == 1);
        CHECK(inner_id != main_id);
        CHECK((outer_id == inner_id || outer_id == main_id));
    }
}

namespace {

// Resumes the awaiting coroutine from inside its own await_suspend, then reports it suspended:
// the coroutine runs on, to its end, before the awaiter's start has returned.
struct resume_from_inside {
    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<> h) {
        h.resume();
        return true;
    }
    void await_resume() const noexcept {}
};

}  // namespace

TEST_CASE("a task that its own awaitable resumes and ends inside its start goes on once") {
    int resumed = 0;
    auto inner = []() -> cc::task<int> {
        co_await resume_from_inside{};
        co_return 7;
    };
    auto outer = [&]() -> cc::task<int> {
        int v = co_await inner();
        ++resumed;
        co_return v + 1;
    };
    CHECK(cc::sync_wait(outer()) == 8);
    CHECK(resumed == 1);
}

TEST_CASE("a task resumed inside another task's start hands back to its own awaiter") {
    // The first task waits on the event; a second, started later, sets it: the first one's end
    // runs inside the second one's start, on the same thread, and still resumes its own
    // awaiter (not the second one's), once.
    manual_event event;
    std::vector<std::string> order;
    auto waiter = [&]() -> cc::task<int> {
        co_await event;
        order.push_back("waiter ends");
        co_return 1;
    };
    auto first = [&]() -> cc::task<int> {
        int v = co_await waiter();
        order.push_back("first goes on");
        co_return v + 10;
    };
    auto setter = [&]() -> cc::task<int> {
        order.push_back("setter starts");
        event.set();
        order.push_back("setter ends");
        co_return 2;
    };
    auto second = [&]() -> cc::task<int> {
        int v = co_await setter();
        order.push_back("second goes on");
        co_return v + 20;
    };
    outcome<int> one;
    run_detached(first(), one);
    REQUIRE_FALSE(one.done);
    CHECK(cc::sync_wait(second()) == 22);
    REQUIRE(one.done);
    CHECK(one.value == 11);
    CHECK(order == std::vector<std::string>{"setter starts", "waiter ends", "first goes on",
                                            "setter ends", "second goes on"});
}

TEST_CASE("a task completes when a manual event is set after it suspended") {
    manual_event event;
    bool after = false;
    auto waiter = [&]() -> cc::task<int> {
        co_await event;
        after = true;
        co_return 3;
    };
    outcome<int> out;
    run_detached(waiter(), out);
    CHECK(event.has_waiter());
    CHECK_FALSE(after);
    CHECK_FALSE(out.done);
    event.set();
    CHECK(after);
    REQUIRE(out.done);
    CHECK(out.value == 3);
}

namespace {

// The address of the calling coroutine's frame.
struct own_frame {
    void* address = nullptr;
    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<> h) noexcept {
        address = h.address();
        return false;  // carry on at once
    }
    void* await_resume() const noexcept { return address; }
};

cc::task<void*> where_am_i() { co_return co_await own_frame{}; }

}  // namespace

TEST_CASE("a finished task's frame is reused by the next one of its size, on any thread") {
    void* first = cc::sync_wait(where_am_i());
    void* second = cc::sync_wait(where_am_i());
#if COROCOLL_FRAME_POOL
    CHECK(second == first);  // the pool handed the same block back
#else
    CHECK(first != nullptr);
    CHECK(second != nullptr);
    MESSAGE("frame pool off (AddressSanitizer): frames come from operator new");
#endif
    // A frame made here and freed on another thread stays usable there.
    auto t = where_am_i();
    std::thread other([&] { CHECK(cc::sync_wait(std::move(t)) != nullptr); });
    other.join();
    // Many frames alive at once, freed in any order, are all distinct and all come back.
    std::vector<cc::task<void*>> many;
    for (int i = 0; i < 200; ++i) many.push_back(where_am_i());
    std::vector<void*> seen;
    for (auto& m : many) seen.push_back(cc::sync_wait(std::move(m)));
    std::sort(seen.begin(), seen.end());
    CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
}
