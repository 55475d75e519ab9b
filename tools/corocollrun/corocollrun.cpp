// corocollrun: starts a program's ranks on this node, like torchrun does, and watches them.
//
// One agent per node. Node 0's agent serves the rendezvous store (torch's TCPStore protocol,
// so torch workers can use it too); every agent joins through it, learns its ranks, starts its
// workers with torchrun's environment, and passes their output through with a "[rank N] "
// prefix. The agent is a single thread on a corocoll reactor: each worker's exit (a pidfd),
// output (two pipes), the launcher's signals (a signalfd) and the store are awaited side by
// side. When a worker fails, or a signal arrives, or another node reports a failure through
// the store, every local worker is stopped (SIGTERM to its process group, SIGKILL after the
// grace period); with --max_restarts, every node then starts its workers again together.
// With --on_failure=continue the others go on; with --on_failure=replace they go on and the
// failed worker is started again alone, with COROCOLL_JOIN=1, to join them (they admit it with
// process_group::grow), up to --max_restarts replacements in all.
//
// Store keys, under "corocollrun/<attempt>/": "node/<i>" = "<nproc> <max_restarts>" (the
// join), "node/<i>/claims" (two agents with one node rank), "failures" (a counter) and
// "failure" (the first report), "abort" (an interrupted launcher: no restart), "ended" (agents
// whose workers have all ended). "corocollrun/left" counts agents done with the store; node 0
// keeps serving it until every agent has left.

#include "options.hpp"

#include <corocoll/corocoll.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <system_error>
#include <vector>

extern char** environ;

namespace cc = corocoll;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace corocollrun {
namespace {

// ---- small helpers ----

void write_all(int fd, const std::string& text) noexcept {
    std::size_t done = 0;
    while (done < text.size()) {
        ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;  // a closed stdout loses output, not the job
        done += static_cast<std::size_t>(n);
    }
}

void say(const std::string& text) { write_all(2, "corocollrun: " + text + "\n"); }

std::string describe_status(int status) {
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        return "was killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
    }
    return "exited with code " + std::to_string(WEXITSTATUS(status));
}

// A program name as execve needs it: searched on PATH (in the parent: after fork the child
// may only make async-signal-safe calls, and the store thread makes this process
// multi-threaded).
std::string find_program(const std::string& name) {
    if (name.find('/') != std::string::npos) return name;
    const char* path = std::getenv("PATH");
    std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
    std::size_t start = 0;
    while (start <= dirs.size()) {
        auto end = dirs.find(':', start);
        if (end == std::string::npos) end = dirs.size();
        std::string dir = dirs.substr(start, end - start);
        std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
        struct stat st {};
        if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
            ::access(candidate.c_str(), X_OK) == 0) {
            return candidate;
        }
        start = end + 1;
    }
    throw std::runtime_error("cannot start '" + name + "': not found on PATH");
}

// Waits until `until` or until `wake` is requested, whichever comes first.
cc::task<> nap(cc::io::reactor& r, clock_type::time_point until, std::stop_token wake) {
    try {
        co_await r.sleep_until(until, std::move(wake));
    } catch (const std::system_error& e) {
        if (e.code() != std::errc::operation_canceled) throw;
    }
}

// ---- the workers of one attempt ----

struct worker {
    int local_rank = 0;
    int rank = 0;
    std::size_t index = 0;  // in the attempt's workers (replacements come after the first ones)
    bool joining = false;   // a replacement, started with COROCOLL_JOIN=1
    bool replaced = false;  // failed, and a replacement was started in its place
    pid_t pid = -1;
    int pidfd = -1;
    int out = -1;  // read ends of its stdout and stderr pipes
    int err = -1;
    std::optional<int> status;  // from waitpid once reaped
    bool stopped_by_us = false;
    std::deque<std::string> stderr_tail;

    bool failed() const { return status && (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0); }
};

enum class outcome { succeeded, failed, interrupted };

struct rank_layout {
    int base = 0;
    int world = 0;
};

class agent {
public:
    agent(cc::io::reactor& r, launch_options o, int signal_fd)
        : r_(r), o_(std::move(o)), signal_fd_(signal_fd), program_(find_program(o_.command[0])) {}

    cc::task<int> main(cc::io::endpoint store_at) {
        auto store = co_await cc::rendezvous::tcp_store::connect(
            r_, store_at,
            std::chrono::duration_cast<cc::rendezvous::store::duration>(o_.join_timeout));
        store_ = store;
        std::stop_source done;
        cc::async_scope signals;
        signals.spawn(watch_signals(done.get_token()));
        int code = 1;
        std::exception_ptr error;
        try {
            code = co_await attempts();
        } catch (...) {
            error = std::current_exception();
        }
        co_await leave();
        done.request_stop();
        co_await signals.join();
        if (error) std::rethrow_exception(error);
        co_return code;
    }

