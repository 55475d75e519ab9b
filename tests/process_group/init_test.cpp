#include "../support/port.hpp"
#include "../support/ranks.hpp"
#include "../support/sanitized.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <thread>

using namespace corocoll_test;

namespace {

// Runs `n` ranks as threads that set up their group with `make_options(rank)` and exchange
// one message around a ring; returns each rank's exception (null when it passed).
std::vector<std::exception_ptr> ring_with(
    int n, const std::function<cc::init_options(int)>& make_options) {
    return run_ranks(n, [&](int rank, cc::io::reactor& r) -> cc::task<> {
        auto pg = co_await cc::init_process_group(r, make_options(rank));
        std::vector<int> out{pg->rank()}, in{-1};
        int next = (pg->rank() + 1) % n, prev = (pg->rank() + n - 1) % n;
        co_await cc::when_all(pg->send(out, next), pg->recv(in, prev));
        if (in[0] != prev) throw std::runtime_error("wrong value in the ring");
        co_await pg->close();
    });
}

}  // namespace

TEST_CASE("tcp://host:port: rank 0 serves the store there and the others find it") {
    reserved_port port;
    std::string method = "tcp://" + port.host_port();
    auto errors = ring_with(3, [&](int rank) {
        cc::init_options o;
        o.init_method = method;
        o.rank = rank;
        o.world_size = 3;
        o.timeout = 20s;
        return o;
    });
    check_every_rank_ok(errors);
}

TEST_CASE("file://path: ranks rendezvous through a shared file") {
    auto path =
        std::filesystem::temp_directory_path() / ("corocoll-init-" + std::to_string(::getpid()));
    std::filesystem::remove(path);
    auto errors = ring_with(3, [&](int rank) {
        cc::init_options o;
        o.init_method = "file://" + path.string();
        o.rank = rank;
        o.world_size = 3;
        o.timeout = 20s;
        return o;
    });
    std::filesystem::remove(path);
    check_every_rank_ok(errors);
}

TEST_CASE("env:// reads MASTER_ADDR and MASTER_PORT; rank 0 serves the store there") {
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    reserved_port port;
    ::setenv("MASTER_PORT", std::to_string(port.port()).c_str(), 1);
    auto errors = ring_with(2, [&](int rank) {
        cc::init_options o;
        o.rank = rank;
        o.world_size = 2;
        o.timeout = 20s;
        return o;
    });
    ::unsetenv("MASTER_ADDR");
    ::unsetenv("MASTER_PORT");
    check_every_rank_ok(errors);
}

TEST_CASE("env:// without MASTER_PORT, and a MASTER_PORT in use, are errors that say so") {
    cc::io::reactor r;
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::unsetenv("MASTER_PORT");
    cc::init_options o;
    o.rank = 0;
    o.world_size = 2;
    o.timeout = 2s;
    std::string missing;
    try {
        r.run(cc::init_process_group(r, o));
    } catch (const std::invalid_argument& e) {
        missing = e.what();
    }
    CHECK(missing.find("rank 0: env:// needs MASTER_ADDR and MASTER_PORT; MASTER_PORT is not "
                       "set") != std::string::npos);

    auto busy = cc::io::acceptor::listen(r, cc::io::endpoint::loopback(0));
    std::string port = std::to_string(busy.local_endpoint().port());
    ::setenv("MASTER_PORT", port.c_str(), 1);
    std::string in_use;
    try {
        r.run(cc::init_process_group(r, o));
    } catch (const std::system_error& e) {
        in_use = e.what();
        CHECK(e.code() == std::errc::address_in_use);
    }
    ::unsetenv("MASTER_ADDR");
    ::unsetenv("MASTER_PORT");
    CHECK(in_use.find("port " + port + " is already in use") != std::string::npos);
}

TEST_CASE("an unknown backend or init method is rejected before anything happens") {
    cc::io::reactor r;
    cc::init_options o;
    o.rank = 0;
    o.world_size = 1;
    o.backend = "mpi";
    CHECK_THROWS_WITH_AS(r.run(cc::init_process_group(r, o)),
                         doctest::Contains("backend 'mpi' is not available"),
                         std::invalid_argument);
    o.backend = "tcp";
    o.init_method = "udp://x";
    CHECK_THROWS_WITH_AS(r.run(cc::init_process_group(r, o)),
                         doctest::Contains("'udp://x' is none of"), std::invalid_argument);
}

