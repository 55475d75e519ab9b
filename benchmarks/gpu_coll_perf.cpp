// gpu_coll_perf: NCCL collectives on GPU buffers in the style of nccl-tests, each size run
// twice in the same process on the same stream: through corocoll's NCCL group (a
// non-blocking communicator; each op awaited with co_await: an event the reactor polls) and
// through plain NCCL calls on a blocking communicator of the same ranks and device, as
// nccl-tests makes them (each op followed by cudaStreamSynchronize). The last columns are the
// difference per op and the ratio of the two: the cost of the coroutine layer, including what
// a non-blocking communicator costs per op.
//
//   gpu_coll_perf [--coll COLL] [-d TYPE] [-o REDOP] [-r ROOT] [-b MIN] [-e MAX] [-f FACTOR]
//                 [-n ITERS] [-w WARMUP] [-c 0|1] [-F text|csv|json] [-J FILE]
//
// The flags are coll_perf's, which are nccl-tests' (benchmarks/common/args.hpp reads both):
//   --coll  all_reduce (default), broadcast, reduce, all_gather, reduce_scatter, all_to_all
//           (no letter: nccl-tests picks the collective by program name, and -o is the
//           reduction there)
//   -d, --datatype  float (default), double, half, bfloat16, int32, int64, uint8
//   -o, --op  sum (default), prod, min, max, avg
//   -r, --root  the root of broadcast and reduce (default 0)
//   -b, -e, -f  sizes in bytes (K, M, G suffixes), default 8 B to 128 MiB, factor 2
//   -n, -w  timed and warm-up iterations per size (default 50 and 5)
//   -c 1    check the result once per size (all_reduce with sum; #wrong: elements that
//           differ, N/A where not checked)
//   -F      stdout as text (the table, the default), csv or json; -J FILE: JSON to FILE too
//
// A size is nccl-tests': the buffer of all_reduce, broadcast and reduce, the gathered buffer
// of all_gather, the input of reduce_scatter and all_to_all. time is the mean per op, the
// largest over the ranks; busbw uses nccl-tests' factors. Runs under a launcher (one rank per
// GPU), or alone as a world of one. Exits 77 where no CUDA device is visible.

#include <corocoll/corocoll.hpp>
#include <corocoll/gpu.hpp>

#include "common/args.hpp"
#include "common/bandwidth.hpp"
#include "common/report.hpp"
#include "redop.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
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
    int root = 0;
    perf::sweep sweep;
    std::string format = "text";
    std::string json_path;
};

