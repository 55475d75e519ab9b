// The torch-style free functions on a thread's default group, blocking, as plain (non-
// coroutine) programs call them. Ranks are threads: the default group is per thread.

#include <corocoll/corocoll.hpp>

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace cc = corocoll;
using namespace std::chrono_literals;

TEST_CASE("before init, rank is 0 and world size 1; calls say the group is missing") {
    CHECK_FALSE(cc::is_initialized());
    CHECK(cc::get_rank() == 0);
    CHECK(cc::get_world_size() == 1);
    std::vector<int> t{1};
    CHECK_THROWS_WITH_AS(cc::all_reduce(t), doctest::Contains("not initialized"), std::logic_error);
}

TEST_CASE("blocking p2p and collectives on the default group of each rank") {
    std::uint16_t port = [] {
        cc::io::reactor r;
        return cc::io::acceptor::listen(r, cc::io::endpoint::loopback(0)).local_endpoint().port();
    }();
    constexpr int n = 3;
    std::vector<std::string> errors(n);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < n; ++rank) {
        threads.emplace_back([&, rank] {
            try {
                cc::init_options o;
                o.init_method = "tcp://127.0.0.1:" + std::to_string(port);
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
                cc::all_gather_object(names, std::string("r") + std::to_string(rank));
                if (names != std::vector<std::string>{"r0", "r1", "r2"})
                    throw std::runtime_error("all_gather_object");
                std::vector<int> v{rank};
                if (rank == 0) {
                    cc::send(v, 1);
                } else if (rank == 1) {
                    if (cc::recv(v, 0) != 0 || v[0] != 0) throw std::runtime_error("recv");
                }
                auto pair = cc::new_group({0, 1});
                if ((pair != nullptr) != (rank < 2))
                    throw std::runtime_error("new_group membership");
                if (pair) cc::sync_wait(pair->close());
                cc::destroy_process_group();
                if (cc::is_initialized() || cc::get_rank() != 0)
                    throw std::runtime_error("destroy");
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(rank)] = e.what();
            }
        });
    }
    for (auto& t : threads) t.join();
    for (const auto& e : errors) CHECK(e == "");
}