namespace {

// Ranks as threads, thread i of a wave with (rank, world size) = wave[i], set up through one store;
// threads of `waves` start one wave after the other (wave k after wave k - 1 has ended).
std::vector<std::string> init_in_waves(const std::vector<std::vector<std::pair<int, int>>>& waves) {
    cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0));
    std::vector<std::string> errors;
    for (const auto& wave : waves) {
        auto got =
            run_ranks(static_cast<int>(wave.size()), [&](int i, cc::io::reactor& r) -> cc::task<> {
                cc::init_options o;
                o.rank = wave[static_cast<std::size_t>(i)].first;
                o.world_size = wave[static_cast<std::size_t>(i)].second;
                o.timeout = 20s;
                o.store =
                    co_await cc::rendezvous::tcp_store::connect(r, server.local_endpoint(), 20s);
                auto pg = co_await cc::init_process_group(r, o);
                co_await pg->close();
            });
        for (const auto& e : got) errors.push_back(what(e));
    }
    return errors;
}

}  // namespace

TEST_CASE("a rank claimed by two processes fails set-up on every rank at once, naming both") {
    // Both rank 1s first, then rank 0: the group can never be whole.
    auto errors = init_in_waves({{{1, 2}, {1, 2}}, {{0, 2}}});
    for (const auto& e : errors) {
        CAPTURE(e);
        CHECK(e.find("rank 1 was claimed by two processes: rank 1 (pid ") != std::string::npos);
        CHECK(e.find("every process needs its own RANK") != std::string::npos);
    }
}

TEST_CASE("a RANK that comes after its group was set up is named as claimed twice, at once") {
    // Ranks 0 and 1 run the job and leave; their claims are gone from the store with them.
    // Another rank 1 found a fresh set-up and waited out its timeout (20 s here) before.
    auto errors = init_in_waves({{{0, 2}, {1, 2}}, {{1, 2}}});
    REQUIRE(errors.size() == 3);
    CHECK(errors[0].empty());
    CHECK(errors[1].empty());
    CAPTURE(errors[2]);
    CHECK(errors[2].find("rank 1 was claimed by two processes: group 'default' was set up with "
                         "all 2 of its ranks in this store before rank 1 (pid ") !=
          std::string::npos);
    CHECK(errors[2].find("timeout") == std::string::npos);
}

TEST_CASE("a RANK that comes while its holder forgets its claim is named by the count of joins") {
    // Between the holder's deleting its claim (set-up over for it) and the last rank's marking
    // the set-up done, a second rank 1 finds the claim free; the count of joins past the world
    // size names it (the roll call alone, on one store, one rank after the other).
    cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0));
    cc::io::reactor r;
    auto connect = [&] {
        return r.run(cc::rendezvous::tcp_store::connect(r, server.local_endpoint(), 20s));
    };
    auto store = connect(), other = connect();  // one connection per rank, as ranks have
    auto deadline = cc::io::deadline_after(20s);
    r.run([&]() -> cc::task<> {
        // Ranks 0 and 1 of 2 join together (the second one's count completes the roll call).
        co_await cc::when_all(cc::detail::roll_call(*store, 0, 2, "g", deadline, false),
                              cc::detail::roll_call(*other, 1, 2, "g", deadline, false));
        co_await store->delete_key("init/rank/1");  // rank 1's set-up is over: its claim goes
    }());
    std::string e;
    try {
        r.run(cc::detail::roll_call(*store, 1, 2, "g", deadline, false));
    } catch (const std::invalid_argument& x) {
        e = x.what();
    }
    CAPTURE(e);
    CHECK(e.find("rank 1 was claimed by two processes: group 'g' was set up with all 2 of its "
                 "ranks in this store before rank 1 (pid ") != std::string::npos);
}

