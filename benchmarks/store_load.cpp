// store_load: a load generator for stores that speak torch 1.13's TCPStore protocol
// (corocoll's tcp_store_server and torch's own), many client connections from a few processes.
//
//   store_load serve
//       serves corocoll's tcp_store_server on 127.0.0.1 (a port the kernel picks), prints
//       "PORT <n>", and runs until its standard input closes.
//   store_load load --port P --clients N [--procs K] [--seconds S] [--value-bytes B]
//                   [--multi-get M]
//       forks K processes that open N connections in all (plain torch protocol, no HELLO, so
//       that both servers see the same bytes), waits until every one is connected, then runs
//       each connection as a closed loop for S seconds: SET and GET of its own key (sent
//       together: SET has no reply), ADD to a shared counter, WAIT for its own key (there),
//       and with --multi-get M a MULTI_GET of M keys (corocoll's extension: its own key and
//       the keys of the M-1 connections after it in its process; torch 1.13 has no such query).
//       Prints one line of `key value` pairs: clients, procs, connect_s (the slowest
//       process's time to open its connections), requests (SET, GET, ADD, WAIT and MULTI_GET
//       count one each), requests_per_s, p50_us/p99/max_us over every round trip, and errors
//       (connections that failed or missed the 60 s deadline of one round trip).
// benchmarks/compare/store_load.py runs it against both servers at 100, 1,000 and 10,000
// clients and writes the table of docs/performance.md.

#include <corocoll/corocoll.hpp>
#include <corocoll/rendezvous/store_protocol.hpp>
#include <corocoll/rendezvous/tcp_store_server.hpp>

#include "common/args.hpp"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace cc = corocoll;
namespace rdv = corocoll::rendezvous;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr auto round_trip_deadline = 60s;
// Connections a process opens at once; the rest wait for a wave to finish.
constexpr std::size_t connect_wave = 256;

void raise_descriptor_limit(std::size_t need) {
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
    if (lim.rlim_cur < lim.rlim_max) {
        lim.rlim_cur = lim.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &lim);
    }
    if (lim.rlim_cur < need) {
        throw std::runtime_error("store_load: " + std::to_string(need) +
                                 " descriptors needed, and RLIMIT_NOFILE allows " +
                                 std::to_string(lim.rlim_cur) + " (ulimit -n)");
    }
}

void write_all(int fd, const void* p, std::size_t n) {
    auto* b = static_cast<const char*>(p);
    while (n != 0) {
        ssize_t w = ::write(fd, b, n);
        if (w <= 0) throw std::runtime_error("store_load: write to the parent failed");
        b += w;
        n -= static_cast<std::size_t>(w);
    }
}

bool read_all(int fd, void* p, std::size_t n) {
    auto* b = static_cast<char*>(p);
    while (n != 0) {
        ssize_t r = ::read(fd, b, n);
        if (r <= 0) return false;
        b += r;
        n -= static_cast<std::size_t>(r);
    }
    return true;
}

struct tally {
    std::uint64_t requests = 0;
    std::uint64_t errors = 0;
    std::vector<std::uint64_t> ns;  // one per round trip
};

cc::task<> open_one(cc::io::reactor& r, cc::io::endpoint where, cc::io::socket& out, tally& t) {
    try {
        out =
            co_await cc::io::socket::connect(r, where, cc::io::deadline_after(round_trip_deadline));
    } catch (const std::system_error& e) {
        ++t.errors;
        std::fprintf(stderr, "store_load: %s\n", e.what());
    }
}