    int interrupted_by() const noexcept { return interrupt_signal_; }

private:
    std::string key(int attempt, const std::string& what) const {
        return "corocollrun/" + std::to_string(attempt) + "/" + what;
    }

    cc::task<int> attempts() {
        for (int attempt = 0;; ++attempt) {
            rank_layout layout = co_await join(attempt);
            outcome result = co_await run_attempt(attempt, layout);
            if (result == outcome::interrupted) co_return 128 + interrupt_signal_;
            if (result == outcome::succeeded) {
                result = co_await exit_barrier(attempt);
                if (result == outcome::succeeded) co_return 0;
            }
            std::vector<std::string> abort_key(1, key(attempt, "abort"));
            bool aborted = co_await store_->check(abort_key);
            // --on_failure=replace spends --max_restarts on replacements, never on a restart.
            if (aborted || attempt >= o_.max_restarts || o_.replace_on_failure) {
                if (o_.max_restarts > 0 && !aborted && !o_.replace_on_failure) {
                    say("giving up after " + std::to_string(o_.max_restarts) + " restart" +
                        (o_.max_restarts == 1 ? "" : "s"));
                }
                co_return 1;
            }
            say("restarting the workers (restart " + std::to_string(attempt + 1) + " of " +
                std::to_string(o_.max_restarts) + ")");
        }
    }

    // Every node says how many workers it has; each learns where its ranks start.
    cc::task<rank_layout> join(int attempt) {
        // Counted once per node, for `leave`: node 0 keeps the store up for the nodes that came.
        if (attempt == 0) co_await store_->add("corocollrun/joined", 1);
        auto claims = co_await store_->add(
            key(attempt, "node/" + std::to_string(o_.node_rank) + "/claims"), 1);
        if (claims > 1) {
            throw std::runtime_error("node rank " + std::to_string(o_.node_rank) +
                                     " is claimed by two launchers (check --node_rank)");
        }
        co_await store_->set(
            key(attempt, "node/" + std::to_string(o_.node_rank)),
            std::to_string(o_.nproc_per_node) + " " + std::to_string(o_.max_restarts));
        std::vector<std::string> keys;
        for (int n = 0; n < o_.nnodes; ++n)
            keys.push_back(key(attempt, "node/" + std::to_string(n)));
        // Waits in slices, saying which nodes it still waits for whenever that changes, so
        // that a node started with the wrong address or port shows up long before the timeout.
        const auto deadline = clock_type::now() + o_.join_timeout;
        const auto slice = std::clamp<std::chrono::milliseconds>(o_.join_timeout / 4, 100ms, 5s);
        std::string waiting_for;
        for (;;) {
            auto left = std::chrono::duration_cast<cc::rendezvous::store::duration>(
                deadline - clock_type::now());
            bool joined = true;
            try {
                co_await store_->wait(
                    keys, std::clamp<cc::rendezvous::store::duration>(left, 1ms, slice));
            } catch (const std::system_error& e) {
                if (e.code() != std::errc::timed_out) throw;
                joined = false;
            }
            if (joined) break;
            std::string missing = co_await missing_list(keys);
            if (missing.empty()) break;
            if (clock_type::now() >= deadline) {
                throw std::runtime_error("attempt " + std::to_string(attempt) + ": node(s) " +
                                         missing + " did not join within " +
                                         std::to_string(o_.join_timeout.count() / 1000) +
                                         " s (--rdzv_conf join_timeout)");
            }
            if (missing != waiting_for) {
                say("node " + std::to_string(o_.node_rank) + " waits for node(s) " + missing +
                    " to join at " + store_->server().to_string() + " (" +
                    std::to_string(o_.join_timeout.count() / 1000) +
                    " s at most, --rdzv_conf join_timeout)");
                waiting_for = missing;
            }
        }
        rank_layout layout;
        for (int n = 0; n < o_.nnodes; ++n) {
            std::string v = co_await store_->get(keys[static_cast<std::size_t>(n)]);
            int nproc = 0;
            int restarts = 0;
            if (std::sscanf(v.c_str(), "%d %d", &nproc, &restarts) != 2 || nproc <= 0) {
                throw std::runtime_error("node " + std::to_string(n) + " joined with '" + v +
                                         "', which is not a corocollrun join");
            }
            if (restarts != o_.max_restarts) {
                throw std::runtime_error("node " + std::to_string(n) +
                                         " runs with --max_restarts=" + std::to_string(restarts) +
                                         " but this node with " + std::to_string(o_.max_restarts) +
                                         "; every node needs the same");
            }
            if (n < o_.node_rank) layout.base += nproc;
            layout.world += nproc;
        }
        co_return layout;
    }

