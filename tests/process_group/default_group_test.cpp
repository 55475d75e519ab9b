// The torch-style free functions on a thread's default group, blocking, as plain (non-
// coroutine) programs call them. Ranks are threads: the default group is per thread.

#include <corocoll/corocoll.hpp>

#include <doctest/doctest.h>

#include "../support/port.hpp"
#include "../support/ranks.hpp"

#include <stdexcept>
#include <string>
#include <vector>

using namespace corocoll_test;

TEST_CASE("before init, rank is 0 and world size 1; calls say the group is missing") {
    CHECK_FALSE(cc::is_initialized());
    CHECK(cc::get_rank() == 0);
    CHECK(cc::get_world_size() == 1);
    std::vector<int> t{1};
    CHECK_THROWS_WITH_AS(cc::all_reduce(t), doctest::Contains("not initialized"), std::logic_error);
}

TEST_CASE("blocking p2p and collectives on the default group of each rank") {
    reserved_port port;
    constexpr int n = 3;
    auto errors = on_threads(n, [&](int rank) {
        cc::init_options o;
        o.init_method = "tcp://" + port.host_port();
        o.rank = rank;
        o.world_size = n;
        o.timeout = 20s;
        cc::init_process_group(o);
        if (!cc::is_initialized() || cc::get_rank() != rank || cc::get_world_size() != n) {
            throw std::runtime_error("rank or size");
        }
        std::vector<std::int64_t> t{1 + 2 * rank, 2 + 2 * rank};
        cc::all_reduce(t);
        if (t != std::vector<std::int64_t>{9, 12}) throw std::runtime_error("all_reduce");
        std::vector<float> b{float(rank)};
        cc::broadcast(b, 2);
        if (b[0] != 2.0f) throw std::runtime_error("broadcast");
        cc::barrier();
        std::vector<std::string> names;
        // Appended rather than `std::string("r") + ...`: g++ 12 at -O3 warns falsely
        // (-Wrestrict) on that concatenation, and release builds treat warnings as errors.
        std::string mine = "r";
        mine += std::to_string(rank);
        cc::all_gather_object(names, mine);
        if (names != std::vector<std::string>{"r0", "r1", "r2"})
            throw std::runtime_error("all_gather_object");
        std::vector<int> v{rank};
        if (rank == 0) {
            cc::send(v, 1);
        } else if (rank == 1) {
            if (cc::recv(v, 0) != 0 || v[0] != 0) throw std::runtime_error("recv");
        }
        auto pair = cc::new_group({0, 1});
        if ((pair != nullptr) != (rank < 2)) throw std::runtime_error("new_group membership");
        if (pair) cc::sync_wait(pair->close());
        cc::destroy_process_group();
        if (cc::is_initialized() || cc::get_rank() != 0) throw std::runtime_error("destroy");
    });
    check_every_rank_ok(errors);
}