cc::task<> client_loop(cc::io::socket& s, std::string key, std::vector<std::string> multi_keys,
                       std::string value, clock_type::time_point end, tally& t) {
    if (!s.is_open()) co_return;
    rdv::detail::wire_writer set_get, add, wait;
    set_get.u8(static_cast<std::uint8_t>(rdv::detail::query::set));
    set_get.bytes(key);
    set_get.bytes(value);
    set_get.u8(static_cast<std::uint8_t>(rdv::detail::query::get));
    set_get.bytes(key);
    add.u8(static_cast<std::uint8_t>(rdv::detail::query::add));
    add.bytes("/load/count");
    add.i64(1);
    wait.u8(static_cast<std::uint8_t>(rdv::detail::query::wait));
    wait.u64(1);
    wait.bytes(key);
    rdv::detail::wire_writer multi_get;
    multi_get.u8(static_cast<std::uint8_t>(rdv::detail::query::multi_get));
    multi_get.u64(multi_keys.size());
    for (const auto& k : multi_keys) multi_get.bytes(k);
    // The reply: a u64 length and the value, for each key.
    std::string multi_got(multi_keys.size() * (8 + value.size()), '\0');
    std::string got(value.size(), '\0');
    try {
        while (clock_type::now() < end) {
            cc::io::op_options o(cc::io::deadline_after(round_trip_deadline));
            auto t0 = clock_type::now();
            co_await s.send(set_get.view(), o);
            std::uint64_t len = 0;
            co_await s.recv(std::as_writable_bytes(std::span(&len, 1)), o);
            if (len != value.size()) throw std::runtime_error("GET: a value of the wrong size");
            co_await s.recv(std::as_writable_bytes(std::span(got.data(), got.size())), o);
            auto t1 = clock_type::now();
            std::int64_t count = 0;
            co_await s.send(add.view(), o);
            co_await s.recv(std::as_writable_bytes(std::span(&count, 1)), o);
            auto t2 = clock_type::now();
            std::uint8_t stop = 1;
            co_await s.send(wait.view(), o);
            co_await s.recv(std::as_writable_bytes(std::span(&stop, 1)), o);
            auto t3 = clock_type::now();
            if (got != value || count < 1 || stop != rdv::detail::wait_stop_waiting) {
                throw std::runtime_error("a reply that is not what was stored");
            }
            auto t4 = t3;
            if (!multi_keys.empty()) {
                co_await s.send(multi_get.view(), o);
                co_await s.recv(
                    std::as_writable_bytes(std::span(multi_got.data(), multi_got.size())), o);
                t4 = clock_type::now();
                t.requests += 1;
            }
            for (auto [a, b] :
                 {std::pair{t0, t1}, std::pair{t1, t2}, std::pair{t2, t3}, std::pair{t3, t4}}) {
                if (b == a) continue;
                t.ns.push_back(static_cast<std::uint64_t>(
                    std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count()));
            }
            t.requests += 4;
        }
    } catch (const std::exception& e) {
        ++t.errors;
        std::fprintf(stderr, "store_load: %s: %s\n", key.c_str(), e.what());
    }
}

// One process of the generator: opens `conns` connections, says so, waits for the go, loads
// the store, and sends back what it measured.
void child(int link, std::uint16_t port, int id, int conns, int seconds, int value_bytes,
           int multi_get) {
    cc::io::reactor r;
    auto where = cc::io::endpoint::loopback(port);
    std::vector<cc::io::socket> socks(static_cast<std::size_t>(conns));
    tally t;
    auto t0 = clock_type::now();
    for (std::size_t first = 0; first < socks.size(); first += connect_wave) {
        std::vector<cc::task<>> wave;
        for (std::size_t i = first; i < std::min(socks.size(), first + connect_wave); ++i) {
            wave.push_back(open_one(r, where, socks[i], t));
        }
        r.run(cc::when_all(std::move(wave)));
    }
    double connect_s = std::chrono::duration<double>(clock_type::now() - t0).count();
    write_all(link, &connect_s, sizeof(connect_s));
    char go = 0;
    if (!read_all(link, &go, 1)) return;
    auto end = clock_type::now() + std::chrono::seconds(seconds);
    std::vector<cc::task<>> loops;
    std::string value(static_cast<std::size_t>(value_bytes), 'v');
    auto key = [&](std::size_t i) {
        return "/load/" + std::to_string(id) + "/" + std::to_string(i % socks.size());
    };
    // Every key a MULTI_GET asks for exists before the load starts.
    if (multi_get > 0 && socks[0].is_open()) {
        rdv::detail::wire_writer sets;
        for (std::size_t i = 0; i < socks.size(); ++i) {
            sets.u8(static_cast<std::uint8_t>(rdv::detail::query::set));
            sets.bytes(key(i));
            sets.bytes(value);
        }
        std::int64_t n = 0;
        rdv::detail::wire_writer count;
        count.u8(static_cast<std::uint8_t>(rdv::detail::query::get_num_keys));
        auto prime = [&]() -> cc::task<> {
            cc::io::op_options o(cc::io::deadline_after(round_trip_deadline));
            co_await socks[0].send(sets.view(), o);
            co_await socks[0].send(count.view(), o);
            co_await socks[0].recv(std::as_writable_bytes(std::span(&n, 1)), o);
        };
        r.run(prime());
    }
    for (std::size_t i = 0; i < socks.size(); ++i) {
        std::vector<std::string> multi_keys;
        for (int k = 0; k < multi_get; ++k) {
            multi_keys.push_back(key(i + static_cast<std::size_t>(k)));
        }
        loops.push_back(client_loop(socks[i], key(i), std::move(multi_keys), value, end, t));
    }
    r.run(cc::when_all(std::move(loops)));
    std::uint64_t head[3] = {t.requests, t.errors, t.ns.size()};
    write_all(link, head, sizeof(head));
    write_all(link, t.ns.data(), t.ns.size() * sizeof(std::uint64_t));
}