    // The nodes whose join key is not in the store yet: "1, 3", empty when none.
    cc::task<std::string> missing_list(const std::vector<std::string>& keys) {
        std::string missing;
        for (int n = 0; n < o_.nnodes; ++n) {
            std::vector<std::string> one{keys[static_cast<std::size_t>(n)]};
            if (!co_await store_->check(one))
                missing += (missing.empty() ? "" : ", ") + std::to_string(n);
        }
        co_return missing;
    }

    std::vector<std::string> worker_environment(int attempt, const rank_layout& layout,
                                                int local_rank, bool joining) const {
        // Another launcher's rank variables would contradict ours: drop them.
        static constexpr const char* dropped[] = {"RANK",
                                                  "WORLD_SIZE",
                                                  "LOCAL_RANK",
                                                  "LOCAL_WORLD_SIZE",
                                                  "GROUP_RANK",
                                                  "GROUP_WORLD_SIZE",
                                                  "ROLE_RANK",
                                                  "ROLE_NAME",
                                                  "ROLE_WORLD_SIZE",
                                                  "MASTER_ADDR",
                                                  "MASTER_PORT",
                                                  "TORCHELASTIC_RESTART_COUNT",
                                                  "TORCHELASTIC_MAX_RESTARTS",
                                                  "TORCHELASTIC_RUN_ID",
                                                  "TORCHELASTIC_USE_AGENT_STORE",
                                                  "COROCOLL_FAILURE_FD",
                                                  "COROCOLL_JOIN",
                                                  "OMPI_COMM_WORLD_RANK",
                                                  "OMPI_COMM_WORLD_SIZE",
                                                  "OMPI_COMM_WORLD_LOCAL_RANK",
                                                  "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                  "PMI_RANK",
                                                  "PMI_SIZE",
                                                  "MPI_LOCALRANKID",
                                                  "MPI_LOCALNRANKS",
                                                  "SLURM_PROCID",
                                                  "SLURM_NTASKS",
                                                  "SLURM_LOCALID"};
        std::vector<std::string> env;
        bool has_omp = false;
        for (char** e = environ; *e != nullptr; ++e) {
            std::string_view entry(*e);
            std::string_view name = entry.substr(0, entry.find('='));
            if (name == "OMP_NUM_THREADS") has_omp = true;
            if (std::find(std::begin(dropped), std::end(dropped), name) == std::end(dropped)) {
                env.emplace_back(entry);
            }
        }
        auto put = [&](const char* name, const std::string& value) {
            env.push_back(std::string(name) + "=" + value);
        };
        int rank = layout.base + local_rank;
        put("RANK", std::to_string(rank));
        put("LOCAL_RANK", std::to_string(local_rank));
        put("WORLD_SIZE", std::to_string(layout.world));
        put("LOCAL_WORLD_SIZE", std::to_string(o_.nproc_per_node));
        put("GROUP_RANK", std::to_string(o_.node_rank));
        put("GROUP_WORLD_SIZE", std::to_string(o_.nnodes));
        put("ROLE_NAME", o_.role);
        put("ROLE_RANK", std::to_string(rank));
        put("ROLE_WORLD_SIZE", std::to_string(layout.world));
        put("MASTER_ADDR", o_.store_host());
        put("MASTER_PORT", std::to_string(store_->server().port()));
        put("TORCHELASTIC_USE_AGENT_STORE", "True");
        // A replacement runs in the same attempt, so its store namespace is the others'.
        put("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt));
        if (joining) put("COROCOLL_JOIN", "1");
        put("TORCHELASTIC_MAX_RESTARTS", std::to_string(o_.max_restarts));
        put("TORCHELASTIC_RUN_ID", o_.run_id);
        put("COROCOLL_FAILURE_FD", std::to_string(failure_write_));
        // As torchrun does: several workers on one node each assume the whole machine.
        if (!has_omp && o_.nproc_per_node > 1) put("OMP_NUM_THREADS", "1");
        return env;
    }

    // Starts one worker in its own process group, its output on two pipes; `joining`: a
    // replacement for a worker that failed.
    worker start_worker(int attempt, const rank_layout& layout, int local_rank,
                        bool joining = false) {
        worker w;
        w.local_rank = local_rank;
        w.rank = layout.base + local_rank;
        w.index = workers_.size();
        w.joining = joining;
        std::vector<std::string> env = worker_environment(attempt, layout, local_rank, joining);
        std::vector<char*> envp;
        for (auto& e : env) envp.push_back(e.data());
        envp.push_back(nullptr);
        std::vector<char*> argv;
        for (auto& a : o_.command) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);

        int out[2], err[2], exec_report[2];
        if (::pipe2(out, O_CLOEXEC) != 0) cc::detail::throw_errno(errno, "corocollrun: pipe");
        if (::pipe2(err, O_CLOEXEC) != 0) {
            int e = errno;
            ::close(out[0]);
            ::close(out[1]);
            cc::detail::throw_errno(e, "corocollrun: pipe");
        }
        if (::pipe2(exec_report, O_CLOEXEC) != 0) {
            int e = errno;
            for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
            cc::detail::throw_errno(e, "corocollrun: pipe");
        }
        pid_t parent = ::getpid();
        pid_t pid = ::fork();
        if (pid == 0) {
            // Async-signal-safe calls only from here on.
            ::setpgid(0, 0);
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no worker outlives a killed launcher
            if (::getppid() != parent) ::_exit(127);
            sigset_t none;
            ::sigemptyset(&none);
            ::sigprocmask(SIG_SETMASK, &none, nullptr);
            ::signal(SIGPIPE, SIG_DFL);
            ::dup2(out[1], 1);
            ::dup2(err[1], 2);
            // The failure pipe must survive exec; the rest are close-on-exec.
            int flags = ::fcntl(failure_write_, F_GETFD);
            ::fcntl(failure_write_, F_SETFD, flags & ~FD_CLOEXEC);
            ::execve(program_.c_str(), argv.data(), envp.data());
            int e = errno;
            [[maybe_unused]] auto n = ::write(exec_report[1], &e, sizeof(e));
            ::_exit(127);
        }
        int fork_errno = errno;
        ::close(out[1]);
        ::close(err[1]);
        ::close(exec_report[1]);
        if (pid < 0) {
            for (int fd : {out[0], err[0], exec_report[0]}) ::close(fd);
            cc::detail::throw_errno(fork_errno, "corocollrun: fork");
        }
        // Also here, so a signal to the group cannot race the child's own setpgid.
        ::setpgid(pid, pid);
        int exec_errno = 0;
        ssize_t got = ::read(exec_report[0], &exec_errno, sizeof(exec_errno));
        ::close(exec_report[0]);
        w.pid = pid;
        w.out = out[0];
        w.err = err[0];
        if (got == sizeof(exec_errno)) {
            ::waitpid(pid, nullptr, 0);
            ::close(w.out);
            ::close(w.err);
            throw std::runtime_error("cannot start '" + program_ + "' for rank " +
                                     std::to_string(w.rank) + ": " + std::strerror(exec_errno));
        }
        w.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
        if (w.pidfd < 0) {
            int e = errno;
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
            ::close(w.out);
            ::close(w.err);
            cc::detail::throw_errno(e, "corocollrun: pidfd_open");
        }
        return w;
    }

