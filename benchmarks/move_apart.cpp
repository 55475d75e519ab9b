// move_apart: how soon two ranks that start on one processor run apart. The scheduler sometimes
// leaves two ranks of a freshly started job on one processor (a wake-up pulls the woken rank
// beside its waker while a launcher holds the other processor), and keeps them there a while;
// every call of that job's first milliseconds then costs a hand-over of the processor. Each job
// spawns 2 ranks (processes, shared memory) that pin themselves to the first allowed processor,
// allow every processor again (which moves neither) and ping-pong 8 bytes, each message saying
// where its sender runs. Per job: the exchange at which rank 0 first saw the two apart, the
// microseconds until then, the moves each rank's reactor made (`reactor_stats::moves`) and rank
// 0's yields; then the median and the largest of each over the jobs whose ranks ran apart. A job
// ends once the two were apart for 50 exchanges in a row, or after --ops. Needs 2 processors or
// more.

#include <corocoll/corocoll.hpp>

#include "common/args.hpp"

#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace cc = corocoll;

namespace {

struct job_result {
    int exchange = -1;  // the first exchange that found the ranks apart (-1: none)
    double us = 0;      // from the first exchange until then
    int moves[2] = {0, 0};
    int yields = 0;  // rank 0's
};

cc::task<> run_job(cc::process_group& pg, int ops, const cpu_set_t& all, job_result& out) {
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &all)) {
            CPU_SET(c, &one);
            break;
        }
    }
    if (::sched_setaffinity(0, sizeof(one), &one) != 0 ||
        ::sched_setaffinity(0, sizeof(all), &all) != 0) {
        throw std::runtime_error("move_apart: sched_setaffinity failed");
    }
    co_await pg.barrier();
    const auto before = pg.reactor().stats();
    const auto t0 = std::chrono::steady_clock::now();
    // v[0]: rank 0's processor, then whether to stop; v[1]: rank 1's processor.
    std::vector<int> v(2);
    int apart_in_a_row = 0;
    for (int i = 0; i < ops; ++i) {
        if (pg.rank() == 0) {
            v[0] = ::sched_getcpu();
            co_await pg.send(v, 1);
            co_await pg.recv(v, 1);
            const bool apart = v[1] != ::sched_getcpu();
            apart_in_a_row = apart ? apart_in_a_row + 1 : 0;
            if (apart && out.exchange < 0) {
                out.exchange = i;
                out.us =
                    std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                        .count();
            }
            v[0] = apart_in_a_row >= 50 || i + 1 == ops;
            co_await pg.send(v, 1);
            if (v[0] != 0) break;
        } else {
            co_await pg.recv(v, 0);
            v[1] = ::sched_getcpu();
            co_await pg.send(v, 0);
            co_await pg.recv(v, 0);
            if (v[0] != 0) break;
        }
    }
    const auto after = pg.reactor().stats();
    std::vector<int> moves{static_cast<int>(after.moves - before.moves)};
    if (pg.rank() == 0) {
        out.moves[0] = moves[0];
        co_await pg.recv(moves, 1);
        out.moves[1] = moves[0];
        out.yields = static_cast<int>(after.yields - before.yields);
    } else {
        co_await pg.send(moves, 0);
    }
}

}  // namespace

int main(int argc, char** argv) {
    int jobs = 20;
    int ops = 20000;
    perf::args a("move_apart", "Two ranks started on one processor: how soon they run apart.");
    a.integer("--jobs", jobs, 1, 10000, "jobs of 2 ranks");
    a.integer("--ops", ops, 1, 10'000'000, "exchanges at most per job");
    perf::parse_or_exit(a, argc, argv);
    cpu_set_t all;
    if (::sched_getaffinity(0, sizeof(all), &all) != 0 || CPU_COUNT(&all) < 2) {
        std::fprintf(stderr, "move_apart: n/a: needs 2 processors or more\n");
        return 77;
    }
    std::vector<job_result> results;
    for (int j = 0; j < jobs; ++j) {
        // Rank 0's result comes back through shared memory: the ranks are processes.
        auto* shared =
            static_cast<job_result*>(::mmap(nullptr, sizeof(job_result), PROT_READ | PROT_WRITE,
                                            MAP_SHARED | MAP_ANONYMOUS, -1, 0));
        if (shared == MAP_FAILED) return 1;
        *shared = job_result{};
        cc::spawn_options o;
        o.timeout = std::chrono::seconds(120);
        cc::init_options init;
        init.limits.transport = cc::transport::transport_choice::shm;
        auto r = cc::spawn_ranks(
            2, [&](cc::process_group& pg) { return run_job(pg, ops, all, *shared); }, init, o);
        for (const auto& rank : r.ranks) {
            if (!rank.ok()) {
                std::fprintf(stderr, "move_apart: %s\n", rank.describe().c_str());
                return 1;
            }
        }
        results.push_back(*shared);
        ::munmap(shared, sizeof(job_result));
        const job_result& x = results.back();
        std::printf("job %d: apart at exchange %d, after %.0f us; moves %d and %d; yields %d\n", j,
                    x.exchange, x.us, x.moves[0], x.moves[1], x.yields);
    }
    // Over the jobs whose ranks ran apart.
    auto summary = [&](const char* what, auto get) {
        std::vector<double> v;
        for (const auto& x : results) {
            if (x.exchange >= 0) v.push_back(get(x));
        }
        if (v.empty()) return;
        std::sort(v.begin(), v.end());
        std::printf("%s: median %.0f, largest %.0f\n", what, v[v.size() / 2], v.back());
    };
    summary("exchanges until apart",
            [](const job_result& x) { return static_cast<double>(x.exchange); });
    summary("us until apart", [](const job_result& x) { return x.us; });
    const auto never = std::count_if(results.begin(), results.end(),
                                     [](const job_result& x) { return x.exchange < 0; });
    std::printf("jobs never apart: %ld of %zu\n", static_cast<long>(never), results.size());
    return 0;
}