TEST_CASE("ranks that disagree on the world size fail at once, each naming both sizes") {
    auto errors = init_in_waves({{{0, 2}, {1, 3}}});
    for (const auto& e : errors) {
        CAPTURE(e);
        CHECK(e.find("has world size 2") != std::string::npos);
        CHECK(e.find("has world size 3") != std::string::npos);
        CHECK(e.find("start every rank with the same WORLD_SIZE") != std::string::npos);
    }
}

TEST_CASE("when rank 0 serves the store, every rank still reads a bad roll call before it goes") {
    reserved_port port;
    std::string method = "tcp://" + port.host_port();
    auto init = [&](int rank, int size, cc::io::reactor& r) -> cc::task<> {
        cc::init_options o;
        o.init_method = method;
        o.rank = rank;
        o.world_size = size;
        o.timeout = 20s;
        auto pg = co_await cc::init_process_group(r, o);
        co_await pg->close();
    };
    std::vector<std::exception_ptr> first, late;
    std::thread waiting(
        [&] { first = run_ranks(2, [&](int i, cc::io::reactor& r) { return init(i, 3, r); }); });
    // Once ranks 0 and 1 (of 3) have joined, another rank 1 that believes in 2 ranks comes.
    {
        cc::io::reactor r;
        r.run([&]() -> cc::task<> {
            auto store = co_await cc::rendezvous::tcp_store::connect(
                r, cc::io::endpoint::parse(port.host_port()), 20s);
            for (int i = 0; i < 1000; ++i) {  // at most about 10 s
                if (co_await store->add("corocoll/default/0/init/joined", 0) == 2) break;
                co_await r.sleep_until(cc::io::deadline_after(10ms));
            }
        }());
    }
    late = run_ranks(1, [&](int, cc::io::reactor& r) { return init(1, 2, r); });
    waiting.join();
    for (const auto& e : {first[0], first[1], late[0]}) {
        CAPTURE(what(e));
        CHECK(what(e).find("has world size 3") != std::string::npos);
        CHECK(what(e).find("has world size 2") != std::string::npos);
    }
}

TEST_CASE("500 new_group and close cycles leave the store's key count where it started") {
    // Each set-up's keys go once every member has read them: the store does not grow with the
    // number of groups a job makes (it grew by about 13 keys a group; a key a group left behind
    // would show as 500). 2,000 cycles took 35-42 s of every CI build for nothing more.
    // Fewer under a sanitizer, where each set-up takes several times as long.
    const int groups = corocoll_test::sanitized ? 200 : 500;
    std::vector<std::int64_t> counts(2, -1);
    check_every_rank_ok(run_threads(3, [&](cc::process_group& pg) -> cc::task<> {
        co_await pg.barrier();  // every rank's set-up is over, its keys gone
        std::int64_t before = co_await pg.store().num_keys();
        // Nobody starts the first new_group (and writes its keys) before every rank counted:
        // a rank that left the barrier first once did, and rank 0 counted one key too many.
        co_await pg.barrier();
        for (int i = 0; i < groups; ++i) {
            auto g = co_await pg.new_group({0, 1, 2});
            co_await g->close();
        }
        co_await pg.barrier();
        if (pg.rank() == 0) {
            counts[0] = before;
            counts[1] = co_await pg.store().num_keys();
        }
        co_await pg.barrier();  // and nobody closes the group while rank 0 counts
    }));
    INFO("keys before: " << counts[0] << ", after " << groups << " groups: " << counts[1]);
    CHECK(counts[0] >= 0);
    CHECK(counts[1] == counts[0]);
}

TEST_CASE("set-up that lacks a rank names the missing rank at the deadline") {
    cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0));
    auto errors = run_ranks(2, [&](int i, cc::io::reactor& r) -> cc::task<> {
        cc::init_options o;
        o.rank = i == 0 ? 0 : 2;  // rank 1 of 3 never comes
        o.world_size = 3;
        o.timeout = 1s;
        o.store = co_await cc::rendezvous::tcp_store::connect(r, server.local_endpoint(), 5s);
        auto pg = co_await cc::init_process_group(r, o);
        co_await pg->close();
    });
    for (const auto& e : errors) {
        CAPTURE(what(e));
        CHECK(what(e).find("1 of 3 ranks did not join before the timeout; missing: rank(s) 1") !=
              std::string::npos);
    }
}