    // Passes one output stream of a worker through, line by line; keeps stderr's last lines.
    cc::task<> pump(worker& w, bool is_stderr, std::stop_token drain_over) {
        int fd = is_stderr ? w.err : w.out;
        int to = is_stderr ? 2 : 1;
        std::string prefix = o_.prefix_output ? "[rank " + std::to_string(w.rank) + "] " : "";
        std::string pending;
        std::array<std::byte, 16384> buf{};
        auto emit = [&](std::string_view line) {
            write_all(to, prefix + std::string(line) + "\n");
            if (is_stderr && o_.tail_lines > 0) {
                w.stderr_tail.emplace_back(line);
                if (w.stderr_tail.size() > static_cast<std::size_t>(o_.tail_lines)) {
                    w.stderr_tail.pop_front();
                }
            }
        };
        for (;;) {
            std::size_t n = 0;
            try {
                n = co_await r_.read_some(fd, buf, cc::io::op_options(drain_over));
            } catch (const std::system_error&) {
                n = 0;  // drained long enough (a grandchild holds the pipe), or a read error
            }
            if (n == 0) break;
            pending.append(reinterpret_cast<const char*>(buf.data()), n);
            std::size_t start = 0;
            for (auto nl = pending.find('\n'); nl != std::string::npos;
                 nl = pending.find('\n', start)) {
                emit(std::string_view(pending).substr(start, nl - start));
                start = nl + 1;
            }
            pending.erase(0, start);
            if (pending.size() > 65536) {  // a very long line: pass it on in pieces
                emit(pending);
                pending.clear();
            }
        }
        if (!pending.empty()) emit(pending);
    }

