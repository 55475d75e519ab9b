#include "../support/ranks.hpp"

#include <doctest/doctest.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using namespace corocoll_test;

namespace {

// Sets environment variables for one test and restores them (unset) when it ends.
struct scoped_env {
    scoped_env(std::initializer_list<std::pair<std::string, std::string>> vars) : vars_(vars) {
        for (const auto& [k, v] : vars_) ::setenv(k.c_str(), v.c_str(), 1);
    }
    scoped_env(const scoped_env&) = delete;
    scoped_env& operator=(const scoped_env&) = delete;
    ~scoped_env() {
        for (const auto& [k, v] : vars_) ::unsetenv(k.c_str());
    }
    std::vector<std::pair<std::string, std::string>> vars_;
};

// Two ranks as threads set up a group through a store this function serves; returns what
// each rank's init_process_group threw.
std::vector<std::string> init_errors_of_two_ranks() {
    cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0));
    auto errors = run_ranks(2, [&](int rank, cc::io::reactor& r) -> cc::task<> {
        cc::init_options o;
        o.rank = rank;
        o.world_size = 2;
        o.timeout = 20s;
        o.store = co_await cc::rendezvous::tcp_store::connect(r, server.local_endpoint(), 20s);
        auto pg = co_await cc::init_process_group(r, o);
        co_await pg->close();
    });
    return {what(errors[0]), what(errors[1])};
}

}  // namespace

TEST_CASE("an unknown COROCOLL_ALGORITHM fails set-up on every rank, naming the variable") {
    SUBCASE("an unknown name") {
        scoped_env env{{"COROCOLL_ALGORITHM", "bogus"}};
        for (int rank = 0; rank < 2; ++rank) {
            CAPTURE(rank);
            std::string e = init_errors_of_two_ranks()[static_cast<std::size_t>(rank)];
            CHECK(e.find("rank " + std::to_string(rank) + ": COROCOLL_ALGORITHM='bogus'") !=
                  std::string::npos);
            CHECK(e.find("unknown algorithm 'bogus' (known: auto, ring,") != std::string::npos);
        }
    }
    SUBCASE("an algorithm the collective does not have") {
        scoped_env env{{"COROCOLL_ALGORITHM", "broadcast=chain,all_reduce=bruck"}};
        for (const auto& e : init_errors_of_two_ranks()) {
            CHECK(e.find("COROCOLL_ALGORITHM='broadcast=chain,all_reduce=bruck': all_reduce has "
                         "no algorithm 'bruck' (it has: auto, ring, recursive_doubling, "
                         "hierarchical, shm)") != std::string::npos);
        }
    }
    SUBCASE("an unknown collective") {
        scoped_env env{{"COROCOLL_ALGORITHM", "allreduce=ring"}};
        for (const auto& e : init_errors_of_two_ranks()) {
            CHECK(e.find("unknown collective 'allreduce'") != std::string::npos);
        }
    }
}

TEST_CASE("ranks as processes with a misspelt COROCOLL_ALGORITHM exit with an error, not abort") {
    scoped_env env{{"COROCOLL_ALGORITHM", "all_reduce=bruck"}};
    cc::spawn_options o;
    o.stop_others_on_failure = false;  // each rank must end on its own
    o.timeout = 60s;
    auto result = cc::spawn_ranks(
        2, [](cc::process_group&) -> cc::task<> { co_return; }, o);
    for (const auto& rank : result.ranks) {
        CAPTURE(rank.describe());
        CHECK(rank.signal == 0);
        CHECK(rank.exit_code == 1);
    }
}

TEST_CASE("every COROCOLL_* value is checked before the store is reached") {
    // MASTER_PORT is a port nobody listens on: reaching the store would take the whole timeout.
    const std::pair<const char*, const char*> bad[] = {
        {"COROCOLL_TRANSPORT", "udp"}, {"COROCOLL_DEBUG", "verbose"},
        {"COROCOLL_TIMEOUT", "30s"},   {"COROCOLL_TIMEOUT", "0"},
        {"COROCOLL_TIMEOUT", "-1"},    {"COROCOLL_BUSY_POLL_US", "fast"},
        {"COROCOLL_STALL_S", "1m"},    {"COROCOLL_ALGORITHM", "all_reduce:ring"},
        {"COROCOLL_CACHE_L2", "2MB"}};
    for (auto [n, v] : bad) {
        std::string name = n, value = v;
        CAPTURE(name);
        CAPTURE(value);
        scoped_env env{{name, value}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}};
        cc::io::reactor r;
        cc::init_options o;
        o.rank = 1;
        o.world_size = 2;
        o.timeout = 3s;
        std::string error;
        try {
            r.run(cc::init_process_group(r, o));
        } catch (const std::exception& e) {
            error = e.what();
        }
        CHECK(error.find(std::string("init_process_group: rank 1: ") + name + "='" + value + "'") !=
              std::string::npos);
    }
}

