// Two ranks bounce a number: rank 0 adds 1 and sends it, rank 1 adds 1 and sends it back;
// rank 0 ends with 2. Runs under any launcher (corocollrun, torchrun, mpirun with
// MASTER_ADDR/MASTER_PORT exported), or spawns its 2 ranks itself when started alone.

#include <corocoll/corocoll.hpp>

#include <cstdio>
#include <stdexcept>
#include <vector>

namespace cc = corocoll;

cc::task<> body(cc::process_group& pg) {
    if (pg.size() != 2) throw std::invalid_argument("ping_pong needs exactly 2 ranks");
    std::vector<float> tensor{0.0f};
    if (pg.rank() == 0) {
        tensor[0] += 1;
        co_await pg.send(tensor, 1);
        co_await pg.recv(tensor, 1);
        std::printf("Rank 0 has data %g\n", tensor[0]);
        if (tensor[0] != 2.0f) throw std::runtime_error("rank 0 expected 2 after the round trip");
    } else {
        co_await pg.recv(tensor, 0);
        tensor[0] += 1;
        std::printf("Rank 1 has data %g\n", tensor[0]);
        co_await pg.send(tensor, 0);
    }
}

int main() { return cc::run_or_spawn(2, body); }