    // Reaps one worker when its pidfd says it has exited.
    cc::task<> watch_exit(worker& w) {
        co_await r_.poll(w.pidfd, POLLIN);
        int status = 0;
        ::waitpid(w.pid, &status, 0);
        w.status = status;
        ::close(std::exchange(w.pidfd, -1));
        --running_;
        if (w.failed() && !w.stopped_by_us && o_.replace_on_failure && interrupt_signal_ == 0 &&
            replacements_ < o_.max_restarts) {
            w.replaced = true;
            ++replacements_;
            say(failure_text(w) + "; starting a replacement that joins the others (" +
                std::to_string(replacements_) + " of " + std::to_string(o_.max_restarts) +
                ", --on_failure=replace)");
            to_replace_.push_back(w.local_rank);
        } else if (w.failed() && !w.stopped_by_us && !first_local_failure_) {
            first_local_failure_ = w.index;
        }
        if (w.failed() && !w.replaced && o_.continue_on_failure && running_ > 0) {
            say(failure_text(w) + "; the other workers go on (--on_failure=continue)");
        }
        wake_.request_stop();
    }

    // The launcher's own signals: SIGINT, SIGTERM, SIGHUP, SIGQUIT. With workers running they
    // are stopped first; between attempts (joining, waiting at the exit barrier) there is
    // nothing to stop and the launcher ends at once.
    cc::task<> watch_signals(std::stop_token finished) {
        signalfd_siginfo info{};
        auto bytes = std::as_writable_bytes(std::span(&info, 1));
        while (!finished.stop_requested()) {
            std::size_t n = 0;
            try {
                n = co_await r_.read_some(signal_fd_, bytes, cc::io::op_options(finished));
            } catch (const std::system_error&) {
                co_return;
            }
            if (n != sizeof(info)) continue;
            int sig = static_cast<int>(info.ssi_signo);
            if (!workers_running_) {
                say("interrupted by signal " + std::to_string(sig) + " (" + ::strsignal(sig) +
                    ") while no worker was running");
                std::_Exit(128 + sig);
            }
            if (interrupt_signal_ == 0) interrupt_signal_ = sig;
            wake_.request_stop();
        }
    }

    // Which rank a corocoll worker says failed first (written before its peers can notice).
    cc::task<> watch_announcements(std::stop_token finished) {
        std::int32_t rank = -1;
        auto bytes = std::as_writable_bytes(std::span(&rank, 1));
        while (!finished.stop_requested()) {
            std::size_t n = 0;
            try {
                n = co_await r_.read_some(failure_read_, bytes, cc::io::op_options(finished));
            } catch (const std::system_error&) {
                co_return;
            }
            if (n != sizeof(rank)) continue;
            // Only a rank of this node's workers counts (a stray write, or a group of the
            // program's own with other numbers, must not name a worker that is not here).
            bool ours = std::any_of(workers_.begin(), workers_.end(),
                                    [&](const worker& w) { return w.rank == rank; });
            // With --on_failure=continue a worker whose group failed carries on (it may
            // leave the failed rank behind): its word names no culprit.
            if (!announced_first_ && ours && !o_.continue_on_failure) {
                announced_first_ = rank;
                wake_.request_stop();
            }
        }
    }

    // Other nodes' failures, through the store.
    cc::task<> watch_store(int attempt, std::stop_token finished) {
        std::vector<std::string> failures(1, key(attempt, "failures"));
        while (!finished.stop_requested()) {
            co_await nap(r_, clock_type::now() + o_.monitor_interval, finished);
            if (finished.stop_requested()) break;
            bool failed = false;
            try {
                failed = co_await store_->check(failures);
            } catch (const std::exception& e) {
                store_lost_ = e.what();
                failed = true;
            }
            if (failed) {
                remote_failure_ = true;
                wake_.request_stop();
                co_return;
            }
        }
    }

    // `spare_announced`: a corocoll worker that announced its own failure is on its way out
    // (telling its peers, printing its error): it is let be, to end as it means to, until the
    // grace period is over.
    void signal_workers(int sig, bool spare_announced) {
        for (auto& w : workers_) {
            if (w.status) continue;
            if (spare_announced && announced_first_ && w.rank == *announced_first_) continue;
            w.stopped_by_us = true;
            ::kill(-w.pid, sig);
        }
    }