config parse(int argc, char** argv) {
    config c;
    c.sweep.min_bytes = 8;
    c.sweep.max_bytes = std::size_t{128} << 20;
    c.sweep.iters = 50;
    perf::args a("gpu_coll_perf",
                 "NCCL collectives on GPU buffers through corocoll's NCCL group and through plain "
                 "NCCL calls, side by side, with nccl-tests' flag letters.\nExits 77 where no "
                 "CUDA device is visible.");
    a.one_of("--coll", c.op,
             {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all"},
             "the collective (nccl-tests picks it by program name)")
        .one_of("-d,--datatype", c.type,
                {"float", "double", "half", "bfloat16", "int32", "int64", "uint8"},
                "the element type")
        .one_of("-o,--op", c.redop, perf::redop_names(), "the reduction")
        .integer("-r,--root", c.root, 0, 1 << 20, "the root of broadcast and reduce");
    c.sweep.declare(a);
    a.one_of("-F,--format", c.format, {"text", "csv", "json"}, "what stdout carries")
        .text("-J,--output_file", c.json_path, "FILE", "also write the rows to FILE as JSON")
        .moved("-R", "the reduction is -o now, as in nccl-tests (the collective is --coll)");
    perf::parse_or_exit(a, argc, argv);
    return c;
}

// Plain NCCL: the call on the blocking communicator, then cudaStreamSynchronize.
void plain_wait(ncclComm_t comm, ncclResult_t rc, cudaStream_t s) {
    if (rc != ncclSuccess) throw std::runtime_error("NCCL: " + gpu::describe_nccl(rc, comm));
    gpu::check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

// The baseline's communicator: blocking (NCCL's default, what nccl-tests uses), over the same
// ranks and device as the group, its unique id broadcast through the CPU group.
cc::task<ncclComm_t> blocking_comm(cc::process_group& cpu, int device) {
    ncclUniqueId id{};
    if (cpu.rank() == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
        throw std::runtime_error("ncclGetUniqueId failed");
    }
    std::vector<std::uint8_t> bytes(sizeof id.internal);
    std::memcpy(bytes.data(), id.internal, bytes.size());
    co_await cpu.broadcast(bytes, 0);
    std::memcpy(id.internal, bytes.data(), bytes.size());
    ncclComm_t comm = nullptr;
    gpu::device_guard on(device);
    ncclResult_t rc = ncclCommInitRank(&comm, cpu.size(), id, cpu.rank());
    if (rc != ncclSuccess) {
        throw std::runtime_error("ncclCommInitRank: " + gpu::describe_nccl(rc, comm));
    }
    co_return comm;
}

template <class T>
struct runner {
    gpu::nccl_group& pg;
    ncclComm_t blocking;
    const config& c;

    // One op of `count` elements per rank-block: through the group, or plain.
    cc::task<> ours(gpu::device_buffer<T>& in, gpu::device_buffer<T>& out, std::size_t count) {
        auto op = perf::redop_of(c.redop);
        if (c.op == "all_reduce") co_return co_await pg.all_reduce(in, op);
        if (c.op == "broadcast") co_return co_await pg.broadcast(in, c.root);
        if (c.op == "reduce") co_return co_await pg.reduce(in, c.root, op);
        auto block = gpu::device_span<T>{in.data(), count};
        if (c.op == "all_gather") co_return co_await pg.all_gather_into(out, block);
        auto outblock = gpu::device_span<T>{out.data(), count};
        if (c.op == "reduce_scatter") co_return co_await pg.reduce_scatter_into(outblock, in, op);
        if (c.op == "all_to_all") co_return co_await pg.all_to_all_single(out, in);
        throw std::invalid_argument("unknown op '" + c.op + "'");
    }

    void plain(gpu::device_buffer<T>& in, gpu::device_buffer<T>& out, std::size_t count) {
        ncclComm_t comm = blocking;
        cudaStream_t s = pg.stream();
        ncclDataType_t t = gpu::nccl_type_of<T>();
        ncclRedOp_t op = gpu::nccl_op_of(perf::redop_of(c.redop), "");
        ncclResult_t rc = ncclSuccess;
        if (c.op == "all_reduce") {
            rc = ncclAllReduce(in.data(), in.data(), in.size(), t, op, comm, s);
        } else if (c.op == "broadcast") {
            rc = ncclBroadcast(in.data(), in.data(), in.size(), t, c.root, comm, s);
        } else if (c.op == "reduce") {
            rc = ncclReduce(in.data(), in.data(), in.size(), t, op, c.root, comm, s);
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

// The table's columns: the size, then each way's time and bandwidths, then the difference.
std::vector<perf::column_group> table_columns() {
    return {
        {"",
         {{"size", "(B)", 12},
          {"count", "(elements)", 12},
          {"type", "", 8},
          {"redop", "", 6},
          {"root", "", 5}}},
        {"corocoll (co_await)",
         {{"time", "(us)", 10}, {"algbw", "(GB/s)", 8}, {"busbw", "(GB/s)", 8}, {"#wrong", "", 6}}},
        {"plain NCCL (blocking, synchronize)",
         {{"time", "(us)", 10}, {"algbw", "(GB/s)", 8}, {"busbw", "(GB/s)", 8}}},
        {"", {{"diff", "(us)", 9}, {"ratio", "", 7}}}};
}

template <class T>
cc::task<> sweep(gpu::nccl_group& pg, ncclComm_t blocking, cc::process_group& cpu,
                 const config& c) {
    int n = pg.size();
    if (c.root >= n) {
        throw perf::usage_error("-r " + std::to_string(c.root) + ": not a rank of " +
                                std::to_string(n));
    }
    runner<T> run{pg, blocking, c};
    bool reduces = c.op == "all_reduce" || c.op == "reduce" || c.op == "reduce_scatter";
    bool rooted = c.op == "broadcast" || c.op == "reduce";
    std::optional<perf::report> out;
    if (pg.rank() == 0) {
        out.emplace(perf::format_of(c.format), c.json_path);
        char line[160];
        std::snprintf(line, sizeof line,
                      "gpu_coll_perf: %s, %d rank(s), device %d, %d iterations (+%d warm-up)",
                      c.op.c_str(), n, pg.device(), c.sweep.iters, c.sweep.warmup);
        out->comment(line);
        out->table(table_columns());
    }
    for (std::size_t bytes : c.sweep.sizes()) {
        bool blocks = c.op == "all_gather" || c.op == "reduce_scatter" || c.op == "all_to_all";
        std::size_t total = std::max<std::size_t>(bytes / sizeof(T), static_cast<std::size_t>(n));
        if (blocks) total -= total % static_cast<std::size_t>(n);
        std::size_t count = blocks ? total / static_cast<std::size_t>(n) : total;
        // all_gather's input is one block; the others' is the whole size.
        gpu::device_buffer<T> in(c.op == "all_gather" ? count : total);
        gpu::device_buffer<T> out_buf(c.op == "reduce_scatter" ? count : total);
        std::vector<T> ones(in.size(), T(1));
        in.copy_from(ones);

        for (int i = 0; i < c.sweep.warmup; ++i) co_await run.ours(in, out_buf, count);
        co_await pg.barrier();
        auto t0 = clock_type::now();
        for (int i = 0; i < c.sweep.iters; ++i) co_await run.ours(in, out_buf, count);
        double ours_us = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() /
                         c.sweep.iters;

        for (int i = 0; i < c.sweep.warmup; ++i) run.plain(in, out_buf, count);
        co_await pg.barrier();
        t0 = clock_type::now();
        for (int i = 0; i < c.sweep.iters; ++i) run.plain(in, out_buf, count);
        double plain_us =
            std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() /
            c.sweep.iters;

        long long wrong = -1;  // not checked
        if (c.sweep.check && c.op == "all_reduce" && c.redop == "sum") {
            // From ones: one all_reduce gives n everywhere (exact in every listed type).
            in.copy_from(ones);
            co_await run.ours(in, out_buf, count);
            std::vector<T> got(in.size());
            in.copy_to(got);
            wrong = 0;
            for (const T& v : got) wrong += static_cast<float>(v) != static_cast<float>(n);
        }
        // The slowest rank's times, as nccl-tests reports.
        std::vector<double> mine{ours_us, plain_us}, all(2 * static_cast<std::size_t>(n));
        co_await cpu.all_gather_into(all, mine);
        for (int p = 0; p < n; ++p) {
            ours_us = std::max(ours_us, all[2 * static_cast<std::size_t>(p)]);
            plain_us = std::max(plain_us, all[2 * static_cast<std::size_t>(p) + 1]);
        }
        if (out) {
            std::size_t size = total * sizeof(T);
            double a1 = perf::algbw_gbs(size, ours_us), a2 = perf::algbw_gbs(size, plain_us);
            double f = perf::bus_factor(c.op, n);
            perf::record fields = {{"op", c.op},
                                   {"ranks", n},
                                   {"size", size},
                                   {"count", total},
                                   {"type", c.type},
                                   {"redop", reduces ? c.redop : "none"},
                                   {"root", rooted ? c.root : -1},
                                   {"time_us", {ours_us, 2}},
                                   {"algbw_gbs", {a1, 2}},
                                   {"busbw_gbs", {a1 * f, 2}},
                                   {"wrong", wrong},
                                   {"nccl_time_us", {plain_us, 2}},
                                   {"nccl_algbw_gbs", {a2, 2}},
                                   {"nccl_busbw_gbs", {a2 * f, 2}},
                                   {"diff_us", {ours_us - plain_us, 2}},
                                   {"ratio", {ours_us / plain_us, 3}}};
            // The table has no op and ranks columns (the comment above it says them), and N/A
            // where nothing was checked.
            std::vector<perf::value> cells;
            for (std::size_t k = 2; k < fields.size(); ++k) {
                bool unchecked = fields[k].key == "wrong" && wrong < 0;
                cells.push_back(unchecked ? perf::value() : fields[k].v);
            }
            out->row(fields, cells);
        }
    }
    if (out) out->finish();
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
    ncclComm_t blocking = co_await blocking_comm(*cpu, pg->device());
    if (c.type == "float")
        co_await sweep<float>(*pg, blocking, *cpu, c);
    else if (c.type == "double")
        co_await sweep<double>(*pg, blocking, *cpu, c);
    else if (c.type == "half")
        co_await sweep<cc::float16>(*pg, blocking, *cpu, c);
    else if (c.type == "bfloat16")
        co_await sweep<cc::bfloat16>(*pg, blocking, *cpu, c);
    else if (c.type == "int32")
        co_await sweep<std::int32_t>(*pg, blocking, *cpu, c);
    else if (c.type == "int64")
        co_await sweep<std::int64_t>(*pg, blocking, *cpu, c);
    else if (c.type == "uint8")
        co_await sweep<std::uint8_t>(*pg, blocking, *cpu, c);
    else
        throw std::invalid_argument("unknown type '" + c.type + "'");
    (void)ncclCommFinalize(blocking);
    (void)ncclCommDestroy(blocking);
    co_await pg->close();
    co_await cpu->close();
    if (!path.empty()) std::remove(path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
    config c = parse(argc, argv);
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
