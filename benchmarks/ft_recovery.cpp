// ft_recovery: how long a group takes to get going again after a rank's death, and what a
// shrink costs. Spawns --nproc ranks (the store served by this process, as corocollrun's agent
// serves it) that run all_reduces of one float; in each repetition rank --victim notes the
// time and kills itself with SIGKILL, and every survivor times, from that moment:
//   seen     its all_reduce failed (the death was detected and the failure spread),
//   shrunk   `shrink()` gave the group of the survivors,
//   first    the first all_reduce on it completed, its sum checked.
// With --no-kill every rank shrinks a sound group instead: the cost of the agreement and of
// the new group's set-up alone, at any size. With --grow one more process, started with the
// ranks and held until the kill (as a launcher would start a replacement once it reaps the
// dead worker, less the replacement's own start: fork, exec, loading), joins
// (join_process_group); the survivors, once shrunk, wait for it (joiners_waiting) and grow
// back to --nproc, and time
//   grown    the grown group's first all_reduce completed, its sum checked.
// With --agree every rank of a sound group calls agree(true) instead, timed from a common
// start to its answer (column "agreed"). With --rank0-store rank 0 serves the store (env:// without
// a launcher's store) and is the rank killed by default: the survivors shrink through rank
// 1's stand-in for it. Transport from COROCOLL_TRANSPORT (shm by default
// on one host). Times are in ms on the CLOCK_MONOTONIC of the host; each line is the slowest
// survivor's, and the summary gives min / median / max over repetitions.

#include <corocoll/corocoll.hpp>

#include "common/args.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace cc = corocoll;

namespace {

long long now_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<long long>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

constexpr int max_ranks = 256;

struct timing {
    std::atomic<long long> seen{0};
    std::atomic<long long> shrunk{0};
    std::atomic<long long> first{0};
    std::atomic<long long> grown{0};
};
// Shared by this process and every rank.
struct board {
    std::atomic<long long> killed{0};  // when the victim died (or the shrink began: --no-kill)
    timing ranks[max_ranks];
};

struct config {
    int n = 4;
    int victim = -1;  // default: the last rank
    bool no_kill = false;
    bool grow = false;
    bool agree = false;
    bool rank0_store = false;
};

// A loopback port held (bound, not listening, SO_REUSEADDR) until the process ends, for rank
// 0 to serve the store on: nobody else takes it meanwhile, and rank 0's listener may.
int reserve_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd < 0 || ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
        throw std::runtime_error("ft_recovery: cannot reserve a port for the store");
    }
    return ntohs(a.sin_port);
}

// The process that joins (--grow): held until the kill, then admitted by the survivors.
cc::task<> joiner_body(cc::io::reactor& r, board& b, const config& c) {
    for (int i = 0; i < 600'000 && b.killed.load() == 0; ++i) ::usleep(100);
    if (b.killed.load() == 0) throw std::runtime_error("joiner: no rank was killed within 60 s");
    cc::init_options io;
    auto g = co_await cc::join_process_group(r, io);
    std::vector<float> one(1, 1.0f);
    co_await g->all_reduce(one);
    b.ranks[c.n].grown = now_ns();
    if (one[0] != static_cast<float>(g->size())) throw std::runtime_error("wrong sum");
    co_await g->close();
}

cc::task<> rank_body(cc::process_group& first, board& b, const config& c) {
    std::vector<float> one(1);
    const int me = first.rank();
    timing& t = b.ranks[me];
    if (c.agree) {
        co_await first.barrier();
        if (me == 0) b.killed = now_ns();
        co_await first.barrier();
        auto a = co_await first.agree(true);
        t.shrunk = now_ns();
        if (!a.value || !a.failed.empty()) throw std::runtime_error("wrong agreement");
        co_await first.close();
        co_return;
    }
    if (c.no_kill) {
        co_await first.barrier();
        if (me == 0) b.killed = now_ns();
        co_await first.barrier();  // every rank starts from the same moment
    } else {
        try {
            for (long i = 0;; ++i) {
                one[0] = 1;
                if (me == c.victim && i == 50) {
                    b.killed = now_ns();
                    ::raise(SIGKILL);
                }
                co_await first.all_reduce(one);
            }
        } catch (const std::system_error&) {
            t.seen = now_ns();
        }
    }
    auto g = co_await first.shrink();
    t.shrunk = now_ns();
    one[0] = 1;
    co_await g->all_reduce(one);
    t.first = now_ns();
    if (one[0] != static_cast<float>(g->size())) throw std::runtime_error("wrong sum");
    co_await first.close();
    if (c.grow) {
        int waiting = 0;
        // Each look is a store round trip and a broadcast: 100,000 of them take seconds.
        for (int i = 0; i < 100'000 && waiting == 0; ++i) waiting = co_await g->joiners_waiting();
        if (waiting == 0) throw std::runtime_error("grow: no process joined after the shrink");
        auto whole = co_await g->grow(g->size() + waiting);
        one[0] = 1;
        co_await whole->all_reduce(one);
        t.grown = now_ns();
        if (one[0] != static_cast<float>(whole->size())) throw std::runtime_error("wrong sum");
        co_await whole->close();
    }
    co_await g->close();
}

std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    }
    return "unknown CPU";
}

