// overlap: how much of an all_reduce hides behind computation that runs while it is in flight.
//
//   overlap [--nproc N] [-s SIZE] [-n REPS] [-F text|json] [-J FILE]
//
// SIZE takes K, M and G and must be a whole number of floats (1.5M is 1572864 bytes; 1.3M is
// refused). -n is the repetitions, as coll_perf's iterations (it was -r, which is the root
// there). -F json writes the figures as one JSON row (benchmarks/common/report.hpp); -J FILE
// writes that row to FILE as well. --help lists the options.
//
// On every rank, each repetition times, after a barrier each:
//   comm     the all_reduce (avg) of BYTES of floats (default 16 MiB) alone;
//   compute  a fixed amount of arithmetic on a pool thread (`co_await offload`), calibrated at
//            the start so that it takes about as long as comm;
//   both     the all_reduce started (`start`), the same arithmetic offloaded, both awaited.
// Each figure is the largest over the ranks, then the median over the repetitions. Reported:
// both against comm + compute (no overlap) and against max(comm, compute) (perfect overlap),
// and overlap = (comm + compute - both) / min(comm, compute): 1 when the shorter one is
// hidden completely, 0 when they ran one after the other. Also the CPU a rank uses during the
// all_reduce alone (cores, all its threads): on loopback TCP the "network" is the processors'
// own copying, so ranks that already fill the cores leave no idle time to hide work in.
//
// Runs under corocollrun, torchrun or mpirun (one rank per process), or spawns --nproc ranks
// (default 2).

#include <corocoll/corocoll.hpp>

#include "common/args.hpp"
#include "common/report.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace cc = corocoll;
using clock_type = std::chrono::steady_clock;

namespace {

struct config {
    int nproc = 2;
    std::size_t bytes = std::size_t{16} << 20;
    int reps = 10;
    std::string format = "text";
    std::string json_path;
};

// Arithmetic that stays in the core's L1 cache, so that it competes with the all_reduce for
// the processor and not for memory bandwidth: `units` passes of a multiply-add over 4 KiB.
double compute(long units) {
    std::vector<float> x(1024, 1.0f);
    for (long u = 0; u < units; ++u) {
        for (float& v : x) v = v * 0.999f + 0.001f;
    }
    double sum = 0;
    for (float v : x) sum += v;
    return sum;
}

// CPU time of every thread of this process so far.
double process_cpu_ms() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return (static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3) +
           (static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3);
}