// The job's store, with the first request of each rank's connecting (any key outside the roll
// call's "init/" ones) held back by `hold`: a set-up whose connecting takes that long.
class slow_after_roll_call final : public cc::rendezvous::store {
public:
    slow_after_roll_call(cc::io::reactor& r, std::shared_ptr<cc::rendezvous::store> base,
                         std::chrono::milliseconds hold)
        : store(base->timeout()), r_(r), base_(std::move(base)), hold_(hold) {}
    cc::task<> set(std::string key, std::string value) override {
        co_await maybe_hold(key);
        co_await base_->set(std::move(key), std::move(value));
    }
    cc::task<std::string> get(std::string key) override {
        co_await maybe_hold(key);
        co_return co_await base_->get(std::move(key));
    }
    cc::task<std::int64_t> add(std::string key, std::int64_t delta) override {
        co_await maybe_hold(key);
        co_return co_await base_->add(std::move(key), delta);
    }
    cc::task<std::string> compare_set(std::string key, std::string expected,
                                      std::string desired) override {
        co_await maybe_hold(key);
        co_return co_await base_->compare_set(std::move(key), std::move(expected),
                                              std::move(desired));
    }
    cc::task<> wait(std::vector<std::string> keys, duration timeout) override {
        co_await base_->wait(std::move(keys), timeout);
    }
    using store::wait;
    cc::task<bool> check(std::vector<std::string> keys) override {
        co_return co_await base_->check(std::move(keys));
    }
    cc::task<bool> delete_key(std::string key) override {
        co_return co_await base_->delete_key(std::move(key));
    }
    cc::task<std::int64_t> num_keys() override { co_return co_await base_->num_keys(); }
    cc::task<std::vector<std::string>> multi_get(std::vector<std::string> keys,
                                                 duration timeout) override {
        std::string first = keys.empty() ? std::string() : keys.front();
        co_await maybe_hold(first);  // (g++ 12 destroys a ?: temporary in co_await twice)
        co_return co_await base_->multi_get(std::move(keys), timeout);
    }
    using store::multi_get;
    int held() const noexcept { return held_; }

private:
    cc::task<> maybe_hold(const std::string& key) {
        if (held_ > 0 || key.find("/init/") != std::string::npos) co_return;
        ++held_;
        co_await r_.sleep_for(hold_);
    }
    cc::io::reactor& r_;
    std::shared_ptr<cc::rendezvous::store> base_;
    std::chrono::milliseconds hold_;
    int held_ = 0;
};

TEST_CASE("a rank that came early has the whole timeout for connecting once every rank came") {
    // Rank 1 comes 2.7 s after rank 0, and each rank's connecting takes 2.7 s more (its first
    // store request past the roll call is held back): 5.4 s after rank 0 came, more than the
    // 4 s timeout, but each wait (for every rank to come, then for the connecting) took less,
    // with 1.3 s to spare.
    // The timeout bounds each wait, as torch's does: a rank that came early must not spend
    // its peers' lateness on connecting. (torch 2.11's spawn, with a 1 s timeout, started
    // ranks this far apart.)
    cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0));
    std::array<int, 2> held{};
    auto errors = run_ranks(2, [&](int rank, cc::io::reactor& r) -> cc::task<> {
        if (rank == 1) co_await r.sleep_for(2700ms);
        cc::init_options o;
        o.rank = rank;
        o.world_size = 2;
        o.timeout = 4s;
        auto slow = std::make_shared<slow_after_roll_call>(
            r, co_await cc::rendezvous::tcp_store::connect(r, server.local_endpoint(), 5s), 2700ms);
        o.store = slow;
        auto pg = co_await cc::init_process_group(r, o);
        held[static_cast<std::size_t>(rank)] = slow->held();
        std::vector<int> out{rank}, in{-1};
        co_await cc::when_all(pg->send(out, 1 - rank), pg->recv(in, 1 - rank));
        if (in[0] != 1 - rank) throw std::runtime_error("wrong value");
        co_await pg->close();
    });
    check_every_rank_ok(errors);
    CHECK(held == std::array<int, 2>{1, 1});
}