    cc::task<outcome> run_attempt(int attempt, rank_layout layout) {
        workers_.clear();
        first_local_failure_.reset();
        announced_first_.reset();
        remote_failure_ = false;
        reported_ = false;
        first_reporter_ = false;
        for (int l = 0; l < o_.nproc_per_node; ++l) {
            try {
                workers_.push_back(start_worker(attempt, layout, l));
            } catch (...) {
                for (auto& w : workers_) ::kill(-w.pid, SIGKILL);
                for (auto& w : workers_) {
                    ::waitpid(w.pid, nullptr, 0);
                    for (int fd : {w.pidfd, w.out, w.err}) ::close(fd);
                }
                workers_.clear();
                throw;
            }
        }
        running_ = workers_.size();

        std::stop_source finished;  // every worker reaped: the watchers end
        std::stop_source drained;   // output left in pipes after that has been read
        cc::async_scope scope;
        for (auto& w : workers_) {
            scope.spawn(watch_exit(w));
            scope.spawn(pump(w, false, drained.get_token()));
            scope.spawn(pump(w, true, drained.get_token()));
        }
        workers_running_ = true;
        scope.spawn(watch_announcements(finished.get_token()));
        // With --on_failure=continue no failure stops a worker, here or on another node.
        if (o_.nnodes > 1 && !o_.continue_on_failure) {
            scope.spawn(watch_store(attempt, finished.get_token()));
        }

        bool stopping = false;
        auto kill_at = clock_type::time_point::max();
        while (running_ > 0) {
            co_await nap(r_, kill_at, wake_.get_token());
            wake_ = std::stop_source{};
            // --on_failure=replace: each failed worker's replacement, watched as the others.
            for (int local : std::exchange(to_replace_, {})) {
                if (stopping) break;
                try {
                    worker& w = workers_.emplace_back(start_worker(attempt, layout, local, true));
                    ++running_;
                    scope.spawn(watch_exit(w));
                    scope.spawn(pump(w, false, drained.get_token()));
                    scope.spawn(pump(w, true, drained.get_token()));
                } catch (const std::exception& e) {
                    say("cannot start a replacement for local rank " + std::to_string(local) +
                        ": " + e.what());
                    for (const auto& w : workers_) {
                        if (w.local_rank == local && w.replaced && !first_local_failure_)
                            first_local_failure_ = w.index;
                    }
                }
            }
            bool cause = interrupt_signal_ != 0 ||
                         (!o_.continue_on_failure &&
                          (first_local_failure_ || announced_first_ || remote_failure_));
            if (cause && !stopping) {
                stopping = true;
                // A signal goes on as it came (Ctrl-C reaches the workers as SIGINT);
                // otherwise SIGTERM.
                int sig = interrupt_signal_ != 0 ? interrupt_signal_ : SIGTERM;
                signal_workers(sig, interrupt_signal_ == 0);
                kill_at = clock_type::now() + o_.grace_period;
                if (first_local_failure_ || announced_first_ || interrupt_signal_ != 0) {
                    co_await report_to_store(attempt);
                }
            } else if (stopping && clock_type::now() >= kill_at) {
                signal_workers(SIGKILL, false);
                kill_at = clock_type::time_point::max();
            }
        }
        workers_running_ = false;
        finished.request_stop();
        // Output still in the pipes is read to the end; a pipe held open by a worker's own
        // children is let go after a moment.
        auto drain_deadline = clock_type::now() + 500ms;
        while (scope.pending() > 0 && clock_type::now() < drain_deadline) {
            co_await nap(r_, clock_type::now() + 5ms, {});
        }
        drained.request_stop();
        co_await scope.join();
        for (auto& w : workers_) {
            ::close(w.out);
            ::close(w.err);
        }

        outcome result = outcome::succeeded;
        if (interrupt_signal_ != 0) {
            say("interrupted by signal " + std::to_string(interrupt_signal_) + " (" +
                ::strsignal(interrupt_signal_) + "); every worker was stopped");
            result = outcome::interrupted;
        } else if (first_local_failure_ || announced_first_) {
            report_local_failure();
            if (o_.nnodes > 1 && !first_reporter_ && !o_.continue_on_failure) {
                co_await report_remote_failure(attempt);
            }
            result = outcome::failed;
        } else if (remote_failure_) {
            co_await report_remote_failure(attempt);
            result = outcome::failed;
        }
        if (o_.nnodes > 1) {
            try {
                co_await store_->add(key(attempt, "ended"), 1);
            } catch (const std::exception&) {
                if (result == outcome::succeeded) throw;  // a failure is reported already
            }
        }
        co_return result;
    }

    // The worker that failed first: the one that said so (a corocoll worker announces its
    // failure before its peers can notice it), else the first reaped.
    const worker& culprit() const {
        if (announced_first_) {
            for (const auto& w : workers_) {
                if (w.rank == *announced_first_) return w;
            }
        }
        return workers_[*first_local_failure_];
    }

