#pragma once

// Runs ranks as threads for the process-group tests: each thread has its own reactor and sets
// up its group through a store served by the test.

#include <corocoll/corocoll.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace pgtest {

namespace cc = corocoll;
using namespace std::chrono_literals;

struct thread_ranks_options {
    std::chrono::milliseconds timeout = 20s;
    /// Each rank sleeps a random time up to this before joining (start-up in random order).
    std::chrono::milliseconds max_start_delay{0};
    std::string group_name = "default";
    cc::transport::engine_options limits;
};

/// Runs `body(group)` on `n` ranks, one thread each; returns each rank's exception (or null).
inline std::vector<std::exception_ptr> run_threads(
    int n, const std::function<cc::task<>(cc::process_group&)>& body, thread_ranks_options o = {}) {
    auto server = std::make_shared<cc::rendezvous::tcp_store_server>(cc::io::endpoint::loopback(0));
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    std::mt19937 rng(std::random_device{}());
    for (int rank = 0; rank < n; ++rank) {
        auto delay = o.max_start_delay.count() > 0
                         ? std::chrono::milliseconds(rng() % o.max_start_delay.count())
                         : 0ms;
        threads.emplace_back([&, rank, delay] {
            try {
                std::this_thread::sleep_for(delay);
                cc::io::reactor r;
                auto main = [&]() -> cc::task<> {
                    cc::init_options init;
                    init.rank = rank;
                    init.world_size = n;
                    init.timeout = o.timeout;
                    init.group_name = o.group_name;
                    init.limits = o.limits;
                    init.store = co_await cc::rendezvous::tcp_store::connect(
                        r, server->local_endpoint(), o.timeout);
                    auto pg = co_await cc::init_process_group(r, init);
                    std::exception_ptr failed;
                    try {
                        co_await body(*pg);
                    } catch (...) {
                        failed = std::current_exception();
                    }
                    co_await pg->close();
                    if (failed) std::rethrow_exception(failed);
                };
                r.run(main());
            } catch (...) {
                errors[static_cast<std::size_t>(rank)] = std::current_exception();
            }
        });
    }
    for (auto& t : threads) t.join();
    return errors;
}

inline std::string what(const std::exception_ptr& e) {
    if (!e) return "";
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        return x.what();
    }
    return "unknown exception";
}

/// Bytes that depend on position, seed and size, so misplaced or mixed data shows.
inline std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
    std::vector<std::byte> v(n);
    unsigned x = seed * 2654435761u + static_cast<unsigned>(n);
    for (auto& b : v) {
        x = x * 1664525u + 1013904223u;
        b = static_cast<std::byte>(x >> 24);
    }
    return v;
}

}  // namespace pgtest
