// select_table: what collectives::select picks for a group without an arena or several hosts
// (every pair over TCP, one host's thresholds), for all_reduce, broadcast, all_gather and
// reduce_scatter at 2-8,192 ranks and 8 B-256 MiB (factors of 2). One line each:
// "KIND RANKS BYTES ALGORITHM". benchmarks/compare/cost_model.py sets the cost model's best
// algorithm beside it.

#include <corocoll/corocoll.hpp>

#include <cstddef>
#include <cstdio>

namespace coll = corocoll::collectives;

int main() {
    const auto th = coll::thresholds::for_l2(corocoll::machine_cache_sizes().l2);
    for (auto k : {coll::collective_kind::all_reduce, coll::collective_kind::broadcast,
                   coll::collective_kind::all_gather, coll::collective_kind::reduce_scatter}) {
        for (int n = 2; n <= 8192; n *= 2) {
            for (std::size_t bytes = 8; bytes <= (std::size_t{256} << 20); bytes *= 2) {
                auto a = coll::select(k, bytes, n, {}, th);
                std::printf("%s %d %zu %s\n", coll::kind_name(k), n, bytes,
                            coll::algorithm_name(a));
            }
        }
    }
    return 0;
}
