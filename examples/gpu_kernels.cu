// The CUDA kernel of the gpu_overlap example, compiled by nvcc; the example itself is plain
// C++ (g++ or clang) and calls it through the C function below.

#include <cuda_runtime.h>

namespace {

// `rounds` dependent multiply-adds per element: GPU time that grows linearly with `rounds`.
__global__ void busy(float* x, unsigned long long n, int rounds) {
    unsigned long long i = blockIdx.x * static_cast<unsigned long long>(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    for (int r = 0; r < rounds; ++r) v = v * 0.999f + 0.001f;
    x[i] = v;
}

}  // namespace

extern "C" cudaError_t corocoll_example_busy(float* x, unsigned long long n, int rounds,
                                             cudaStream_t s) {
    unsigned threads = 256;
    auto blocks = static_cast<unsigned>((n + threads - 1) / threads);
    busy<<<blocks, threads, 0, s>>>(x, n, rounds);
    return cudaGetLastError();
}