TEST_CASE("COROCOLL_TIMEOUT sets the default timeout in seconds; code that sets one wins") {
    {
        scoped_env env{{"COROCOLL_TIMEOUT", "2.5"}};
        CHECK(cc::init_options{}.timeout == 2500ms);
        CHECK(cc::read_environment().timeout == 2500ms);
        cc::io::reactor r;
        cc::init_options o;
        o.rank = 0;
        o.world_size = 1;
        auto path =
            std::filesystem::temp_directory_path() / ("corocoll-env-" + std::to_string(::getpid()));
        o.init_method = "file://" + path.string();
        auto pg = r.run(cc::init_process_group(r, o));
        CHECK(pg->timeout() == 2500ms);
        r.run(pg->close());
        o.timeout = 7s;
        pg = r.run(cc::init_process_group(r, o));
        CHECK(pg->timeout() == 7000ms);
        r.run(pg->close());
        std::filesystem::remove(path);
    }
    CHECK(cc::init_options{}.timeout == std::chrono::minutes(30));
    scoped_env bad{{"COROCOLL_TIMEOUT", "soon"}};
    CHECK(cc::init_options{}.timeout == std::chrono::minutes(30));
    CHECK_THROWS_WITH_AS(cc::read_environment(),
                         doctest::Contains("COROCOLL_TIMEOUT='soon' is not a positive number"),
                         std::invalid_argument);
}

TEST_CASE("read_environment accepts every documented value") {
    std::map<std::string, std::string> vars{
        {"COROCOLL_ALGORITHM", "all_reduce=ring,broadcast=auto"},
        {"COROCOLL_TRANSPORT", "tcp"},
        {"COROCOLL_DEBUG", "info"},
        {"COROCOLL_TIMEOUT", "60"},
        {"COROCOLL_BUSY_POLL_US", "0"},
        {"COROCOLL_STALL_S", "2.5"}};
    auto s = cc::read_environment([&](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
    });
    namespace coll = cc::collectives;
    CHECK(s.algorithms.forced(coll::collective_kind::all_reduce) == coll::algorithm::ring);
    CHECK(s.algorithms.forced(coll::collective_kind::broadcast) == coll::algorithm::automatic);
    CHECK(s.transport == cc::transport::transport_choice::tcp);
    CHECK(s.debug == cc::log_level::info);
    CHECK(s.timeout == 60s);
    CHECK(s.busy_poll == 0us);
    CHECK(s.stall == 2500ms);
}

// A build without libcrypto cannot prove a job token: every rank says so before the store is
// reached (not only the ranks that get as far as the mesh, while the others find rank 0 and
// its store gone). A build with it takes the token.
TEST_CASE("COROCOLL_JOB_TOKEN is refused up front where the build cannot use it") {
    auto with_token = [](const char* name) -> const char* {
        return std::string_view(name) == "COROCOLL_JOB_TOKEN" ? "a-token" : nullptr;
    };
    auto empty_token = [](const char* name) -> const char* {
        return std::string_view(name) == "COROCOLL_JOB_TOKEN" ? "" : nullptr;
    };
    CHECK_NOTHROW(cc::read_environment(empty_token));
    if (cc::detail::token_auth_available()) {
        CHECK_NOTHROW(cc::read_environment(with_token));
        return;
    }
    CHECK_THROWS_WITH_AS(cc::read_environment(with_token),
                         doctest::Contains("COROCOLL_JOB_TOKEN is set, but this build of "
                                           "corocoll has no libcrypto"),
                         std::invalid_argument);
    scoped_env env{
        {"COROCOLL_JOB_TOKEN", "a-token"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}};
    cc::io::reactor r;
    cc::init_options o;
    o.rank = 1;
    o.world_size = 2;
    o.timeout = 3s;
    CHECK_THROWS_WITH_AS(r.run(cc::init_process_group(r, o)),
                         doctest::Contains("init_process_group: rank 1: COROCOLL_JOB_TOKEN is "
                                           "set, but this build of corocoll has no libcrypto"),
                         std::invalid_argument);
}
