// A CUDA kernel runs while an all_reduce is in flight, and the rank awaits both with
// co_await: the GPU computes while the reactor moves the gradients. Ranks share one GPU, so
// the all_reduce is a CPU (tcp) group's, on CUDA buffers staged through pinned host memory
// (gpu::staged); the kernel's completion is awaited through an event the reactor polls.
//
//   gpu_overlap [--ranks N] [--mib M] [--check]
//
// Prints the kernel alone, the all_reduce alone and both together (each the least of 5 tries);
// --check fails (exit 1) unless both results are right and together take under 0.9 of the two
// apart on every rank. Runs under a
// launcher, or spawns N ranks (default 2). Exits 77 where no CUDA device is visible.

#include <corocoll/corocoll.hpp>
#include <corocoll/gpu.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" cudaError_t corocoll_example_busy(float* x, unsigned long long n, int rounds,
                                             cudaStream_t s);

namespace cc = corocoll;
using clock_type = std::chrono::steady_clock;

namespace {

int ranks = 2;
std::size_t mib = 16;
bool check = false;

double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// The kernel on its own stream, awaited without blocking the reactor.
cc::task<> compute(cc::io::reactor& r, cc::gpu::device_buffer<float>& x, int rounds,
                   cudaStream_t s) {
    cc::gpu::check_cuda(corocoll_example_busy(x.data(), x.size(), rounds, s), "busy kernel");
    co_await cc::gpu::synchronize(r, s);
}

cc::task<> body(cc::process_group& pg) {
    auto& r = pg.reactor();
    int me = pg.rank(), n = pg.size();
    cc::gpu::staged st(pg);
    cc::gpu::stream compute_stream(cudaStreamNonBlocking);
    std::size_t count = mib * (std::size_t{1} << 20) / sizeof(float);
    cc::gpu::device_buffer<float> grads(count), work(std::size_t{1} << 22);
    cc::gpu::check_cuda(cudaMemset(work.data(), 0, work.size_bytes()), "cudaMemset");
    std::vector<float> host(count, static_cast<float>(me + 1));
    grads.copy_from(host);

    // Each time is the least of `reps` tries: ranks that share one GPU time-slice it between
    // their processes, and one try can land behind the other rank's kernel.
    constexpr int reps = 5;
    // The all_reduce alone (after a warm-up that also sets up the staging buffers).
    co_await st.all_reduce(grads);
    double reduce_ms = 1e300;
    for (int i = 0; i < reps; ++i) {
        grads.copy_from(host);
        co_await pg.barrier();
        auto t0 = clock_type::now();
        co_await st.all_reduce(grads);
        reduce_ms = std::min(reduce_ms, ms_since(t0));
    }

    // A kernel about as long as the all_reduce: time 1000 rounds, scale.
    co_await compute(r, work, 1000, compute_stream);
    double per_round = 1e300;
    for (int i = 0; i < reps; ++i) {
        auto t0 = clock_type::now();
        co_await compute(r, work, 1000, compute_stream);
        per_round = std::min(per_round, ms_since(t0) / 1000);
    }
    int rounds = std::max(1, static_cast<int>(reduce_ms / per_round));
    double compute_ms = 1e300;
    for (int i = 0; i < reps; ++i) {
        co_await pg.barrier();
        auto t0 = clock_type::now();
        co_await compute(r, work, rounds, compute_stream);
        compute_ms = std::min(compute_ms, ms_since(t0));
    }

    // Both at once.
    double both_ms = 1e300;
    for (int i = 0; i < reps; ++i) {
        grads.copy_from(host);
        co_await pg.barrier();
        auto t0 = clock_type::now();
        co_await cc::when_all(compute(r, work, rounds, compute_stream), st.all_reduce(grads));
        both_ms = std::min(both_ms, ms_since(t0));
    }

    grads.copy_to(host);
    float want = static_cast<float>(n) * static_cast<float>(n + 1) / 2.0f;
    bool right = true;
    for (float v : host) right = right && v == want;
    std::vector<float> w(work.size());
    work.copy_to(w);
    for (float v : w) right = right && std::isfinite(v);

    // 1 would be no overlap at all, max/sum (about 0.5 here) all of the shorter part hidden.
    double ratio = both_ms / (compute_ms + reduce_ms);
    std::vector<double> ratios(static_cast<std::size_t>(n));
    co_await pg.all_gather_object(ratios, ratio);
    double worst = 0;
    for (double x : ratios) worst = std::max(worst, x);
    if (me == 0) {
        std::printf("%d ranks on one GPU, %zu MiB float all_reduce (tcp, staged)\n", n, mib);
        std::printf("kernel alone      %8.2f ms (%d rounds)\n", compute_ms, rounds);
        std::printf("all_reduce alone  %8.2f ms\n", reduce_ms);
        std::printf("both, co_await'ed %8.2f ms: %.2f of the sum (worst rank %.2f)\n", both_ms,
                    ratio, worst);
        std::printf("results %s\n", right ? "right" : "WRONG");
    }
    if (!right) throw std::runtime_error("rank " + std::to_string(me) + ": wrong results");
    if (check && worst >= 0.9) {
        throw std::runtime_error("no overlap: together " + std::to_string(worst) +
                                 " of the time apart (need < 0.9)");
    }
}

}  // namespace

int main(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--ranks" && i + 1 < argc) {
            ranks = std::atoi(argv[++i]);
        } else if (a == "--mib" && i + 1 < argc) {
            mib = static_cast<std::size_t>(std::atol(argv[++i]));
        } else if (a == "--check") {
            check = true;
        } else {
            std::fprintf(stderr, "usage: gpu_overlap [--ranks N] [--mib M] [--check]\n");
            return 2;
        }
    }
    // Asked in a child: the ranks are forked, and CUDA must not be set up before that.
    if (cc::gpu::probe_devices() == 0) {
        std::printf("SKIP: no CUDA device\n");
        return 77;
    }
    return cc::run_or_spawn(ranks, body);
}
