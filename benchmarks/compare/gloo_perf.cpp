// gloo_perf: coll_perf's measurements (benchmarks/coll_perf.cpp) made through Gloo's C++ API,
// so that run_compare.py can set Gloo beside corocoll without torch in between.
//
//   RANK=r WORLD_SIZE=n GLOO_PERF_STORE=DIR gloo_perf [--coll COLL] [-b MIN] [-e MAX]
//                                                   [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]
//
//   --coll  ping_pong (one-way time = round trip / 2, between ranks 0 and 1, through unbound
//           buffers), all_reduce (sum, in place), broadcast (root 0, in place), reduce (sum to
//           root 0, in place), all_gather (out of place), reduce_scatter (sum, in place:
//           gloo::ReduceScatterHalvingDoubling, the only reduce_scatter this Gloo has, leaves
//           each rank's part at the start of its input), gather (to root 0), scatter (from
//           root 0) or all_to_all (out of place, gloo::alltoall)
//   -b, -e, -f, -n, -w, -c  as coll_perf's (benchmarks/common/args.hpp); the type is float
//
// A size is coll_perf's (nccl-tests'): the buffer of ping_pong, all_reduce, broadcast and
// reduce; the whole gathered buffer of all_gather and gather; the whole input of
// reduce_scatter, scatter and all_to_all (each rank keeps size / n of reduce_scatter's and
// scatter's, and sends size / n of all_to_all's to each rank).
// reduce_scatter's timed iterations reduce what the last one left, as any in-place reduction
// does; only the checked run starts from fresh inputs.
//
// Ranks meet through a gloo::rendezvous::FileStore in DIR (empty, one per run) and talk over
// Gloo's TCP transport on 127.0.0.1. Sizes, element counts, timing (barrier, warm-up, barrier,
// timed loop, mean per iteration, largest over the ranks), checked values and the JSON rows on rank
// 0's stdout are coll_perf's with -d float -o sum -F json, written by the same code
// (benchmarks/common/, which is standard C++17 and needs no include path).
//
// Built with: g++ -std=c++17 -O2 gloo_perf.cpp -lgloo -pthread (Debian's libgloo-dev has no
// pkg-config file; its CMake config names only /usr/lib/libgloo.so).

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "../common/args.hpp"
#include "../common/bandwidth.hpp"
#include "../common/report.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
using reduce_fn = void (*)(void*, const void*, const void*, std::size_t);

enum class op {
    ping_pong,
    all_reduce,
    broadcast,
    reduce,
    all_gather,
    reduce_scatter,
    gather,
    scatter,
    all_to_all
};

// The ops whose size is split over the ranks (count elements per rank), as coll_perf's
// elements() splits them.
bool split(op o) {
    return o == op::all_gather || o == op::reduce_scatter || o == op::gather || o == op::scatter ||
           o == op::all_to_all;
}

struct config {
    op what = op::all_reduce;
    std::string name = "all_reduce";
    perf::sweep sweep;
};

// Tags keep the bookkeeping collectives apart from the measured ones.
constexpr std::uint32_t measured_tag = 0;
constexpr std::uint32_t bookkeeping_tag = 1;
// A slot prefix that none of Gloo's algorithms uses (theirs are 0x01..0x08, gloo/types.h).
constexpr std::uint8_t ping_pong_slot_prefix = 0x10;

config parse(int argc, char** argv) {
    config c;
    perf::args a("gloo_perf",
                 "coll_perf's measurements through Gloo's C++ API, for run_compare.py.\nRanks "
                 "come from RANK, WORLD_SIZE and GLOO_PERF_STORE (an empty directory).");
    a.one_of("--coll", c.name,
             {"ping_pong", "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
              "gather", "scatter", "all_to_all"},
             "the collective");
    c.sweep.declare(a);
    perf::parse_or_exit(a, argc, argv);
    const std::pair<const char*, op> names[] = {{"ping_pong", op::ping_pong},
                                                {"all_reduce", op::all_reduce},
                                                {"broadcast", op::broadcast},
                                                {"all_gather", op::all_gather},
                                                {"reduce_scatter", op::reduce_scatter},
                                                {"all_to_all", op::all_to_all},
                                                {"reduce", op::reduce},
                                                {"gather", op::gather},
                                                {"scatter", op::scatter}};
    for (const auto& [name, o] : names) {
        if (c.name == name) c.what = o;
    }
    return c;
}