    std::string failure_text(const worker& w) const {
        return "rank " + std::to_string(w.rank) + " (local rank " + std::to_string(w.local_rank) +
               " on node " + std::to_string(o_.node_rank) + ", pid " + std::to_string(w.pid) +
               ") " + (w.status ? describe_status(*w.status) : "failed");
    }

    void report_local_failure() const {
        const worker& first = culprit();
        std::string text = failure_text(first) + "\n";
        if (!first.stderr_tail.empty()) {
            text += "corocollrun: last " + std::to_string(first.stderr_tail.size()) +
                    " line(s) of rank " + std::to_string(first.rank) + "'s stderr:\n";
            for (const auto& line : first.stderr_tail) text += "    " + line + "\n";
        } else {
            text +=
                "corocollrun: rank " + std::to_string(first.rank) + " wrote nothing to stderr\n";
        }
        std::string others;
        std::string also_failed;
        for (const auto& w : workers_) {
            if (&w == &first) continue;
            std::string item = std::to_string(w.rank);
            if (w.stopped_by_us) {
                others += (others.empty() ? "" : ", ") + item;
            } else if (w.failed()) {
                also_failed += "\ncorocollrun:   then " + failure_text(w);
            }
        }
        if (!also_failed.empty()) text += "corocollrun: after it:" + also_failed + "\n";
        if (!others.empty()) text += "corocollrun: stopped rank(s) " + others + "\n";
        write_all(2, "corocollrun: worker failed: " + text);
    }

    // Tells the other nodes that this one failed or was interrupted; the first report wins.
    cc::task<> report_to_store(int attempt) {
        if (reported_ || o_.nnodes == 1) co_return;
        reported_ = true;
        std::string text;
        if (interrupt_signal_ != 0) {
            text = "node " + std::to_string(o_.node_rank) +
                   "'s launcher was interrupted by signal " + std::to_string(interrupt_signal_);
        } else {
            text = failure_text(culprit());
        }
        try {
            if (interrupt_signal_ != 0) co_await store_->set(key(attempt, "abort"), text);
            auto n = co_await store_->add(key(attempt, "failures"), 1);
            first_reporter_ = n == 1;
            if (first_reporter_) co_await store_->set(key(attempt, "failure"), text);
        } catch (const std::exception& e) {
            say(std::string("could not tell the other nodes: ") + e.what());
        }
    }

    cc::task<> report_remote_failure(int attempt) {
        if (!store_lost_.empty()) {
            say("lost the store at " + store_->server().to_string() +
                " (node 0's launcher): " + store_lost_ + "; every worker on this node was stopped");
            throw std::runtime_error("the job cannot go on without node 0");
        }
        std::string text = "another node failed";
        try {
            std::vector<std::string> k(1, key(attempt, "failure"));
            co_await store_->wait(k, std::chrono::seconds(5));
            text = co_await store_->get(key(attempt, "failure"));
        } catch (const std::exception&) {
        }
        say("node " + std::to_string(o_.node_rank) + " stopped its workers; the first failure " +
            "reported by any node: " + text);
    }

    // A node whose workers all succeeded waits for every node to end the attempt, then learns
    // whether all of them succeeded.
    cc::task<outcome> exit_barrier(int attempt) {
        if (o_.nnodes == 1) co_return outcome::succeeded;
        auto until = clock_type::now() + o_.exit_barrier_timeout;
        std::vector<std::string> failures(1, key(attempt, "failures"));
        for (;;) {
            auto ended = co_await store_->add(key(attempt, "ended"), 0);
            if (ended >= o_.nnodes) break;
            if (clock_type::now() >= until) {
                throw std::runtime_error("the workers of this node are done, but only " +
                                         std::to_string(ended) + " of " +
                                         std::to_string(o_.nnodes) + " nodes ended within " +
                                         std::to_string(o_.exit_barrier_timeout.count() / 1000) +
                                         " s (--rdzv_conf exit_barrier_timeout)");
            }
            co_await nap(r_, clock_type::now() + o_.monitor_interval, {});
            if (co_await store_->check(failures)) break;
        }
        if (co_await store_->check(failures)) {
            remote_failure_ = true;
            co_await report_remote_failure(attempt);
            co_return outcome::failed;
        }
        co_return outcome::succeeded;
    }

