#include "../support/port.hpp"
#include "../support/ranks.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

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
    CHECK(missing.find("MASTER_PORT is not set") != std::string::npos);

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

TEST_CASE("the mesh refuses a peer that does not present the job token") {
    cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0));
    auto errors = run_ranks(2, [&](int rank, cc::io::reactor& r) -> cc::task<> {
        auto store = co_await cc::rendezvous::tcp_store::connect(r, server.local_endpoint(), 5s);
        cc::transport::mesh_options o;
        o.deadline = cc::io::deadline_after(3s);
        o.job_token = rank == 0 ? "secret-a" : "secret-b";
        auto socks = co_await cc::transport::connect_mesh(r, *store, rank, 2, o);
    });
    CHECK(what(errors[0]).find("did not present this job's token") != std::string::npos);
    CHECK(what(errors[1]) != "");
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
