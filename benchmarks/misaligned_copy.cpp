// memcpy beside corocoll::copy_bytes, one size at a time, with the destination at offsets 0,
// 16 and 48 bytes past the source modulo a 4 KiB page (a large buffer from malloc starts 16
// bytes into a page; shared sets and rings at fixed places in one): the cheapest of a few copies of
// a warm buffer, in µs, and a process_vm_readv of the same bytes of this process's own memory (the
// kernel's copy, which a single copy between ranks makes). Prints what the probe found
// (core/copy.hpp) and the caches.
//
//   misaligned_copy [-b SIZE] [-e SIZE] [-f FACTOR] [-n COPIES]   (defaults 1K, 4M, 2, 50)

#include <corocoll/core/cache_sizes.hpp>
#include <corocoll/core/copy.hpp>

#include "common/args.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>

namespace {

template <class Copy>
double cheapest_us(int iters, Copy&& copy) {
    double best = 1e300;
    for (int i = 0; i < iters; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        copy();
        const auto t1 = std::chrono::steady_clock::now();
        best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    perf::sweep sweep;
    sweep.min_bytes = 1024;
    sweep.max_bytes = std::size_t{4} << 20;
    sweep.iters = 50;
    perf::args cli(
        "misaligned_copy",
        "memcpy beside corocoll::copy_bytes with the destination 0, 16 and 48 bytes past "
        "the source\nmodulo a 4 KiB page: the cheapest of -n copies, in us.");
    cli.size("-b,--minbytes", sweep.min_bytes, "smallest size", 1)
        .size("-e,--maxbytes", sweep.max_bytes, "largest size", 1)
        .real_above("-f,--stepfactor", sweep.factor, 1, "each size is the last one times this")
        .integer("-n,--iters", sweep.iters, 1, 1000000, "copies per size and offset");
    perf::parse_or_exit(cli, argc, argv);
    const auto& probe = corocoll::detail::machine_copy_probe();
    std::printf("# caches %s\n", corocoll::describe(corocoll::machine_cache_sizes()).c_str());
    std::printf(
        "# probe: memcpy at offset 16 %s; copy_bytes copies slow offsets by lines from %zu "
        "B below %zu B\n",
        probe.misaligned_slow ? "slow" : "not slow", corocoll::detail::copy_by_lines_from,
        probe.below);
    std::printf("# %10s %6s %12s %14s %18s\n", "size (B)", "offset", "memcpy us", "copy_bytes us",
                "process_vm_readv us");
    const std::size_t room = sweep.max_bytes + 8192;
    const std::unique_ptr<std::byte[]> a(new std::byte[room]()), b(new std::byte[room]());
    auto* src = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(a.get()) + 4095) &
                                             ~std::uintptr_t{4095});
    auto* base = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(b.get()) + 4095) &
                                              ~std::uintptr_t{4095});
    for (std::size_t n : sweep.sizes()) {
        for (std::size_t offset : {0, 16, 48}) {
            std::byte* dst = base + offset;
            const double plain = cheapest_us(sweep.iters, [&] {
                std::memcpy(dst, src, n);
                asm volatile("" : : "r"(dst) : "memory");
            });
            const double ours = cheapest_us(sweep.iters, [&] {
                corocoll::copy_bytes(dst, src, n);
                asm volatile("" : : "r"(dst) : "memory");
            });
            bool read = true;  // false where the kernel refuses process_vm_readv
            const double kernel = cheapest_us(sweep.iters, [&] {
                iovec local{dst, n};
                iovec remote{src, n};
                read = read && ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) >= 0;
                asm volatile("" : : "r"(dst) : "memory");
            });
            char kernel_text[32] = "n/a";
            if (read) std::snprintf(kernel_text, sizeof kernel_text, "%.2f", kernel);
            std::printf("  %10zu %6zu %12.2f %14.2f %18s\n", n, offset, plain, ours, kernel_text);
        }
    }
    return 0;
}
