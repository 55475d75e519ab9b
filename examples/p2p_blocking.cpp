// The torch tutorial's blocking point-to-point example with 4 ranks, written with the plain
// blocking API as the tutorial is: rank 0 sends a tensor holding 1 to rank 3, which receives
// it; ranks 1 and 2 keep their 0. Every rank prints "Rank r has data x" and checks its value.
// Runs under any launcher (corocollrun, torchrun --no_python, mpirun with MASTER_ADDR and
// MASTER_PORT exported), or spawns 4 ranks itself when started alone.

#include <corocoll/corocoll.hpp>

#include <cstdio>
#include <exception>
#include <vector>

namespace cc = corocoll;

int rank_main() try {
    cc::init_process_group();
    std::vector<float> tensor{0.0f};
    int rank = cc::get_rank();
    int last = cc::get_world_size() - 1;
    if (rank == 0) {
        tensor[0] += 1;
        cc::send(tensor, last);
    } else if (rank == last) {
        cc::recv(tensor, 0);
    }
    std::printf("Rank %d has data %g\n", rank, tensor[0]);
    cc::destroy_process_group();
    float expected = (rank == 0 || rank == last) ? 1.0f : 0.0f;
    if (tensor[0] != expected) {
        std::fprintf(stderr, "rank %d: expected %g\n", rank, expected);
        return 1;
    }
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", cc::get_rank(), e.what());
    return 1;
}

int main() { return cc::run_or_spawn_main(4, rank_main); }
