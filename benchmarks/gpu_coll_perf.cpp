// gpu_coll_perf: NCCL collectives on GPU buffers in the style of nccl-tests, each size run
// twice in the same process on the same communicator and stream: through corocoll's NCCL
// group (each op awaited with co_await: an event the reactor polls) and through plain NCCL
// calls (each op followed by cudaStreamSynchronize). The last columns are the difference per
// op and the ratio of the two: the cost of the coroutine layer.
//
//   gpu_coll_perf [-o OP] [-d TYPE] [-R REDOP] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS]
//                 [-w WARMUP] [-c 0|1]
//
//   -o  all_reduce (default), broadcast, reduce, all_gather, reduce_scatter, all_to_all
//   -d  float (default), double, half, bfloat16, int32, int64, uint8
//   -R  sum (default), prod, min, max, avg
//   -b, -e, -f  sizes in bytes (K, M, G suffixes), default 8 B to 128 MiB, factor 2
//   -n, -w  timed and warm-up iterations per size (default 50 and 5)
//   -c 1    check the result once per size (#wrong: elements that differ)
//
// A size is nccl-tests': the buffer of all_reduce, broadcast and reduce, the gathered buffer
// of all_gather, the input of reduce_scatter and all_to_all. time is the mean per op, the
// largest over the ranks; busbw uses nccl-tests' factors. Runs under a launcher (one rank per
// GPU), or alone as a world of one. Exits 77 where no CUDA device is visible.

#include <corocoll/corocoll.hpp>
#include <corocoll/gpu.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace cc = corocoll;
namespace gpu = corocoll::gpu;
using clock_type = std::chrono::steady_clock;

namespace {

struct config {
    std::string op = "all_reduce";
    std::string type = "float";
    std::string redop = "sum";
    std::size_t min_bytes = 8, max_bytes = std::size_t{128} << 20;
    double factor = 2;
    int iters = 50, warmup = 5;
    bool check = false;
};

std::size_t parse_size(const std::string& s) {
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    std::string unit = end;
    if (unit == "K" || unit == "k") v *= 1024;
    if (unit == "M" || unit == "m") v *= 1024.0 * 1024;
    if (unit == "G" || unit == "g") v *= 1024.0 * 1024 * 1024;
    if (v < 1) throw std::invalid_argument("bad size '" + s + "'");
    return static_cast<std::size_t>(v);
}

config parse(int argc, char** argv) {
    config c;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (i + 1 >= argc) throw std::invalid_argument("option " + a + " needs a value");
        std::string v = argv[++i];
        if (a == "-o")
            c.op = v;
        else if (a == "-d")
            c.type = v;
        else if (a == "-R")
            c.redop = v;
        else if (a == "-b")
            c.min_bytes = parse_size(v);
        else if (a == "-e")
            c.max_bytes = parse_size(v);
        else if (a == "-f")
            c.factor = std::stod(v);
        else if (a == "-n")
            c.iters = std::stoi(v);
        else if (a == "-w")
            c.warmup = std::stoi(v);
        else if (a == "-c")
            c.check = v != "0";
        else
            throw std::invalid_argument("unknown option " + a);
    }
    if (c.factor <= 1) throw std::invalid_argument("-f must be above 1");
    return c;
}

double bus_factor(const std::string& op, int n) {
    if (op == "all_reduce") return 2.0 * (n - 1) / n;
    if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") {
        return static_cast<double>(n - 1) / n;
    }
    return 1;
}

cc::reduce_op redop_of(const std::string& s) {
    if (s == "sum") return cc::reduce_op::sum;
    if (s == "prod") return cc::reduce_op::product;
    if (s == "min") return cc::reduce_op::min;
    if (s == "max") return cc::reduce_op::max;
    if (s == "avg") return cc::reduce_op::avg;
    throw std::invalid_argument("unknown reduce op '" + s + "'");
}

