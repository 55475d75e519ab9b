// The smallest program a user writes with corocoll: the default group from the launcher's
// environment, one all_reduce, a printout. compile_time.py times compiling and linking it.
// Run it under corocollrun (or with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set) to see it work.

#include <corocoll/corocoll.hpp>

#include <cstdio>
#include <vector>

int main() {
    corocoll::init_process_group();
    std::vector<float> t(4, static_cast<float>(corocoll::get_rank() + 1));
    corocoll::all_reduce(t);
    std::printf("rank %d: all_reduce gives %g\n", corocoll::get_rank(), static_cast<double>(t[0]));
    corocoll::destroy_process_group();
}
