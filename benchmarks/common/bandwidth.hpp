// The benchmarks' one algbw and busbw, as nccl-tests defines them (doc/PERFORMANCE.md there).
// Standard library only and C++17, like the rest of benchmarks/common/.

#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace perf {

/// nccl-tests' bus bandwidth factor: busbw = algbw × bus_factor, the bandwidth a link would
/// need with the best algorithm, comparable across rank counts. all_reduce 2(n−1)/n;
/// all_gather, reduce_scatter, gather, scatter and all_to_all (n−1)/n; broadcast, reduce and
/// ping_pong 1. Throws std::invalid_argument for any other name.
inline double bus_factor(const std::string& collective, int ranks) {
    const double n = ranks;
    if (collective == "all_reduce") return 2 * (n - 1) / n;
    if (collective == "all_gather" || collective == "reduce_scatter" || collective == "gather" ||
        collective == "scatter" || collective == "all_to_all") {
        return (n - 1) / n;
    }
    if (collective == "broadcast" || collective == "reduce" || collective == "ping_pong") return 1;
    throw std::invalid_argument("bus_factor: no factor for '" + collective + "'");
}

/// Algorithm bandwidth in GB/s (10^9 bytes a second): `bytes` moved in `time_us`
/// microseconds; 0 where the time is not above 0.
inline double algbw_gbs(std::size_t bytes, double time_us) {
    return time_us > 0 ? static_cast<double>(bytes) / time_us / 1e3 : 0;
}

}  // namespace perf