int load(int port, int clients, int procs, int seconds, int value_bytes, int multi_get) {
    procs = std::min(procs, clients);
    raise_descriptor_limit(static_cast<std::size_t>(clients / procs + 64));
    std::vector<int> links;
    std::vector<pid_t> pids;
    for (int p = 0; p < procs; ++p) {
        int sv[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
            throw std::runtime_error("store_load: socketpair failed");
        }
        int conns = clients / procs + (p < clients % procs ? 1 : 0);
        pid_t pid = ::fork();
        if (pid < 0) throw std::runtime_error("store_load: fork failed");
        if (pid == 0) {
            ::close(sv[0]);
            int code = 0;
            try {
                child(sv[1], static_cast<std::uint16_t>(port), p, conns, seconds, value_bytes,
                      multi_get);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "store_load: process %d: %s\n", p, e.what());
                code = 1;
            }
            ::_exit(code);
        }
        ::close(sv[1]);
        links.push_back(sv[0]);
        pids.push_back(pid);
    }
    double connect_s = 0;
    bool ok = true;
    for (int link : links) {
        double s = 0;
        ok = read_all(link, &s, sizeof(s)) && ok;
        connect_s = std::max(connect_s, s);
    }
    char go = 1;
    for (int link : links) write_all(link, &go, 1);
    std::uint64_t requests = 0, errors = 0;
    std::vector<std::uint64_t> ns;
    for (int link : links) {
        std::uint64_t head[3] = {0, 0, 0};
        if (!read_all(link, head, sizeof(head))) {
            ok = false;
            continue;
        }
        requests += head[0];
        errors += head[1];
        std::size_t at = ns.size();
        ns.resize(at + head[2]);
        ok = read_all(link, ns.data() + at, head[2] * sizeof(std::uint64_t)) && ok;
    }
    for (int link : links) ::close(link);
    for (pid_t pid : pids) {
        int status = 0;
        ::waitpid(pid, &status, 0);
        ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    std::sort(ns.begin(), ns.end());
    auto pct = [&](double q) {
        if (ns.empty()) return 0.0;
        auto i = static_cast<std::size_t>(q * static_cast<double>(ns.size() - 1));
        return static_cast<double>(ns[i]) / 1000.0;
    };
    std::printf(
        "clients %d procs %d connect_s %.3f requests %llu requests_per_s %.0f p50_us %.1f "
        "p99_us %.1f max_us %.1f errors %llu\n",
        clients, procs, connect_s, static_cast<unsigned long long>(requests),
        static_cast<double>(requests) / seconds, pct(0.5), pct(0.99), pct(1.0),
        static_cast<unsigned long long>(errors));
    std::fflush(stdout);
    return ok && errors == 0 ? 0 : 1;
}

int serve() {
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    std::printf("PORT %u\n", static_cast<unsigned>(server.port()));
    std::fflush(stdout);
    char buf[256];
    while (::read(0, buf, sizeof(buf)) > 0) {
    }
    auto st = server.stats();
    std::fprintf(stderr,
                 "store_load serve: %llu connections accepted, %llu accept failures, peak "
                 "buffered %llu bytes\n",
                 static_cast<unsigned long long>(st.connections_accepted),
                 static_cast<unsigned long long>(st.accept_failures),
                 static_cast<unsigned long long>(st.peak_buffered_bytes));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc >= 2 && std::strcmp(argv[1], "serve") == 0) return serve();
    if (argc < 2 || std::strcmp(argv[1], "load") != 0) {
        std::fprintf(stderr,
                     "usage: store_load serve | store_load load --port P --clients N "
                     "[--procs K] [--seconds S] [--value-bytes B] [--multi-get M]\n");
        return 2;
    }
    int port = 0, clients = 100, procs = 4, seconds = 5, value_bytes = 32, multi_get = 0;
    perf::args a("store_load load",
                 "Loads a TCPStore-protocol server with many client connections.");
    a.integer("--port", port, 1, 65535, "the server's port on 127.0.0.1")
        .integer("--clients", clients, 1, 1000000, "connections in all")
        .integer("--procs", procs, 1, 1024, "processes that hold them")
        .integer("--seconds", seconds, 1, 3600, "how long the load runs")
        .integer("--value-bytes", value_bytes, 0, 1 << 20, "bytes of each SET's value")
        .integer("--multi-get", multi_get, 0, 4096,
                 "keys of a MULTI_GET added to each loop (0: none; corocoll's server only)");
    perf::parse_or_exit(a, argc - 1, argv + 1);
    try {
        return load(port, clients, procs, seconds, value_bytes, multi_get);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