int env_int(const char* name) {
    const char* v = std::getenv(name);
    if (v == nullptr)
        throw std::invalid_argument(std::string("environment variable ") + name + " is not set");
    return static_cast<int>(perf::parse_int(name, v, 0, 1 << 20));
}

// What rank r holds at element i: small integers, so sums are exact (coll_perf's value()).
float value(int r, std::size_t i) {
    return static_cast<float>((i + static_cast<std::size_t>(r)) % 4 + 1);
}

// The largest (or the sum) of one number over every rank, through Gloo's own all_reduce.
template <class T>
T all_reduce_one(const std::shared_ptr<gloo::Context>& context, T mine, reduce_fn fn) {
    gloo::AllreduceOptions opts(context);
    opts.setOutput(&mine, 1);
    opts.setReduceFunction(fn);
    opts.setTag(bookkeeping_tag);
    gloo::allreduce(opts);
    return mine;
}

// One op at one size: its buffers and its Gloo options, made once and run many times (as the
// buffers of coll_perf's bench are).
class bench {
public:
    bench(std::shared_ptr<gloo::Context> context, op what, std::size_t count)
        : context_(std::move(context)),
          what_(what),
          count_(count),
          n_(static_cast<std::size_t>(context_->size)),
          a_(what == op::reduce_scatter || what == op::scatter || what == op::all_to_all
                 ? count * n_
                 : count),
          b_(what == op::all_gather || what == op::gather || what == op::all_to_all ? count * n_
             : what == op::scatter                                                  ? count
                                                                                    : 0),
          all_reduce_(context_),
          broadcast_(context_),
          reduce_(context_),
          all_gather_(context_),
          gather_(context_),
          scatter_(context_),
          all_to_all_(context_) {
        switch (what_) {
            case op::ping_pong:
                ping_pong_ = context_->createUnboundBuffer(a_.data(), count_ * sizeof(float));
                break;
            case op::all_reduce:
                all_reduce_.setOutput(a_.data(), count_);  // no input: in place
                all_reduce_.setReduceFunction(static_cast<reduce_fn>(&gloo::sum<float>));
                all_reduce_.setTag(measured_tag);
                break;
            case op::broadcast:
                broadcast_.setOutput(a_.data(), count_);  // no input on the root: in place
                broadcast_.setRoot(0);
                broadcast_.setTag(measured_tag);
                break;
            case op::reduce:
                reduce_.setOutput(a_.data(), count_);  // no input: in place, as all_reduce
                reduce_.setRoot(0);
                reduce_.setReduceFunction(static_cast<reduce_fn>(&gloo::sum<float>));
                reduce_.setTag(measured_tag);
                break;
            case op::all_gather:
                all_gather_.setInput(a_.data(), count_);
                all_gather_.setOutput(b_.data(), b_.size());
                all_gather_.setTag(measured_tag);
                break;
            case op::gather:
                gather_.setInput(a_.data(), count_);
                if (context_->rank == 0) gather_.setOutput(b_.data(), b_.size());
                gather_.setRoot(0);
                gather_.setTag(measured_tag);
                break;
            case op::scatter:
                if (context_->rank == 0) {
                    std::vector<float*> blocks;
                    for (std::size_t r = 0; r < n_; ++r) blocks.push_back(a_.data() + r * count_);
                    scatter_.setInputs(blocks, count_);
                }
                scatter_.setOutput(b_.data(), count_);
                scatter_.setRoot(0);
                scatter_.setTag(measured_tag);
                break;
            case op::reduce_scatter:
                // Its constructor sets up its buffers with every peer: collective, once per size.
                reduce_scatter_ = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
                    context_, std::vector<float*>{a_.data()}, static_cast<int>(a_.size()),
                    std::vector<int>(n_, static_cast<int>(count_)));
                break;
            case op::all_to_all:
                all_to_all_.setInput(a_.data(), a_.size());
                all_to_all_.setOutput(b_.data(), b_.size());
                all_to_all_.setTag(measured_tag);
                break;
        }
    }

    void run_once() {
        switch (what_) {
            case op::ping_pong:
                ping_pong();
                break;
            case op::all_reduce:
                gloo::allreduce(all_reduce_);
                break;
            case op::broadcast:
                gloo::broadcast(broadcast_);
                break;
            case op::reduce:
                gloo::reduce(reduce_);
                break;
            case op::all_gather:
                gloo::allgather(all_gather_);
                break;
            case op::gather:
                gloo::gather(gather_);
                break;
            case op::scatter:
                gloo::scatter(scatter_);
                break;
            case op::reduce_scatter:
                reduce_scatter_->run();
                break;
            case op::all_to_all:
                gloo::alltoall(all_to_all_);
                break;
        }
    }

    // Mean time per operation on this rank, in microseconds.
    double time(const perf::sweep& c) {
        gloo::BarrierOptions barrier(context_);
        barrier.setTag(bookkeeping_tag);
        gloo::barrier(barrier);  // as coll_perf does, before the warm-up too
        for (int i = 0; i < c.warmup; ++i) run_once();
        gloo::barrier(barrier);
        auto t0 = clock_type::now();
        for (int i = 0; i < c.iters; ++i) run_once();
        std::chrono::duration<double, std::micro> took = clock_type::now() - t0;
        double per = took.count() / c.iters;
        return what_ == op::ping_pong ? per / 2 : per;
    }

    // Fills the inputs, runs once, and counts this rank's elements that are not what they
    // must be.
    long long check() {
        const int rank = context_->rank;
        for (std::size_t i = 0; i < a_.size(); ++i) a_[i] = input(i);
        std::fill(b_.begin(), b_.end(), 0.0f);
        run_once();
        if (what_ == op::ping_pong && rank > 1) return 0;  // not part of it
        // A reduce's or gather's result is the root's alone.
        if ((what_ == op::reduce || what_ == op::gather) && rank != 0) return 0;
        const std::vector<float>& result = b_.empty() ? a_ : b_;
        // reduce_scatter's part is the start of its input; the rest is Gloo's scratch.
        std::size_t size = what_ == op::reduce_scatter ? count_ : result.size();
        long long wrong = 0;
        for (std::size_t j = 0; j < size; ++j) {
            if (result[j] != expected(j)) ++wrong;
        }
        return wrong;
    }