    // Every agent says it is done with the store; node 0 keeps serving it until all have.
    cc::task<> leave() {
        try {
            co_await store_->add("corocollrun/left", 1);
            if (!o_.serves_store()) co_return;
            // The store stays up until every node that joined has left (30 s at most): a node
            // that never joined (a failed join) is not waited for.
            auto since = clock_type::now();
            auto until = since + 30s;
            bool said = false;
            for (;;) {
                auto left = co_await store_->add("corocollrun/left", 0);
                auto joined = co_await store_->add("corocollrun/joined", 0);
                if (left >= joined || clock_type::now() >= until) break;
                if (!said && clock_type::now() - since >= 1s) {
                    say("node 0 keeps the store up until " + std::to_string(joined - left) +
                        " more node(s) have left (30 s at most)");
                    said = true;
                }
                co_await nap(r_, clock_type::now() + 20ms, {});
            }
        } catch (const std::exception&) {
            // Leaving is best effort: the job's result is decided already.
        }
    }

public:
    void set_failure_pipe(int read_end, int write_end) noexcept {
        failure_read_ = read_end;
        failure_write_ = write_end;
    }

private:
    cc::io::reactor& r_;
    launch_options o_;
    int signal_fd_;
    std::string program_;
    std::shared_ptr<cc::rendezvous::tcp_store> store_;
    int failure_read_ = -1;
    int failure_write_ = -1;

    std::deque<worker> workers_;   // a deque: the watchers hold references while it grows
    std::vector<int> to_replace_;  // local ranks whose replacement is to start
    int replacements_ = 0;         // workers replaced so far (--on_failure=replace)
    std::size_t running_ = 0;
    std::stop_source wake_;
    std::optional<std::size_t> first_local_failure_;  // a worker's index
    std::optional<int> announced_first_;              // a global rank
    bool remote_failure_ = false;
    bool reported_ = false;
    bool first_reporter_ = false;
    bool workers_running_ = false;
    std::string store_lost_;
    int interrupt_signal_ = 0;
};

int launch(const launch_options& o) {
    // The launcher's signals arrive through a signalfd; they are blocked before the store's
    // thread starts so that no other thread takes them.
    sigset_t handled;
    ::sigemptyset(&handled);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::sigaddset(&handled, sig);
    ::sigprocmask(SIG_BLOCK, &handled, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    int signal_fd = ::signalfd(-1, &handled, SFD_CLOEXEC);
    if (signal_fd < 0) cc::detail::throw_errno(errno, "corocollrun: signalfd");
    int failures[2];
    if (::pipe2(failures, O_CLOEXEC) != 0) cc::detail::throw_errno(errno, "corocollrun: pipe");

    std::unique_ptr<cc::rendezvous::tcp_store_server> server;
    cc::io::endpoint store_at;
    if (o.serves_store()) {
        bool local_only =
            o.standalone || (o.nnodes == 1 && !o.master_port && o.master_addr.empty());
        cc::io::endpoint bind_to =
            local_only ? cc::io::endpoint::loopback(0)
                       : cc::io::endpoint::from_numeric("0.0.0.0", o.master_port.value_or(0));
        server = std::make_unique<cc::rendezvous::tcp_store_server>(bind_to);
        std::string host = local_only ? std::string("127.0.0.1") : o.store_host();
        store_at = cc::io::endpoint::resolve(host, server->port());
        if (o.nnodes > 1 && o.master_port.value_or(0) == 0) {
            say("node 0 serves the store on " + o.store_host() + ":" +
                std::to_string(server->port()) +
                " (give the other nodes --master_port=" + std::to_string(server->port()) + ")");
        }
    } else {
        store_at = cc::io::endpoint::resolve(o.store_host(), *o.master_port);
    }
    launch_options effective = o;
    if (effective.standalone) effective.master_addr = "127.0.0.1";

    cc::io::reactor r;
    agent a(r, effective, signal_fd);
    a.set_failure_pipe(failures[0], failures[1]);
    int code = r.run(a.main(store_at));
    ::close(failures[0]);
    ::close(failures[1]);
    ::close(signal_fd);
    return code;
}

}  // namespace
}  // namespace corocollrun

int main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    corocollrun::launch_options o;
    try {
        bool help = false;
        bool version = false;
        o = corocollrun::parse_command_line(args, &help, &version);
        if (help) {
            std::fputs(corocollrun::usage_text, stdout);
            return 0;
        }
        if (version) {
            std::puts("corocollrun " COROCOLL_VERSION_STRING " (corocoll " COROCOLL_VERSION_STRING
                      ")");
            return 0;
        }
    } catch (const corocollrun::usage_error& e) {
        std::fprintf(stderr, "corocollrun: %s\n", e.what());
        return 2;
    }
    try {
        return corocollrun::launch(o);
    } catch (const std::exception& e) {
        corocollrun::say(std::string("error: ") + e.what());
        return 1;
    }
}