// Plain NCCL: the call, then (the communicator is non-blocking) waiting out ncclInProgress,
// then cudaStreamSynchronize.
void plain_wait(ncclComm_t comm, ncclResult_t rc, cudaStream_t s) {
    while (rc == ncclInProgress) ncclCommGetAsyncError(comm, &rc);
    if (rc != ncclSuccess) throw std::runtime_error("NCCL: " + gpu::describe_nccl(rc, comm));
    gpu::check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

template <class T>
struct runner {
    gpu::nccl_group& pg;
    const config& c;

    // One op of `count` elements per rank-block: through the group, or plain.
    cc::task<> ours(gpu::device_buffer<T>& in, gpu::device_buffer<T>& out, std::size_t count) {
        auto op = redop_of(c.redop);
        if (c.op == "all_reduce") co_return co_await pg.all_reduce(in, op);
        if (c.op == "broadcast") co_return co_await pg.broadcast(in, 0);
        if (c.op == "reduce") co_return co_await pg.reduce(in, 0, op);
        auto block = gpu::device_span<T>{in.data(), count};
        if (c.op == "all_gather") co_return co_await pg.all_gather_into(out, block);
        auto outblock = gpu::device_span<T>{out.data(), count};
        if (c.op == "reduce_scatter") co_return co_await pg.reduce_scatter_into(outblock, in, op);
        if (c.op == "all_to_all") co_return co_await pg.all_to_all_single(out, in);
        throw std::invalid_argument("unknown op '" + c.op + "'");
    }

    void plain(gpu::device_buffer<T>& in, gpu::device_buffer<T>& out, std::size_t count) {
        ncclComm_t comm = pg.comm();
        cudaStream_t s = pg.stream();
        ncclDataType_t t = gpu::nccl_type_of<T>();
        ncclRedOp_t op = gpu::nccl_op_of(redop_of(c.redop), "");
        ncclResult_t rc = ncclSuccess;
        if (c.op == "all_reduce") {
            rc = ncclAllReduce(in.data(), in.data(), in.size(), t, op, comm, s);
        } else if (c.op == "broadcast") {
            rc = ncclBroadcast(in.data(), in.data(), in.size(), t, 0, comm, s);
        } else if (c.op == "reduce") {
            rc = ncclReduce(in.data(), in.data(), in.size(), t, op, 0, comm, s);
        } else if (c.op == "all_gather") {
            rc = ncclAllGather(in.data(), out.data(), count, t, comm, s);
        } else if (c.op == "reduce_scatter") {
            rc = ncclReduceScatter(in.data(), out.data(), count, t, op, comm, s);
        } else if (c.op == "all_to_all") {
            rc = ncclAlltoAll(in.data(), out.data(), count, t, comm, s);
        }
        plain_wait(comm, rc, s);
    }
};

template <class T>
cc::task<> sweep(gpu::nccl_group& pg, cc::process_group& cpu, const config& c) {
    int n = pg.size();
    runner<T> run{pg, c};
    if (pg.rank() == 0) {
        std::printf("# gpu_coll_perf: %s, %d rank(s), device %d, %d iterations (+%d warm-up)\n",
                    c.op.c_str(), n, pg.device(), c.iters, c.warmup);
        std::printf("%12s %12s %8s %6s | %10s %8s %8s %6s | %10s %8s %8s | %9s %7s\n", "size",
                    "count", "type", "redop", "time(us)", "algbw", "busbw", "#wrong", "time(us)",
                    "algbw", "busbw", "diff(us)", "ratio");
        std::printf("%12s %12s %8s %6s | %37s | %28s |\n", "", "", "", "", "corocoll (co_await)",
                    "plain NCCL (synchronize)");
    }
    for (std::size_t bytes = c.min_bytes; bytes <= c.max_bytes;
         bytes =
             std::max(bytes + 1, static_cast<std::size_t>(static_cast<double>(bytes) * c.factor))) {
        bool blocks = c.op == "all_gather" || c.op == "reduce_scatter" || c.op == "all_to_all";
        std::size_t total = std::max<std::size_t>(bytes / sizeof(T), static_cast<std::size_t>(n));
        if (blocks) total -= total % static_cast<std::size_t>(n);
        std::size_t count = blocks ? total / static_cast<std::size_t>(n) : total;
        // all_gather's input is one block; the others' is the whole size.
        gpu::device_buffer<T> in(c.op == "all_gather" ? count : total);
        gpu::device_buffer<T> out(c.op == "reduce_scatter" ? count : total);
        std::vector<T> ones(in.size(), T(1));
        in.copy_from(ones);

        for (int i = 0; i < c.warmup; ++i) co_await run.ours(in, out, count);
        co_await pg.barrier();
        auto t0 = clock_type::now();
        for (int i = 0; i < c.iters; ++i) co_await run.ours(in, out, count);
        double ours_us =
            std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() / c.iters;

        for (int i = 0; i < c.warmup; ++i) run.plain(in, out, count);
        co_await pg.barrier();
        t0 = clock_type::now();
        for (int i = 0; i < c.iters; ++i) run.plain(in, out, count);
        double plain_us =
            std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() / c.iters;

        long long wrong = 0;
        if (c.check && c.op == "all_reduce" && c.redop == "sum") {
            // From ones: one all_reduce gives n everywhere (exact in every listed type).
            in.copy_from(ones);
            co_await run.ours(in, out, count);
            std::vector<T> got(in.size());
            in.copy_to(got);
            for (const T& v : got) wrong += static_cast<float>(v) != static_cast<float>(n);
        }
        // The slowest rank's times, as nccl-tests reports.
        std::vector<double> mine{ours_us, plain_us}, all(2 * static_cast<std::size_t>(n));
        co_await cpu.all_gather_into(all, mine);
        for (int p = 0; p < n; ++p) {
            ours_us = std::max(ours_us, all[2 * static_cast<std::size_t>(p)]);
            plain_us = std::max(plain_us, all[2 * static_cast<std::size_t>(p) + 1]);
        }
        if (pg.rank() == 0) {
            double size = static_cast<double>(total * sizeof(T));
            double a1 = size / ours_us / 1e3, a2 = size / plain_us / 1e3;
            double f = bus_factor(c.op, n);
            std::printf(
                "%12zu %12zu %8s %6s | %10.2f %8.2f %8.2f %6lld | %10.2f %8.2f %8.2f | "
                "%9.2f %7.3f\n",
                total * sizeof(T), total, c.type.c_str(),
                (c.op == "all_reduce" || c.op == "reduce" || c.op == "reduce_scatter")
                    ? c.redop.c_str()
                    : "none",
                ours_us, a1, a1 * f, wrong, plain_us, a2, a2 * f, ours_us - plain_us,
                ours_us / plain_us);
            std::fflush(stdout);
        }
    }
}

cc::task<> bench(cc::io::reactor& r, const config& c) {
    // A CPU group beside the NCCL one, for gathering the timings; both through one store.
    cc::init_options o;
    std::string path;
    if (!cc::launched_by_launcher()) {
        path = "/tmp/gpu_coll_perf_" + std::to_string(::getpid());
        o.init_method = "file://" + path;
        o.rank = 0;
        o.world_size = 1;
    }
    auto cpu = co_await cc::init_process_group(r, o);
    // The NCCL group rendezvouses through the CPU group's store.
    o.store = cpu->shared_store();
    o.rank = cpu->rank();
    o.world_size = cpu->size();
    o.backend = "nccl";
    o.group_name = "nccl";
    auto pg = co_await gpu::init_process_group(r, o);
    if (c.type == "float")
        co_await sweep<float>(*pg, *cpu, c);
    else if (c.type == "double")
        co_await sweep<double>(*pg, *cpu, c);
    else if (c.type == "half")
        co_await sweep<cc::float16>(*pg, *cpu, c);
    else if (c.type == "bfloat16")
        co_await sweep<cc::bfloat16>(*pg, *cpu, c);
    else if (c.type == "int32")
        co_await sweep<std::int32_t>(*pg, *cpu, c);
    else if (c.type == "int64")
        co_await sweep<std::int64_t>(*pg, *cpu, c);
    else if (c.type == "uint8")
        co_await sweep<std::uint8_t>(*pg, *cpu, c);
    else
        throw std::invalid_argument("unknown type '" + c.type + "'");
    co_await pg->close();
    co_await cpu->close();
    if (!path.empty()) std::remove(path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
    config c;
    try {
        c = parse(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "gpu_coll_perf: %s\n", e.what());
        return 2;
    }
    if (gpu::device_count() == 0) {
        std::printf("SKIP: no CUDA device: %s\n", gpu::no_device_reason().c_str());
        return 77;
    }
    try {
        cc::io::reactor r;
        r.run(bench(r, c));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "gpu_coll_perf: %s\n", e.what());
        return 1;
    }
    return 0;
}
