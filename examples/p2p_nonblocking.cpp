// The torch tutorial's non-blocking point-to-point example with 4 ranks: rank 0 starts an
// isend to rank 3, rank 3 an irecv from rank 0; both `co_await` the request where torch calls
// `req.wait()`, and the reactor moves the bytes meanwhile. Every rank prints and checks its
// data. Runs under any launcher, or spawns 4 ranks itself.

#include <corocoll/corocoll.hpp>

#include <cstdio>
#include <stdexcept>
#include <vector>

namespace cc = corocoll;

cc::task<> body(cc::process_group& pg) {
    std::vector<float> tensor{0.0f};
    int last = pg.size() - 1;
    if (pg.rank() == 0) {
        tensor[0] += 1;
        auto req = pg.isend(tensor, last);
        std::printf("Rank 0 started sending\n");
        co_await req;
    } else if (pg.rank() == last) {
        auto req = pg.irecv(tensor, 0);
        std::printf("Rank %d started receiving\n", last);
        co_await req;
    }
    std::printf("Rank %d has data %g\n", pg.rank(), tensor[0]);
    float expected = (pg.rank() == 0 || pg.rank() == last) ? 1.0f : 0.0f;
    if (tensor[0] != expected) throw std::runtime_error("wrong data");
}

int main() { return cc::run_or_spawn(4, body); }
