// Timeouts everywhere: spawn and run_or_spawn take init options (and COROCOLL_TIMEOUT reaches
// spawned ranks), and work::wait(timeout) is torch's Work.wait(timeout).

#include <corocoll/corocoll.hpp>

#include <doctest/doctest.h>

#include "../support/core.hpp"
#include "../support/port.hpp"
#include "../support/ranks.hpp"

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

using namespace corocoll_test;

TEST_CASE("spawn's ranks set their groups up with the init options given to spawn") {
    cc::init_options init;
    init.timeout = 1234ms;
    auto result = cc::spawn_ranks(
        2,
        [](cc::process_group& pg) -> cc::task<> {
            if (pg.timeout() != 1234ms) {
                throw std::runtime_error("timeout " + std::to_string(pg.timeout().count()));
            }
            co_await pg.barrier();
        },
        init);
    for (const auto& r : result.ranks) {
        CAPTURE(r.describe());
        CHECK(r.ok());
    }
    cc::init_options ranked;
    ranked.rank = 0;
    CHECK_THROWS_WITH_AS(cc::spawn_ranks(
                             2, [](cc::process_group&) -> cc::task<> { co_return; }, ranked),
                         doctest::Contains("set by spawn"), std::invalid_argument);
}

TEST_CASE("COROCOLL_TIMEOUT is every spawned rank's default timeout") {
    ::setenv("COROCOLL_TIMEOUT", "7", 1);
    auto result = cc::spawn_ranks(2, [](cc::process_group& pg) -> cc::task<> {
        if (pg.timeout() != 7s) {
            throw std::runtime_error("timeout " + std::to_string(pg.timeout().count()));
        }
        co_await pg.barrier();
    });
    ::unsetenv("COROCOLL_TIMEOUT");
    for (const auto& r : result.ranks) {
        CAPTURE(r.describe());
        CHECK(r.ok());
    }
}

TEST_CASE("work::wait(timeout) gives up on a receive nobody sent, which still completes later") {
    reserved_port port;
    std::atomic<bool> gave_up{false};
    std::vector<std::string> timeout_errors(2);
    auto errors = on_threads(2, [&](int rank) {
        cc::init_options o;
        o.init_method = "tcp://" + port.host_port();
        o.rank = rank;
        o.world_size = 2;
        o.timeout = 20s;
        cc::init_process_group(o);
        std::vector<int> v{rank == 0 ? 42 : 0};
        if (rank == 0) {
            // Sends only after rank 1's wait has given up.
            if (!wait_until([&] { return gave_up.load(); }, 20s)) throw std::runtime_error("late");
            cc::send(v, 1);
        } else {
            auto w = cc::irecv(v, 0);
            try {
                w.wait(50ms);
            } catch (const std::system_error& e) {
                if (e.code() == std::errc::timed_out) timeout_errors[1] = e.what();
            }
            CHECK_FALSE(w.is_completed());
            gave_up = true;
            if (w.wait(20s) != 0 || v[0] != 42) throw std::runtime_error("the receive");
        }
        cc::destroy_process_group();
    });
    check_every_rank_ok(errors);
    CHECK(timeout_errors[1].find("work::wait: the operation did not finish within 50 ms") !=
          std::string::npos);
}
