#pragma once

// Ranks as threads, for tests of process groups and whatever is built on them: every rank a
// thread, each thread with a reactor of its own (a reactor belongs to one thread), and the
// check that every rank finished without an error. Test code only; not installed.

#include "errors.hpp"

#include <corocoll/corocoll.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace corocoll_test {

namespace cc = corocoll;
using namespace std::chrono_literals;

/// Awaits `body(group)`, then closes the group whatever happened, then rethrows what the body
/// threw: how a test runs one rank's work on any group type (CPU or NCCL).
template <class Group, class Body>
cc::task<> run_then_close(Group& group, Body& body) {
    std::exception_ptr failed;
    try {
        co_await body(group);
    } catch (...) {
        failed = std::current_exception();
    }
    co_await group.close();
    if (failed) std::rethrow_exception(failed);
}

/// Runs `body(rank)` for ranks 0 to `n` - 1, each on a thread of its own, and joins them all.
/// Returns each rank's exception, null where it returned. Costs `n` threads.
template <class Body>
std::vector<std::exception_ptr> on_threads(int n, Body body) {
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    for (int rank = 0; rank < n; ++rank) {
        threads.emplace_back([&, rank] {
            try {
                body(rank);
            } catch (...) {
                errors[static_cast<std::size_t>(rank)] = std::current_exception();
            }
        });
    }
    for (auto& t : threads) t.join();
    return errors;
}

/// Runs `body(rank, r)` to completion for ranks 0 to `n` - 1, each on a thread of its own with
/// a reactor `r` of its own. Returns each rank's exception, null where it finished.
inline std::vector<std::exception_ptr> run_ranks(
    int n, const std::function<cc::task<>(int, cc::io::reactor&)>& body,
    const cc::io::reactor_options& reactor = {}) {
    return on_threads(n, [&](int rank) {
        cc::io::reactor r(reactor);
        r.run(body(rank, r));
    });
}

/// How `run_threads` sets up each rank's group.
struct thread_ranks_options {
    std::chrono::milliseconds timeout = 20s;
    /// Each rank sleeps a random time up to this before joining (start-up in random order).
    std::chrono::milliseconds max_start_delay{0};
    std::string group_name = "default";
    cc::transport::engine_options limits;
    /// Each rank's `engine_options::host_tag` (rank r takes entry r), to lay ranks out on
    /// hosts; empty: every rank on this host.
    std::vector<std::string> host_tags;
    /// Each rank's reactor.
    cc::io::reactor_options reactor;
};

/// Runs `body(group)` on `n` ranks as `run_ranks` does, each rank first setting up its group
/// through a store that this function serves, and closing the group after `body` (whether or
/// not it threw). Returns each rank's exception, null where it finished.
inline std::vector<std::exception_ptr> run_threads(
    int n, const std::function<cc::task<>(cc::process_group&)>& body, thread_ranks_options o = {}) {
    auto server = std::make_shared<cc::rendezvous::tcp_store_server>(cc::io::endpoint::loopback(0));
    std::vector<std::chrono::milliseconds> delays(static_cast<std::size_t>(n));
    std::mt19937 rng(std::random_device{}());
    for (auto& d : delays) {
        if (o.max_start_delay.count() > 0)
            d = std::chrono::milliseconds(rng() % o.max_start_delay.count());
    }
    return run_ranks(
        n,
        [&](int rank, cc::io::reactor& r) -> cc::task<> {
            std::this_thread::sleep_for(delays[static_cast<std::size_t>(rank)]);
            cc::init_options init;
            init.rank = rank;
            init.world_size = n;
            init.timeout = o.timeout;
            init.group_name = o.group_name;
            init.limits = o.limits;
            if (!o.host_tags.empty())
                init.limits.host_tag = o.host_tags[static_cast<std::size_t>(rank)];
            init.store =
                co_await cc::rendezvous::tcp_store::connect(r, server->local_endpoint(), o.timeout);
            auto pg = co_await cc::init_process_group(r, init);
            co_await run_then_close(*pg, body);
        },
        o.reactor);
}

/// Checks (doctest CHECK, so every rank is reported) that every rank finished without an
/// exception; a failure names the rank and its error.
inline void check_every_rank_ok(const std::vector<std::exception_ptr>& errors) {
    for (std::size_t rank = 0; rank < errors.size(); ++rank) {
        CAPTURE(rank);
        CHECK(what(errors[rank]) == "");
    }
}

/// Checks (doctest CHECK, so every rank is reported) that every rank failed with an error
/// that holds each of `pieces`; a failure names the rank, its error and the piece missing.
inline void check_every_rank_names(const std::vector<std::exception_ptr>& errors,
                                   std::initializer_list<std::string_view> pieces) {
    for (std::size_t rank = 0; rank < errors.size(); ++rank) {
        CAPTURE(rank);
        std::string e = what(errors[rank]);
        CAPTURE(e);
        for (std::string_view piece : pieces) {
            CAPTURE(piece);
            CHECK(e.find(piece) != std::string::npos);
        }
    }
}

}  // namespace corocoll_test
