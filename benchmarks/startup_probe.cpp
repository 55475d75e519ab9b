// startup_probe: one rank of the start-up benchmark (benchmarks/compare/startup.py). Sets up
// the group from the launcher's environment, runs one all_reduce of one float, checks it and
// prints "startup_done RANK NS" (NS: the wall clock, ns since the epoch, when it was done).
// Without a launcher it spawns --nproc ranks itself (default 4).

#include <corocoll/corocoll.hpp>

#include "common/args.hpp"

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <vector>

namespace cc = corocoll;

namespace {

cc::task<> probe(cc::process_group& pg) {
    std::vector<float> one(1, 1.0f);
    co_await pg.all_reduce(one);
    auto now = std::chrono::system_clock::now().time_since_epoch();
    if (one[0] != static_cast<float>(pg.size())) {
        throw std::runtime_error("startup_probe: all_reduce gave a wrong sum");
    }
    std::printf(
        "startup_done %d %lld\n", pg.rank(),
        static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    int n = 4;
    perf::args a("startup_probe",
                 "One rank of the start-up benchmark (benchmarks/compare/startup.py).");
    a.integer("--nproc", n, 1, 4096, "ranks to spawn where no launcher started it");
    perf::parse_or_exit(a, argc, argv);
    return cc::run_or_spawn(n, probe);
}