private:
    void ping_pong() {
        const auto slot = gloo::Slot::build(ping_pong_slot_prefix, measured_tag);
        if (context_->rank == 0) {
            ping_pong_->send(1, slot);
            ping_pong_->waitSend();
            ping_pong_->recv(1, slot);
            ping_pong_->waitRecv();
        } else if (context_->rank == 1) {
            ping_pong_->recv(0, slot);
            ping_pong_->waitRecv();
            ping_pong_->send(0, slot);
            ping_pong_->waitSend();
        }
    }

    // What element i of this rank's input holds, as coll_perf fills it: rank 0's values only
    // for broadcast and ping_pong; for all_to_all, the part for rank d holds value(rank + 2d,
    // .), so that sender and receiver both show.
    float input(std::size_t i) const {
        const int rank = context_->rank;
        if (what_ == op::all_to_all) {
            return value(rank + 2 * static_cast<int>(i / count_), i % count_);
        }
        bool gives = what_ != op::broadcast && what_ != op::ping_pong;
        return gives || rank == 0 ? value(rank, i) : 0;
    }

    float sum_over_ranks(std::size_t i) const {
        float sum = 0;
        for (int r = 0; r < context_->size; ++r) sum += value(r, i);
        return sum;
    }

    // What element j of the result must hold (rank 0's values for broadcast and ping_pong).
    float expected(std::size_t j) const {
        const auto rank = static_cast<std::size_t>(context_->rank);
        switch (what_) {
            case op::all_reduce:
            case op::reduce:
                return sum_over_ranks(j);
            case op::reduce_scatter:
                return sum_over_ranks(rank * count_ + j);
            case op::all_gather:
            case op::gather:
                return value(static_cast<int>(j / count_), j % count_);
            case op::scatter:
                return value(0, rank * count_ + j);
            case op::all_to_all:
                return value(static_cast<int>(j / count_ + 2 * rank), j % count_);
            default:
                return value(0, j);
        }
    }

    std::shared_ptr<gloo::Context> context_;
    op what_;
    // Elements per rank: the part each rank gives (all_gather), keeps (reduce_scatter) or
    // exchanges with each rank (all_to_all).
    std::size_t count_;
    std::size_t n_;
    std::vector<float> a_;  // the input; count_ * n_ for reduce_scatter and all_to_all
    std::vector<float> b_;  // the output of all_gather and all_to_all, count_ * n_
    gloo::AllreduceOptions all_reduce_;
    gloo::BroadcastOptions broadcast_;
    gloo::ReduceOptions reduce_;
    gloo::AllgatherOptions all_gather_;
    gloo::GatherOptions gather_;
    gloo::ScatterOptions scatter_;
    gloo::AlltoallOptions all_to_all_;
    std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> reduce_scatter_;
    std::unique_ptr<gloo::transport::UnboundBuffer> ping_pong_;
};