double ms(long long ns) { return static_cast<double>(ns) / 1e6; }

}  // namespace

int main(int argc, char** argv) {
    config c;
    int reps = 5;
    perf::args a("ft_recovery",
                 "Time from a rank's SIGKILL to the first all_reduce of the shrunk group.");
    a.integer("--nproc", c.n, 2, max_ranks, "ranks (default 4)");
    a.integer("--victim", c.victim, -1, max_ranks - 1, "the rank killed (default: the last)");
    a.integer("--reps", reps, 1, 1000, "repetitions (default 5)");
    a.boolean("--no-kill", c.no_kill, "shrink a sound group: the agreement and set-up alone");
    a.boolean("--grow", c.grow, "a process joins after the kill; the survivors grow back");
    a.boolean("--agree", c.agree, "agree(true) on a sound group, timed");
    a.boolean("--rank0-store", c.rank0_store,
              "rank 0 serves the store (and is killed unless --victim says otherwise)");
    perf::parse_or_exit(a, argc, argv);
    if (c.victim < 0) c.victim = c.rank0_store ? 0 : c.n - 1;
    if (c.rank0_store && c.grow) {
        std::fprintf(stderr,
                     "ft_recovery: --rank0-store goes without --grow (joiners meet in "
                     "rank 0's store)\n");
        return 2;
    }
    const int store_port = c.rank0_store ? reserve_port() : 0;
    if (c.victim >= c.n) {
        std::fprintf(stderr, "ft_recovery: --victim must be below --nproc\n");
        return 2;
    }
    if ((c.grow && (c.no_kill || c.agree)) || (c.agree && c.no_kill)) {
        std::fprintf(stderr, "ft_recovery: --grow, --agree and --no-kill go alone\n");
        return 2;
    }
    if (c.agree) c.no_kill = true;  // nobody dies
    void* m =
        ::mmap(nullptr, sizeof(board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 1;
    const char* transport = std::getenv("COROCOLL_TRANSPORT");
    std::printf("# ft_recovery: %d ranks, %s%s, transport %s, %s\n", c.n,
                c.agree     ? "agree on a sound group"
                : c.no_kill ? "shrink of a sound group"
                : c.grow    ? ("SIGKILL of rank " + std::to_string(c.victim) +
                            ", then a process joins and the survivors grow back")
                               .c_str()
                         : ("SIGKILL of rank " + std::to_string(c.victim)).c_str(),
                c.rank0_store ? " (rank 0 serves the store)" : "",
                transport != nullptr ? transport : "default (shm on one host)", "ms from the kill");
    std::printf("# %s; caches %s\n", cpu_model().c_str(),
                cc::describe(cc::machine_cache_sizes()).c_str());
    if (c.agree) {
        std::printf("# %4s %9s\n", "rep", "agreed");
    } else {
        std::printf("# %4s %9s %9s %9s%s\n", "rep", "seen", "shrunk", "first",
                    c.grow ? "     grown" : "");
    }
    std::vector<double> seen, shrunk, first, grown;
    for (int rep = 0; rep < reps; ++rep) {
        auto* b = new (m) board();
        cc::spawn_options o;
        o.stop_others_on_failure = false;
        o.timeout = std::chrono::seconds(120);
        auto res = cc::spawn_processes(
            c.n + (c.grow ? 1 : 0),
            [&]() -> int {
                const bool joiner = c.grow && std::atoi(std::getenv("RANK")) == c.n;
                if (c.grow && !joiner) ::setenv("WORLD_SIZE", std::to_string(c.n).c_str(), 1);
                if (c.rank0_store) {
                    ::unsetenv("TORCHELASTIC_USE_AGENT_STORE");
                    ::setenv("MASTER_PORT", std::to_string(store_port).c_str(), 1);
                }
                cc::io::reactor r;
                try {
                    r.run([&]() -> cc::task<> {
                        if (joiner) {
                            co_await joiner_body(r, *b, c);
                            co_return;
                        }
                        cc::init_options io;
                        auto pg = co_await cc::init_process_group(r, io);
                        co_await rank_body(*pg, *b, c);
                    }());
                } catch (const std::exception& e) {
                    std::fprintf(stderr, "ft_recovery: %s\n", e.what());
                    return 1;
                }
                return 0;
            },
            o);
        long long worst_seen = 0, worst_shrunk = 0, worst_first = 0, worst_grown = 0;
        for (int r = 0; r < c.n + (c.grow ? 1 : 0); ++r) {
            if (!c.no_kill && r == c.victim) continue;
            if (!res.ranks[static_cast<std::size_t>(r)].ok()) {
                std::fprintf(stderr, "ft_recovery: %s\n",
                             res.ranks[static_cast<std::size_t>(r)].describe().c_str());
                return 1;
            }
            worst_grown = std::max(worst_grown, b->ranks[r].grown.load() - b->killed);
            if (r == c.n) continue;  // the joiner: grown only
            worst_seen = std::max(worst_seen, b->ranks[r].seen.load() - b->killed);
            worst_shrunk = std::max(worst_shrunk, b->ranks[r].shrunk.load() - b->killed);
            worst_first = std::max(worst_first, b->ranks[r].first.load() - b->killed);
        }
        if (c.no_kill) worst_seen = 0;
        if (c.agree) {
            std::printf("  %4d %9.2f\n", rep, ms(worst_shrunk));
        } else {
            std::printf("  %4d %9.2f %9.2f %9.2f", rep, ms(worst_seen), ms(worst_shrunk),
                        ms(worst_first));
            if (c.grow) std::printf(" %9.2f", ms(worst_grown));
            std::printf("\n");
        }
        std::fflush(stdout);
        seen.push_back(ms(worst_seen));
        shrunk.push_back(ms(worst_shrunk));
        first.push_back(ms(worst_first));
        grown.push_back(ms(worst_grown));
    }
    auto summary = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        char text[96];
        std::snprintf(text, sizeof text, "%.2f / %.2f / %.2f", v.front(), v[v.size() / 2],
                      v.back());
        return std::string(text);
    };
    if (c.agree) {
        std::printf("# min / median / max: agreed %s\n", summary(shrunk).c_str());
        return 0;
    }
    std::printf("# min / median / max: seen %s; shrunk %s; first all_reduce %s%s%s\n",
                summary(seen).c_str(), summary(shrunk).c_str(), summary(first).c_str(),
                c.grow ? "; grown " : "", c.grow ? summary(grown).c_str() : "");
    return 0;
}
