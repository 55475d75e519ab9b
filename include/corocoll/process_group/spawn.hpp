#pragma once

// spawn(): ranks as child processes of this one, like torch.multiprocessing.spawn, and
// run_or_spawn() for programs that run under a launcher or on their own.

#include <corocoll/io/reactor.hpp>
#include <corocoll/process_group/default_group.hpp>
#include <corocoll/process_group/run.hpp>
#include <corocoll/rendezvous/launch_env.hpp>
#include <corocoll/rendezvous/tcp_store.hpp>
#include <corocoll/version.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

/// How one rank of `spawn_ranks` ended.
struct rank_exit {
    /// The rank the child ran.
    int rank = -1;
    /// The child's process id.
    pid_t pid = -1;
    int exit_code = -1;  ///< -1 when killed by a signal
    int signal = 0;      ///< the signal that killed it, 0 if it exited
    /// True when `spawn_ranks` stopped it because another rank failed or time ran out.
    bool stopped_by_us = false;

    /// Exited with status 0.
    bool ok() const noexcept { return signal == 0 && exit_code == 0; }
    /// One line for a message: "rank 2 (pid 1234) exited with status 1", or the signal's name.
    std::string describe() const;
};

/// What `spawn_ranks` saw.
struct spawn_result {
    /// Every rank's exit, indexed by rank.
    std::vector<rank_exit> ranks;
    /// The rank whose failure came first, or -1: a rank killed by a signal we did not send;
    /// else the first rank to report that its body failed (ranks report before their peers
    /// can notice); else the first failed rank reaped.
    int first_failure = -1;
    /// Every rank exited with status 0.
    bool ok() const noexcept { return first_failure < 0; }
};

/// How `spawn_ranks` runs and stops the children.
struct spawn_options {
    /// When a rank fails, stop the others (SIGTERM, then SIGKILL after `grace`).
    bool stop_others_on_failure = true;
    /// Between SIGTERM and SIGKILL when ranks are stopped.
    std::chrono::milliseconds grace = std::chrono::seconds(5);
    /// Stop every rank (as failed) if they are not all done by then.
    std::chrono::milliseconds timeout = std::chrono::minutes(30);
};

/// Starts `n` ranks as child processes, like `torch.multiprocessing.spawn`: the parent serves
/// the rendezvous store on an ephemeral loopback port; each child gets RANK, WORLD_SIZE,
/// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and TORCHELASTIC_USE_AGENT_STORE
/// (it connects to the parent's store as torchrun's workers do), calls `child_main()` and exits
/// with what it returns. Every child is reaped. Call it from plain code on a thread without a
/// reactor, before starting other threads of your own (fork copies only the calling thread).
template <class ChildMain>
spawn_result spawn_processes(int n, ChildMain child_main, spawn_options options = {}) {
    if (n <= 0) throw std::invalid_argument("corocoll: spawn: need at least one rank");
    if (io::reactor::current() != nullptr) {
        throw std::logic_error("corocoll: spawn: call it from a thread without an io::reactor");
    }
    // The store's thread starts after the last fork: a child forked while another thread
    // holds a lock (the allocator's, under a sanitizer) could never take it.
    rendezvous::tcp_store_server store(io::endpoint::loopback(0), rendezvous::deferred_start);
    int failures[2];
    if (::pipe2(failures, O_CLOEXEC | O_NONBLOCK) != 0) {
        corocoll::detail::throw_errno(errno, "corocoll: spawn: pipe");
    }
    std::fflush(nullptr);
    spawn_result result;
    for (int rank = 0; rank < n; ++rank) {
        pid_t pid = ::fork();
        if (pid < 0) {
            int err = errno;
            for (auto& r : result.ranks) ::kill(r.pid, SIGKILL);
            for (auto& r : result.ranks) ::waitpid(r.pid, nullptr, 0);
            ::close(failures[0]);
            ::close(failures[1]);
            corocoll::detail::throw_errno(err, "corocoll: spawn: fork");
        }
        if (pid == 0) {
            // The child: only this thread exists here; never return into the parent's frames.
            // It starts with default signal dispositions, not whatever handlers the parent
            // installed (a test framework's crash reporter, say).
            for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGSEGV, SIGABRT, SIGFPE, SIGILL, SIGBUS,
                            SIGPIPE, SIGCHLD}) {
                ::signal(sig, SIG_DFL);
            }
            ::close(failures[0]);
            ::close(store.native_listen_handle());
            detail::failure_pipe() = failures[1];
            for (const char* v : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
                                  "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS"}) {
                ::unsetenv(v);
            }
            ::setenv("RANK", std::to_string(rank).c_str(), 1);
            ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
            ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
            ::setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
            ::setenv("MASTER_ADDR", "127.0.0.1", 1);
            ::setenv("MASTER_PORT", std::to_string(store.port()).c_str(), 1);
            ::setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
            ::setenv("TORCHELASTIC_RESTART_COUNT", "0", 1);
            int code = 1;
            try {
                code = child_main();
            } catch (const std::exception& e) {
                detail::print_rank_error(rank, e.what());
            } catch (...) {
                detail::print_rank_error(rank, "an exception that is not a std::exception");
            }
            if (code != 0) detail::announce_failure(rank);
            std::fflush(nullptr);
            ::_exit(code);
        }
        result.ranks.push_back({rank, pid});
    }
    ::close(failures[1]);
    try {
        store.start();
    } catch (...) {
        for (auto& r : result.ranks) ::kill(r.pid, SIGKILL);
        for (auto& r : result.ranks) ::waitpid(r.pid, nullptr, 0);
        ::close(failures[0]);
        throw;
    }
    std::vector<int> announced;
    auto read_announcements = [&] {
        std::int32_t r = 0;
        while (::read(failures[0], &r, sizeof(r)) == sizeof(r)) announced.push_back(r);
    };
    int first_reaped = -1;

    auto started = std::chrono::steady_clock::now();
    std::size_t running = result.ranks.size();
    bool stopping = false;
    std::vector<bool> signalled(result.ranks.size(), false);
    auto stop_time = std::chrono::steady_clock::time_point::max();
    while (running > 0) {
        bool reaped = false;
        for (auto& r : result.ranks) {
            if (r.exit_code >= 0 || r.signal != 0) continue;
            int status = 0;
            pid_t got = ::waitpid(r.pid, &status, WNOHANG);
            if (got != r.pid) continue;
            reaped = true;
            --running;
            if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
            if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
            r.stopped_by_us = signalled[static_cast<std::size_t>(r.rank)] && !r.ok();
            if (!r.ok() && !r.stopped_by_us && first_reaped < 0) first_reaped = r.rank;
            if (r.signal != 0 && !r.stopped_by_us && result.first_failure < 0) {
                result.first_failure = r.rank;  // killed from outside: the likeliest cause
            }
        }
        read_announcements();
        auto now = std::chrono::steady_clock::now();
        bool timed_out = now - started > options.timeout;
        bool failed = first_reaped >= 0 || !announced.empty();
        if (!stopping && running > 0 && ((failed && options.stop_others_on_failure) || timed_out)) {
            stopping = true;
            if (timed_out && !failed) {
                std::fprintf(stderr,
                             "corocoll: spawn: ranks still running after %lld ms are stopped\n",
                             static_cast<long long>(options.timeout.count()));
                if (first_reaped < 0) first_reaped = -2;
            }
            for (auto& r : result.ranks) {
                // A rank that reported its own failure is exiting already: let it, so the
                // report shows how it ended (SIGKILL after the grace period if it does not).
                bool exiting =
                    std::find(announced.begin(), announced.end(), r.rank) != announced.end();
                if (r.exit_code < 0 && r.signal == 0 && !exiting) {
                    signalled[static_cast<std::size_t>(r.rank)] = true;
                    ::kill(r.pid, SIGTERM);
                }
            }
            stop_time = now + options.grace;
        }
        if (stopping && now >= stop_time) {
            for (auto& r : result.ranks) {
                if (r.exit_code < 0 && r.signal == 0) {
                    signalled[static_cast<std::size_t>(r.rank)] = true;
                    ::kill(r.pid, SIGKILL);
                }
            }
            stop_time = std::chrono::steady_clock::time_point::max();
        }
        if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    read_announcements();
    ::close(failures[0]);
    if (result.first_failure < 0) {
        for (int r : announced) {
            if (r >= 0 && r < n && !result.ranks[static_cast<std::size_t>(r)].ok()) {
                result.first_failure = r;
                break;
            }
        }
    }
    if (result.first_failure < 0 && first_reaped >= 0) result.first_failure = first_reaped;
    if (result.first_failure < 0 && first_reaped == -2) {
        // Timed out: blame the first rank that was still running.
        for (const auto& r : result.ranks) {
            if (r.stopped_by_us) {
                result.first_failure = r.rank;
                break;
            }
        }
    }
    return result;
}