double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// The largest of every rank's `v`.
cc::task<double> slowest(cc::process_group& pg, double v) {
    std::vector<double> one(1, v);
    co_await pg.all_reduce(one, cc::reduce_op::max);
    co_return one[0];
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

cc::task<> run(cc::process_group& pg, const config& c) {
    std::vector<float> grad(c.bytes / sizeof(float), 1.0f);
    double sink = 0;
    // Warm-up, and the all_reduce's own time for the calibration.
    co_await pg.all_reduce(grad, cc::reduce_op::avg);
    co_await pg.barrier();
    auto t0 = clock_type::now();
    for (int i = 0; i < 3; ++i) co_await pg.all_reduce(grad, cc::reduce_op::avg);
    double comm_guess = co_await slowest(pg, ms_since(t0) / 3);
    // Units of arithmetic per millisecond on this machine, the slowest rank's figure (the
    // second probe: the first also starts the pool's threads).
    long probe = 20000;
    double probe_ms = 0;
    for (int i = 0; i < 2; ++i) {
        t0 = clock_type::now();
        sink += co_await cc::offload([probe] { return compute(probe); });
        probe_ms = ms_since(t0);
    }
    double per_ms = static_cast<double>(probe) / co_await slowest(pg, probe_ms);
    long units = std::max(1L, static_cast<long>(per_ms * comm_guess));
    // One correction against both measured again, now that caches and pools are warm.
    co_await pg.barrier();
    t0 = clock_type::now();
    co_await pg.all_reduce(grad, cc::reduce_op::avg);
    double comm_ms = co_await slowest(pg, ms_since(t0));
    t0 = clock_type::now();
    sink += co_await cc::offload([units] { return compute(units); });
    double work_ms = co_await slowest(pg, ms_since(t0));
    units = std::max(1L, static_cast<long>(static_cast<double>(units) * comm_ms / work_ms));

    std::vector<double> comm, work, both, busy;
    for (int r = 0; r < c.reps; ++r) {
        co_await pg.barrier();
        double cpu0 = process_cpu_ms();
        t0 = clock_type::now();
        co_await pg.all_reduce(grad, cc::reduce_op::avg);
        double took = ms_since(t0);
        busy.push_back(co_await slowest(pg, (process_cpu_ms() - cpu0) / took));
        comm.push_back(co_await slowest(pg, took));

        co_await pg.barrier();
        t0 = clock_type::now();
        sink += co_await cc::offload([units] { return compute(units); });
        work.push_back(co_await slowest(pg, ms_since(t0)));

        co_await pg.barrier();
        t0 = clock_type::now();
        auto in_flight = cc::start(pg.all_reduce(grad, cc::reduce_op::avg));
        sink += co_await cc::offload([units] { return compute(units); });
        co_await in_flight;
        both.push_back(co_await slowest(pg, ms_since(t0)));
    }
    // Averages of ones stay ones: a wrong reduction under overlap shows here.
    if (std::any_of(grad.begin(), grad.end(), [](float v) { return v != 1.0f; })) {
        throw std::runtime_error("overlap: the all_reduce gave a wrong result");
    }
    double m_comm = median(comm), m_work = median(work), m_both = median(both);
    double m_busy = median(busy);
    double sum = m_comm + m_work, larger = std::max(m_comm, m_work);
    double overlap = (sum - m_both) / std::min(m_comm, m_work);
    if (pg.rank() == 0) {
        // The JSON row (stdout with -F json, the file with -J); the text is written below.
        bool json = c.format == "json";
        perf::report out(perf::format::json, c.json_path, json ? stdout : nullptr);
        out.row({{"ranks", pg.size()},
                 {"bytes", c.bytes},
                 {"reps", c.reps},
                 {"comm_ms", {m_comm, 3}},
                 {"compute_ms", {m_work, 3}},
                 {"both_ms", {m_both, 3}},
                 {"sum_ms", {sum, 3}},
                 {"max_ms", {larger, 3}},
                 {"overlap", {overlap, 3}},
                 {"comm_cpu_cores", {m_busy, 2}}});
        out.finish();
        if (!json) {
            std::printf(
                "# corocoll overlap: all_reduce of %zu bytes on %d ranks, %d repetitions "
                "(medians of the slowest rank)\n",
                c.bytes, pg.size(), c.reps);
            std::printf("%-34s %10.3f ms\n", "all_reduce alone", m_comm);
            std::printf("%-34s %10.3f ms\n", "computation alone", m_work);
            std::printf("%-34s %10.3f ms\n", "both, all_reduce in flight", m_both);
            std::printf("%-34s %10.3f ms  (both / sum %.2f)\n", "sum (no overlap)", sum,
                        m_both / sum);
            std::printf("%-34s %10.3f ms  (both / max %.2f)\n", "larger (perfect overlap)", larger,
                        m_both / larger);
            std::printf("%-34s %10.2f\n", "overlap (1 = shorter one hidden)", overlap);
            std::printf("%-34s %10.2f cores of %u\n", "a rank's CPU use in all_reduce", m_busy,
                        std::thread::hardware_concurrency());
        }
        std::fflush(stdout);
    }
    if (sink == 0) std::printf("#\n");  // keeps the arithmetic from being optimised away
}

config parse(int argc, char** argv) {
    config c;
    perf::args a("overlap",
                 "How much of an all_reduce hides behind computation that runs while it is in "
                 "flight.\nRuns under corocollrun, torchrun or mpirun, or spawns --nproc ranks.");
    a.size("-s,--size", c.bytes, "the all_reduce's buffer of floats", sizeof(float))
        .integer("-n,--iters", c.reps, 1, 1000000, "repetitions (medians are reported)")
        .one_of("-F,--format", c.format, {"text", "json"}, "what stdout carries")
        .text("-J,--output_file", c.json_path, "FILE", "also write the figures to FILE as JSON")
        .integer("--nproc", c.nproc, 1, 4096, "ranks to spawn where no launcher started it")
        .moved("-r", "the repetitions are -n now, as coll_perf's iterations")
        .validate([&c] {
            if (c.bytes % sizeof(float) != 0) {
                throw perf::usage_error("-s " + std::to_string(c.bytes) +
                                        ": not a whole number of floats (4 bytes each)");
            }
        });
    perf::parse_or_exit(a, argc, argv);
    return c;
}

}  // namespace

int main(int argc, char** argv) {
    config c = parse(argc, argv);
    return cc::run_or_spawn(c.nproc, [&c](cc::process_group& pg) { return run(pg, c); });
}
