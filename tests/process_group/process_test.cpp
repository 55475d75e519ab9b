#include <corocoll/corocoll.hpp>

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace cc = corocoll;
using namespace std::chrono_literals;

TEST_CASE("8 ranks as processes pass a token around the ring and exchange with everyone") {
    auto result = cc::spawn_ranks(8, [](cc::process_group& pg) -> cc::task<> {
        int next = (pg.rank() + 1) % pg.size(), prev = (pg.rank() + pg.size() - 1) % pg.size();
        std::vector<std::int64_t> token{0};
        if (pg.rank() == 0) {
            token[0] = 1;
            co_await pg.send(token, next);
            co_await pg.recv(token, prev);
            if (token[0] != 8)
                throw std::runtime_error("token came back as " + std::to_string(token[0]));
        } else {
            co_await pg.recv(token, prev);
            ++token[0];
            co_await pg.send(token, next);
        }
        std::vector<cc::task<>> ops;
        std::vector<std::vector<int>> in(8, std::vector<int>(1, -1)), out(8);
        for (int p = 0; p < pg.size(); ++p) {
            if (p == pg.rank()) continue;
            out[p] = {pg.rank() * 100 + p};
            ops.push_back(pg.send(out[p], p, 1));
            ops.push_back([](cc::process_group& g, std::vector<int>& b, int from) -> cc::task<> {
                co_await g.recv(b, from, 1);
            }(pg, in[p], p));
        }
        co_await cc::when_all(std::move(ops));
        for (int p = 0; p < pg.size(); ++p) {
            if (p != pg.rank() && in[p][0] != p * 100 + pg.rank()) {
                throw std::runtime_error("wrong message from rank " + std::to_string(p));
            }
        }
    });
    for (const auto& r : result.ranks) {
        CAPTURE(r.describe());
        CHECK(r.ok());
    }
    CHECK(result.ok());
}

TEST_CASE("a peer killed during a recv gives every waiting rank an error naming it, in time") {
    cc::spawn_options o;
    o.stop_others_on_failure = false;  // let the survivors report what they saw
    o.timeout = 60s;
    auto t0 = std::chrono::steady_clock::now();
    auto result = cc::spawn_ranks(
        4,
        [](cc::process_group& pg) -> cc::task<> {
            if (pg.rank() == 2) {
                co_await pg.reactor().sleep_for(300ms);  // everyone is waiting by then
                ::raise(SIGKILL);
            }
            std::vector<int> v(1);
            try {
                // Ranks 0 and 1 wait on the victim; rank 3 waits on rank 0, who never sends.
                co_await pg.recv(v, pg.rank() == 3 ? 0 : 2);
            } catch (const std::system_error& e) {
                std::string what = e.what();
                if (what.find("peer rank 2") == std::string::npos) {
                    throw std::runtime_error("error does not name rank 2: " + what);
                }
                std::printf("rank %d saw: %s\n", pg.rank(), what.c_str());
                co_return;
            }
            throw std::runtime_error("recv returned although rank 2 died");
        },
        o);
    auto took = std::chrono::steady_clock::now() - t0;
    for (const auto& r : result.ranks) {
        CAPTURE(r.describe());
        if (r.rank == 2) {
            CHECK(r.signal == SIGKILL);
        } else {
            CHECK(r.ok());
        }
    }
    CHECK(result.first_failure == 2);
    CHECK(took < 20s);  // the group timeout is 30 min: the failure, not a timeout, ended it
}

TEST_CASE("spawn reports which rank failed and how, and stops the others") {
    auto t0 = std::chrono::steady_clock::now();
    auto result = cc::spawn_ranks(3, [](cc::process_group& pg) -> cc::task<> {
        if (pg.rank() == 1) throw std::runtime_error("rank 1 gives up");
        std::vector<int> v(1);
        co_await pg.recv(v, 1);  // would wait for the group timeout without the failure
    });
    CHECK(result.first_failure == 1);
    CHECK(result.ranks[1].exit_code == 1);
    CHECK(result.ranks[1].describe().find("rank 1 (pid ") != std::string::npos);
    CHECK(result.ranks[1].describe().find("exited with code 1") != std::string::npos);
    // It ended on its own: not described as stopped because of another rank.
    CHECK_FALSE(result.ranks[1].stopped_by_us);
    CHECK(result.ranks[1].describe().find("after being stopped") == std::string::npos);
    CHECK(std::chrono::steady_clock::now() - t0 < 20s);
}

TEST_CASE("run_or_spawn's exit code is 0 only when every rank succeeds") {
    CHECK(cc::spawn(2, [](cc::process_group&) -> cc::task<> { co_return; }) == 0);
    CHECK(cc::spawn(2, [](cc::process_group& pg) -> cc::task<> {
              if (pg.rank() == 0) throw std::runtime_error("boom");
              co_return;
          }) == 1);
}
