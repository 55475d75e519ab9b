// How long groups live, as in torch: a group nobody closed closes when its last reference
// goes, from whatever context drops it; destroy_process_group closes every group; a group
// used after that says so instead of touching a reactor that is gone.

#include <corocoll/corocoll.hpp>

#include <doctest/doctest.h>

#include "../support/ranks.hpp"

#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace corocoll_test;

namespace {

// The README's collectives snippet, as written there, plus checks of what it promises.
cc::task<> readme_collectives(cc::process_group& pg) {
    std::vector<std::int64_t> t{1 + 2 * pg.rank(), 2 + 2 * pg.rank()};
    co_await pg.all_reduce(t, cc::reduce_op::sum);  // every rank: {16, 20} with 4 ranks
    std::vector<int> evens{0, 2};
    auto sub = co_await pg.new_group(evens);  // null on ranks 1 and 3
    std::vector<std::string> names;
    co_await pg.all_gather_object(names, std::string("rank ") + std::to_string(pg.rank()));
    if (t != std::vector<std::int64_t>{16, 20}) throw std::runtime_error("all_reduce");
    if ((sub != nullptr) != (pg.rank() % 2 == 0)) throw std::runtime_error("new_group membership");
    if (names != std::vector<std::string>{"rank 0", "rank 1", "rank 2", "rank 3"})
        throw std::runtime_error("all_gather_object");
}

}  // namespace

TEST_CASE(
    "the README's collectives snippet runs as written: its subgroup, never closed, "
    "closes when the body ends (4 ranks as processes)") {
    cc::spawn_options o;
    o.timeout = 60s;  // a rank that hangs fails the test instead of the whole suite's timeout
    auto result = cc::spawn_ranks(4, readme_collectives, o);
    for (const auto& r : result.ranks) {
        CAPTURE(r.describe());
        CHECK(r.ok());
        CHECK_FALSE(r.stopped_by_us);
    }
    CHECK(result.ok());
}

TEST_CASE(
    "a subgroup whose last reference goes inside one of its own collectives' "
    "continuations closes cleanly (ranks as threads)") {
    auto errors = run_threads(3, [](cc::process_group& pg) -> cc::task<> {
        std::vector<int> all(3);
        std::iota(all.begin(), all.end(), 0);
        auto sub = co_await pg.new_group(all);
        std::vector<int> v{pg.rank()};
        co_await sub->all_reduce(v);
        if (v[0] != 3) throw std::runtime_error("all_reduce on the subgroup");
        // The continuation of the subgroup's own receive drops the only reference.
        co_await sub->broadcast(v, 0);
        sub.reset();
        co_await pg.barrier();
    });
    check_every_rank_ok(errors);
}

TEST_CASE("a subgroup whose last reference goes on another thread is closed by its own reactor") {
    auto errors = run_threads(2, [](cc::process_group& pg) -> cc::task<> {
        std::vector<int> both{0, 1};
        auto sub = co_await pg.new_group(both);
        std::weak_ptr<cc::process_group> watch = sub;
        std::thread([s = std::move(sub)]() mutable { s.reset(); }).join();
        // The handover waits in the reactor's queue; the loop runs it, closes, deletes.
        int turns = 0;
        while (!watch.expired() && ++turns < 100000) co_await pg.reactor().schedule();
        if (!watch.expired()) throw std::runtime_error("the subgroup was not closed");
        co_await pg.barrier();
    });
    check_every_rank_ok(errors);
}

TEST_CASE(
    "destroy_process_group closes every group: a subgroup kept past it says it was "
    "closed and is dropped without harm (ranks as processes)") {
    cc::spawn_options o;
    o.timeout = 60s;
    auto result = cc::spawn_processes(
        3,
        [] {
            cc::init_process_group();
            int rank = cc::get_rank();
            auto pair = cc::new_group(std::vector<int>{0, 1});
            if ((pair != nullptr) != (rank < 2)) return 2;
            if (pair) {
                std::vector<int> v{1};
                cc::sync_wait(pair->all_reduce(v));
                if (v[0] != 2) return 3;
            }
            cc::destroy_process_group();
            if (pair) {
                std::vector<int> v{1};
                std::string what;
                try {
                    cc::sync_wait(pair->all_reduce(v));
                } catch (const std::exception& e) {
                    what = e.what();
                }
                std::fprintf(stderr, "rank %d after destroy: %s\n", rank, what.c_str());
                if (what.find("all_reduce") == std::string::npos ||
                    what.find("closed") == std::string::npos ||
                    what.find("rank " + std::to_string(rank)) == std::string::npos) {
                    return 4;
                }
                pair.reset();
            }
            return 0;
        },
        o);
    for (const auto& r : result.ranks) {
        CAPTURE(r.describe());
        CHECK(r.ok());
    }
    CHECK(result.ok());
}

TEST_CASE("co_await pg.new_group({0, 1}) compiles (g++ 12) and makes the group") {
    auto errors = run_threads(3, [](cc::process_group& pg) -> cc::task<> {
        auto pair = co_await pg.new_group({0, 1});
        if ((pair != nullptr) != (pg.rank() < 2)) throw std::runtime_error("membership");
        auto one = co_await pg.new_group({2});
        if ((one != nullptr) != (pg.rank() == 2)) throw std::runtime_error("group of one");
        if (pair) {
            if (pair->size() != 2 || pair->rank() != pg.rank()) throw std::runtime_error("ranks");
            std::vector<int> v{pg.rank() + 1};
            co_await pair->all_reduce(v);
            if (v[0] != 3) throw std::runtime_error("all_reduce on {0, 1}");
            co_await pair->close();
        }
        if (one) co_await one->close();
    });
    check_every_rank_ok(errors);
}
