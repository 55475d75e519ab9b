// The gpu_overlap example's kernel (examples/gpu_kernels.cu) on the simulator: nvcc's code
// cannot run without a GPU, so each "round" is a microsecond of simulated stream work, a task
// on the stream that occupies it as the kernel would and leaves the data as it was (finite).

#include "sim.hpp"

#include <cuda_runtime_api.h>

#include <chrono>

extern "C" cudaError_t corocoll_example_busy(float*, unsigned long long, int rounds,
                                             cudaStream_t s) {
    corocoll_sim::busy(s, std::chrono::microseconds(rounds));
    return cudaSuccess;
}
