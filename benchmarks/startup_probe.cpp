// startup_probe: one rank of the start-up benchmark (benchmarks/compare/startup.py) and of the
// connection count (benchmarks/compare/connections.py). Sets up the group from the launcher's
// environment, runs one all_reduce of one float (or, with --first, a ring all_reduce or a
// binomial broadcast), checks it and prints "startup_done RANK NS" (NS: the wall clock, ns since
// the epoch, when it was done), then "connections RANK N RSS_KIB SEGMENT_KIB ARENA_KIB" (the peers
// it has a connection to, its resident memory, and the shared memory it maps: pair segments and
// the arena, from /proc/self/maps). Without a launcher it spawns --nproc ranks itself (default
// 4).

#include <corocoll/corocoll.hpp>

#include "common/args.hpp"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace cc = corocoll;

namespace {

std::string first = "all_reduce";

// VmRSS of this process, KiB (0 where /proc does not say).
long rss_kib() {
    std::ifstream in("/proc/self/status");
    std::string key;
    long value = 0;
    while (in >> key) {
        if (key == "VmRSS:") {
            in >> value;
            return value;
        }
        in.ignore(1 << 12, '\n');
    }
    return 0;
}

// KiB of corocoll's shared memory this process maps whose memfd is named `name`.
long mapped_kib(const std::string& name) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    long bytes = 0;
    while (std::getline(maps, line)) {
        unsigned long lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 &&
            line.find("/memfd:" + name + " ") != std::string::npos) {
            bytes += static_cast<long>(hi - lo);
        }
    }
    return bytes / 1024;
}

cc::task<> probe(cc::process_group& pg) {
    namespace coll = cc::collectives;
    std::vector<float> one(1, 1.0f);
    if (first == "broadcast") {
        pg.set_algorithm(coll::collective_kind::broadcast, coll::algorithm::binomial);
        one[0] = pg.rank() == 0 ? static_cast<float>(pg.size()) : -1.0f;
        co_await pg.broadcast(one, 0);
    } else {
        if (first == "ring")
            pg.set_algorithm(coll::collective_kind::all_reduce, coll::algorithm::ring);
        co_await pg.all_reduce(one);
    }
    auto now = std::chrono::system_clock::now().time_since_epoch();
    if (one[0] != static_cast<float>(pg.size())) {
        throw std::runtime_error("startup_probe: " + first + " gave a wrong result");
    }
    std::printf(
        "startup_done %d %lld\n", pg.rank(),
        static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
    int peers = 0;
    for (int p = 0; p < pg.size(); ++p) peers += p != pg.rank() && *pg.channel_to(p) != '\0';
    std::printf("connections %d %d %ld %ld %ld\n", pg.rank(), peers, rss_kib(),
                mapped_kib("corocoll-shm"), mapped_kib("corocoll-arena"));
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    int n = 4;
    perf::args a("startup_probe",
                 "One rank of the start-up benchmark (benchmarks/compare/startup.py).");
    a.integer("--nproc", n, 1, 4096, "ranks to spawn where no launcher started it");
    a.one_of("--first", first, {"all_reduce", "ring", "broadcast"},
             "the first call: all_reduce as chosen, a ring all_reduce, a binomial broadcast");
    perf::parse_or_exit(a, argc, argv);
    return cc::run_or_spawn(n, probe);
}
