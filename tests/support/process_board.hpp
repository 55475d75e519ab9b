#pragma once

// What the tests of failures between process ranks share (failure_test, revoke_test,
// shrink_test): a board in memory that the test process and every rank it forks share, each
// test laying out its own records, and a job of process ranks that each set a group up from
// the environment spawn_processes gives them.

#include <doctest/doctest.h>
#include <corocoll/corocoll.hpp>

#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <string>

namespace corocoll_test {

/// A `Board` in anonymous shared memory: what a forked rank writes there, the test reads.
template <class Board>
Board* new_shared_board() {
    void* m =
        ::mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    return new (m) Board();
}

/// Copies `s` into a board's text field, cut to fit.
template <std::size_t N>
void note(char (&to)[N], const std::string& s) {
    std::snprintf(to, N, "%s", s.c_str());
}

/// A job of process ranks (see `run_process_job`).
struct process_job {
    int ranks = 4;
    /// COROCOLL_STALL_S of every rank ("0": no status round, so nothing ends by a stall
    /// verdict or a deadline).
    std::string stall_s = "0";
    /// The group's timeout.
    std::chrono::milliseconds timeout = std::chrono::seconds(60);
    /// How long the whole job may take (spawn_options::timeout).
    std::chrono::milliseconds job_timeout = std::chrono::seconds(90);
    /// Run in each rank before its set-up (its environment, say).
    std::function<void()> before;
    /// What a rank's stderr says before the error that made it exit 1.
    std::string failed_says = "rank failed";
};

/// Runs `body` on `j.ranks` process ranks, each with a group of its own set-up; a rank exits 1
/// when set-up or `body` throws (saying so on stderr), 0 otherwise. The others go on when one
/// fails (`stop_others_on_failure` false): the survivors report what they saw.
inline corocoll::spawn_result run_process_job(
    const process_job& j,
    std::function<corocoll::task<>(std::shared_ptr<corocoll::process_group>)> body) {
    corocoll::spawn_options o;
    o.stop_others_on_failure = false;
    o.timeout = j.job_timeout;
    return corocoll::spawn_processes(
        j.ranks,
        [&]() -> int {
            if (j.before) j.before();
            ::setenv("COROCOLL_STALL_S", j.stall_s.c_str(), 1);
            corocoll::io::reactor r;
            corocoll::init_options io;
            io.timeout = j.timeout;
            try {
                r.run([&]() -> corocoll::task<> {
                    auto pg = co_await corocoll::init_process_group(r, io);
                    co_await body(pg);
                }());
            } catch (const std::exception& e) {
                std::fprintf(stderr, "%s: %s\n", j.failed_says.c_str(), e.what());
                return 1;
            }
            return 0;
        },
        o);
}

/// `body` on the group, then its close (a rank whose close fails exits 1).
inline std::function<corocoll::task<>(std::shared_ptr<corocoll::process_group>)> then_close(
    std::function<corocoll::task<>(corocoll::process_group&)> body) {
    return
        [body = std::move(body)](std::shared_ptr<corocoll::process_group> pg) -> corocoll::task<> {
            co_await body(*pg);
            co_await pg->close();
        };
}

}  // namespace corocoll_test