int benchmark(const config& c) {
    const int rank = env_int("RANK");
    const int n = env_int("WORLD_SIZE");
    const char* store_dir = std::getenv("GLOO_PERF_STORE");
    if (store_dir == nullptr) throw std::invalid_argument("GLOO_PERF_STORE is not set");
    if (c.what == op::ping_pong && n < 2) throw std::invalid_argument("ping_pong needs 2 ranks");

    gloo::transport::tcp::attr loopback("127.0.0.1");
    auto device = gloo::transport::tcp::CreateDevice(loopback);
    gloo::rendezvous::FileStore store(store_dir);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, n);
    context->connectFullMesh(store, device);

    long long wrong_total = 0;
    std::optional<perf::report> out;
    if (rank == 0) out.emplace(perf::format::json);
    for (std::size_t bytes : c.sweep.sizes()) {
        std::size_t parts = split(c.what) ? static_cast<std::size_t>(n) : 1;
        std::size_t count = bytes / sizeof(float) / parts;
        if (count == 0) continue;
        bench b(context, c.what, count);
        // The bytes actually moved, as coll_perf reports them.
        std::size_t moved = count * sizeof(float) * parts;
        double time_us =
            all_reduce_one(context, b.time(c.sweep), static_cast<reduce_fn>(&gloo::max<double>));
        long long wrong = -1;
        if (c.sweep.check) {
            wrong =
                all_reduce_one(context, b.check(), static_cast<reduce_fn>(&gloo::sum<long long>));
            wrong_total += wrong;
        }
        double algbw = perf::algbw_gbs(moved, time_us);
        if (out) {
            bool in_place = c.what == op::all_reduce || c.what == op::broadcast ||
                            c.what == op::reduce || c.what == op::reduce_scatter;
            bool reduces =
                c.what == op::all_reduce || c.what == op::reduce || c.what == op::reduce_scatter;
            bool rooted = c.what == op::broadcast || c.what == op::reduce || c.what == op::gather ||
                          c.what == op::scatter;
            out->row({{"op", c.name},
                      {"ranks", n},
                      {"size", moved},
                      {"count", count},
                      {"type", "float"},
                      {"redop", reduces ? "sum" : "none"},
                      {"root", rooted ? 0 : -1},
                      {"placement", in_place ? "in-place" : "out-of-place"},
                      {"time_us", {time_us, 3}},
                      {"algbw_gbs", {algbw, 4}},
                      {"busbw_gbs", {algbw * perf::bus_factor(c.name, n), 4}},
                      {"wrong", wrong}});
        }
    }
    if (out) out->finish();
    return wrong_total > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
    config c = parse(argc, argv);
    try {
        return benchmark(c);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "gloo_perf: %s\n", e.what());
        return 1;
    }
}
