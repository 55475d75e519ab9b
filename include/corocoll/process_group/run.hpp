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

#if COROCOLL_DEFINE_BODIES
#include <corocoll/process_group/impl/run.ipp>
#endif