TEST_CASE("set-up asks the store as many requests per rank at 8 ranks as at 4") {
    // Each rank reads every other rank's record, and every lower rank's address, in one
    // multi_get each: its store requests do not grow with the group (one get per rank did).
    auto requests_per_rank = [](int n) {
        cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0));
        auto errors = run_ranks(n, [&](int rank, cc::io::reactor& r) -> cc::task<> {
            cc::init_options o;
            o.rank = rank;
            o.world_size = n;
            o.timeout = 20s;
            o.store = co_await cc::rendezvous::tcp_store::connect(r, server.local_endpoint(), 20s);
            auto pg = co_await cc::init_process_group(r, o);
            co_await pg->close();
        });
        check_every_rank_ok(errors);
        return static_cast<double>(server.stats().requests) / n;
    };
    double at4 = requests_per_rank(4);
    double at8 = requests_per_rank(8);
    MESSAGE("store requests per rank: " << at4 << " at 4 ranks, " << at8 << " at 8");
    CHECK(at8 <= at4 + 1.0);
}

TEST_CASE("a MASTER_PORT that is not a store is named within seconds, not at the timeout") {
    // A listener that never accepts: the kernel completes connections, nobody answers.
    int silent = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(silent, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(silent, 16) == 0);
    socklen_t len = sizeof(a);
    ::getsockname(silent, reinterpret_cast<sockaddr*>(&a), &len);
    // One that answers like a web server.
    cc::io::reactor r;
    auto web = cc::io::acceptor::listen(r, cc::io::endpoint::loopback(0));
    auto answer = [&]() -> cc::task<> {
        auto s = co_await web.accept(cc::io::op_options(cc::io::deadline_after(20s)));
        std::array<std::byte, 9> request{};
        co_await s.recv(request, cc::io::deadline_after(20s));
        std::string reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
        co_await s.send(std::as_bytes(std::span(reply.data(), reply.size())),
                        cc::io::deadline_after(20s));
    };
    for (int port : {int(ntohs(a.sin_port)), int(web.local_endpoint().port())}) {
        CAPTURE(port);
        ::setenv("MASTER_ADDR", "127.0.0.1", 1);
        ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        cc::init_options o;
        o.rank = 1;
        o.world_size = 2;
        o.timeout = 30s;
        std::string error;
        auto rank_1 = [&]() -> cc::task<> {
            try {
                co_await cc::init_process_group(r, o);
            } catch (const std::exception& e) {
                error = e.what();
            }
        };
        if (port == web.local_endpoint().port()) {
            r.run(cc::when_all(rank_1(), answer()));
        } else {
            r.run(rank_1());
        }
        ::unsetenv("MASTER_ADDR");
        ::unsetenv("MASTER_PORT");
        CHECK(error.find("init_process_group: rank 1: 127.0.0.1:" + std::to_string(port) +
                         " (MASTER_ADDR/MASTER_PORT) is not a store") != std::string::npos);
        CHECK(error.find("fix MASTER_ADDR/MASTER_PORT") != std::string::npos);
    }
    ::close(silent);
}

// Opt-in (COROCOLL_LARGE_TESTS=1): moves 2.5 GiB in one message, past the 1 GiB that one
// SQE carries and the 2^31 bytes of a signed 32-bit length.
TEST_CASE("a single message of 2.5 GiB arrives whole" *
          doctest::skip(std::getenv("COROCOLL_LARGE_TESTS") == nullptr)) {
    const std::size_t size = (std::size_t{5} << 30) / 2;
    auto errors = run_threads(2, [&](cc::process_group& pg) -> cc::task<> {
        std::vector<std::uint8_t> buf(size);
        if (pg.rank() == 0) {
            for (std::size_t i = 0; i < size; i += 4096)
                buf[i] = static_cast<std::uint8_t>(i >> 12);
            buf[size - 1] = 0xAB;
            co_await pg.send(buf, 1);
        } else {
            co_await pg.recv(buf, 0);
            for (std::size_t i = 0; i < size; i += 4096) {
                if (buf[i] != static_cast<std::uint8_t>(i >> 12))
                    throw std::runtime_error("content");
            }
            if (buf[size - 1] != 0xAB) throw std::runtime_error("last byte");
        }
    });
    check_every_rank_ok(errors);
}
