#pragma once

// run(): one rank's whole life in a program that a launcher started.

#include <corocoll/core/task.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/process_group/process_group.hpp>
#include <corocoll/version.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

/// The pipe named by COROCOLL_FAILURE_FD, which corocollrun opens for its workers; -1 when
/// unset or not a pipe (a program may have reused the number for a file of its own).
COROCOLL_DECL int inherited_failure_pipe() noexcept;

/// Where a rank reports that it failed, so that whoever started it (`spawn`, corocollrun)
/// learns which rank failed first, before the others fail because of it. -1: nobody listens.
COROCOLL_DECL int& failure_pipe() noexcept;

COROCOLL_DECL void announce_failure(int rank) noexcept;

COROCOLL_DECL void print_rank_error(int rank, const char* what);

}  // namespace detail

/// Runs one rank: makes a reactor, sets up the group from the launcher's environment (or
/// `o`), awaits `body(group)`, closes the group. Returns the process exit code: 0, or 1 after
/// printing "corocoll: rank N: <error>" to stderr. `body` is any callable taking
/// `process_group&` and returning an awaitable.
template <class Body>
int run(Body body, init_options o = {}) {
    int rank = o.rank;
    try {
        io::reactor r;
        auto main = [&]() -> task<> {
            auto pg = co_await init_process_group(r, o);
            rank = pg->rank();
            std::exception_ptr failed;
            try {
                co_await body(*pg);
            } catch (...) {
                failed = std::current_exception();
                // Before the goodbye that makes the peers fail too.
                detail::announce_failure(rank);
            }
            co_await pg->close();
            if (failed) std::rethrow_exception(failed);
        };
        r.run(main());
        return 0;
    } catch (const std::exception& e) {
        detail::announce_failure(rank);
        detail::print_rank_error(rank, e.what());
        return 1;
    }
}

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL int inherited_failure_pipe() noexcept {
    const char* v = std::getenv("COROCOLL_FAILURE_FD");
    if (v == nullptr || *v == '\0') return -1;
    char* end = nullptr;
    long fd = std::strtol(v, &end, 10);
    if (*end != '\0' || fd < 3 || fd > 1'000'000) return -1;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISFIFO(st.st_mode)) return -1;
    return static_cast<int>(fd);
}

COROCOLL_DECL int& failure_pipe() noexcept {
    static int fd = inherited_failure_pipe();
    return fd;
}

COROCOLL_DECL void announce_failure(int rank) noexcept {
    static bool announced = false;
    if (failure_pipe() < 0 || announced) return;
    announced = true;
    std::int32_t r = rank;
    [[maybe_unused]] auto n = ::write(failure_pipe(), &r, sizeof(r));  // atomic: < PIPE_BUF
}

COROCOLL_DECL void print_rank_error(int rank, const char* what) {
    std::string text = what;
    std::string prefix = "corocoll: rank " + std::to_string(rank) + ":";
    if (rank >= 0 && text.rfind(prefix, 0) != 0) text = prefix + " " + text;
    std::fprintf(stderr, "%s\n", text.c_str());
    std::fflush(stderr);
}

}  // namespace detail

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