/// `spawn_processes` where each child runs `run(body, init)`: `init` sets every rank's group
/// up (its timeout, COROCOLL_TIMEOUT or 30 minutes by default; backend; limits). Rank and
/// world size are spawn's to give: `init.rank` and `init.world_size` must stay -1.
template <class Body>
spawn_result spawn_ranks(int n, Body body, init_options init, spawn_options options = {}) {
    if (init.rank >= 0 || init.world_size >= 0) {
        throw std::invalid_argument(
            "corocoll: spawn: init_options.rank and world_size are set by spawn (leave them -1)");
    }
    return spawn_processes(
        n, [&body, &init] { return run(body, init); }, options);
}

/// `spawn_ranks` with the default init options.
template <class Body>
spawn_result spawn_ranks(int n, Body body, spawn_options options = {}) {
    return spawn_ranks(n, std::move(body), init_options{}, options);
}

namespace detail {

COROCOLL_DECL int report(const spawn_result& r);

}  // namespace detail

/// True when a launcher's rank variable is set (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK,
/// SLURM_PROCID).
COROCOLL_DECL bool launched_by_launcher();

/// `spawn_ranks`, reporting a failure on stderr ("which rank, how") and returning the exit
/// code for `main`: 0 when every rank succeeded, 1 otherwise.
template <class Body>
int spawn(int n, Body body, spawn_options options = {}) {
    return detail::report(spawn_ranks(n, std::move(body), options));
}

/// `spawn` whose ranks set their groups up with `init` (see `spawn_ranks`).
template <class Body>
int spawn(int n, Body body, init_options init, spawn_options options = {}) {
    return detail::report(spawn_ranks(n, std::move(body), std::move(init), options));
}

/// For examples and tools: `run(body, init)` when a launcher started this process, otherwise
/// `spawn(n, body, init)` on this machine, as torch tutorials do.
template <class Body>
int run_or_spawn(int n, Body body, init_options init = {}) {
    if (launched_by_launcher()) return run(std::move(body), std::move(init));
    return spawn(n, std::move(body), std::move(init));
}

/// The same for programs written with the blocking API: `rank_main()` sets up the default
/// group itself (`init_process_group()`); it runs directly under a launcher, else in `n`
/// spawned processes.
template <class RankMain>
int run_or_spawn_main(int n, RankMain rank_main) {
    if (launched_by_launcher()) return rank_main();
    return detail::report(spawn_processes(n, rank_main));
}

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/process_group/impl/spawn.ipp>
#endif
