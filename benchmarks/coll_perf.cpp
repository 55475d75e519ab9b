// coll_perf: collective and point-to-point timings in the style of nccl-tests, with its flag
// letters and long names.
//
//   coll_perf [--coll COLL] [-d TYPE] [-o REDOP] [-r ROOT] [--algo ALGORITHM] [-b MIN] [-e MAX]
//             [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1] [-F text|csv|json] [-J FILE]
//             [--stats 0|1] [--nproc N]
//
//   --coll  the collective: all_reduce (default), broadcast, reduce, all_gather, reduce_scatter,
//           gather, scatter, all_to_all, ping_pong (one-way time = round trip / 2, between
//           ranks 0 and 1), several with commas, or all. nccl-tests picks it by program name
//           (all_reduce_perf, ...) and uses every letter for something else, so it has no
//           letter here; --op is nccl-tests' long name for -o, the reduction.
//   -d, --datatype  int8, uint8, int16, uint16, int32, uint32, int64, uint64, float (default),
//                   double, half, bfloat16, bool, complex64, complex128, or all (a
//                   reduction a type lacks, such as max of complex64, is skipped)
//   -o, --op  sum (default), prod, min, max, avg, or all (reducing collectives only)
//   -r, --root  the root of broadcast, reduce, gather and scatter (default 0)
//   --algo  force an algorithm (ring, recursive_doubling, binomial, chain, bruck, linear,
//           pairwise, dissemination); default: corocoll's choice by size. (nccl-tests' -a is
//           how times are combined over ranks; here they are always the largest.)
//   -b, -e, -f  sizes from MIN to MAX bytes, each the last times FACTOR (K, M, G suffixes;
//               --minbytes, --maxbytes, --stepfactor)
//   -n, -w  timed iterations and warm-up iterations per size (default 20 and 5)
//   -c 1    check every result exactly (tolerance for avg on floating types); #wrong counts
//           the elements that differ on any rank, and the exit code is 1 if any does
//   -F      stdout as text (nccl-tests' table, the default), csv or json (the same rows)
//   -J, --output_file  also write the rows as JSON to FILE (rank 0 writes it, so a
//           launcher's rank prefixes never break it)
//   --stats 1  every rank writes to stderr, for each size, what its reactor did in the timed
//           loop (turns, polls, yields, sleeps, ...: io::reactor_stats) and how many of its
//           collectives ran at once: one line per rank and size, beginning "coll_perf stats:"
//           (which side of a rooted call waits for the other, in one command)
//
// The letters coll_perf used before it took nccl-tests' (-t type, -R reduction, -a algorithm)
// are refused with a message naming the new ones.
//
// A size is what nccl-tests calls it: the buffer of all_reduce, broadcast, reduce and
// ping_pong; the whole gathered buffer of all_gather and gather; the whole input of
// reduce_scatter, scatter and all_to_all. time is the mean over the iterations, the largest
// over the ranks; algbw = size / time; busbw = algbw times nccl-tests' factor
// (benchmarks/common/bandwidth.hpp). corocoll's all_reduce, broadcast and reduce work in place
// and the others out of place, so each row has one of the two column groups and N/A in the
// other. Rows are written as each size is measured (benchmarks/common/report.hpp); in CSV and
// JSON the field "op" is the collective and "redop" the reduction.
//
// At the end, after nccl-tests' two summary lines, a "Cliffs" line: none, or one line per size
// that took more than twice as long as the next larger size of its sweep (a wait that should
// not be there; the ~500 us of issue 32 were such). It is a report, not a check: the exit code
// does not depend on times.
//
// Runs under corocollrun, torchrun or mpirun (one rank per process), or spawns --nproc ranks.

#include <corocoll/corocoll.hpp>

#include "common/args.hpp"
#include "common/bandwidth.hpp"
#include "common/report.hpp"
#include "redop.hpp"

// std::vector<bool> packs bits and is no buffer: bool runs through this container.
#include "../tests/support/bool_vector.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cc = corocoll;
using clock_type = std::chrono::steady_clock;

namespace {

const std::vector<std::string> all_colls = {"all_reduce", "broadcast",      "reduce",
                                            "all_gather", "reduce_scatter", "gather",
                                            "scatter",    "all_to_all",     "ping_pong"};
const std::vector<std::string> all_types = {
    "int8",  "uint8",  "int16", "uint16",   "int32", "uint32",    "int64",     "uint64",
    "float", "double", "half",  "bfloat16", "bool",  "complex64", "complex128"};

template <class T>
using vec = corocoll_test::vector_of<T>;

struct config {
    std::vector<std::string> colls{"all_reduce"};
    std::vector<std::string> types{"float"};
    std::vector<std::string> redops{"sum"};
    std::string algorithm;
    perf::sweep sweep;
    int root = 0;
    std::string format = "text";
    std::string json_path;
    bool stats = false;
    int nproc = 2;
};

// What this rank's reactor and group did over a timed loop (`--stats`).
struct loop_counts {
    cc::io::reactor_stats reactor;
    std::uint64_t at_once = 0;
};

loop_counts counts_of(const cc::process_group& pg) {
    return {pg.reactor().stats(), pg.calls_run_at_once()};
}

// `after` less `before`, field by field.
loop_counts operator-(const loop_counts& after, const loop_counts& before) {
    const auto& a = after.reactor;
    const auto& b = before.reactor;
    loop_counts d;
    d.reactor.turns = a.turns - b.turns;
    d.reactor.polls = a.polls - b.polls;
    d.reactor.yields = a.yields - b.yields;
    d.reactor.kernel_waits = a.kernel_waits - b.kernel_waits;
    d.reactor.enters = a.enters - b.enters;
    d.reactor.watched_sleeps = a.watched_sleeps - b.watched_sleeps;
    d.reactor.futex_sleeps = a.futex_sleeps - b.futex_sleeps;
    d.reactor.fenced_sleeps = a.fenced_sleeps - b.fenced_sleeps;
    d.reactor.moves = a.moves - b.moves;
    d.reactor.wakeups = a.wakeups - b.wakeups;
    d.at_once = after.at_once - before.at_once;
    return d;
}

bool reduces(const std::string& op) {
    return op == "all_reduce" || op == "reduce" || op == "reduce_scatter";
}
bool in_place(const std::string& op) {
    return op == "all_reduce" || op == "broadcast" || op == "reduce";
}
bool rooted(const std::string& op) {
    return op == "broadcast" || op == "reduce" || op == "gather" || op == "scatter";
}

// How many elements of the size each rank's buffers hold, as nccl-tests counts them.
std::size_t elements(const std::string& op, std::size_t bytes, std::size_t elem, int n) {
    std::size_t count = bytes / elem;
    bool split = op == "all_gather" || op == "reduce_scatter" || op == "gather" ||
                 op == "scatter" || op == "all_to_all";
    return split ? count / static_cast<std::size_t>(n) : count;
}

std::optional<cc::collectives::collective_kind> kind_of(const std::string& op) {
    using k = cc::collectives::collective_kind;
    if (op == "all_reduce") return k::all_reduce;
    if (op == "broadcast") return k::broadcast;
    if (op == "reduce") return k::reduce;
    if (op == "all_gather") return k::all_gather;
    if (op == "reduce_scatter") return k::reduce_scatter;
    if (op == "gather") return k::gather;
    if (op == "scatter") return k::scatter;
    if (op == "all_to_all") return k::all_to_all;
    return std::nullopt;
}

// Every algorithm --algo can force.
constexpr cc::collectives::algorithm forcible_algorithms[] = {
    cc::collectives::algorithm::ring,         cc::collectives::algorithm::recursive_doubling,
    cc::collectives::algorithm::binomial,     cc::collectives::algorithm::chain,
    cc::collectives::algorithm::bruck,        cc::collectives::algorithm::linear,
    cc::collectives::algorithm::pairwise,     cc::collectives::algorithm::dissemination,
    cc::collectives::algorithm::hierarchical, cc::collectives::algorithm::shm};

cc::collectives::algorithm algorithm_of(const std::string& s) {
    for (auto x : forcible_algorithms) {
        if (s == cc::collectives::algorithm_name(x)) return x;
    }
    throw perf::usage_error("--algo " + s + ": not an algorithm corocoll has");
}

// ---- values: small integers, so that sums, products, minima and maxima are exact in every
// type (bfloat16 holds integers exactly up to 256) ----

// What rank `r` contributes at element `i` for `redop` (every op but product).
double value(int r, std::size_t i) {
    return static_cast<double>((i + static_cast<std::size_t>(r)) % 4 + 1);
}

// For product: 2 at the elements that are "rank r's", 1 elsewhere, so the product is 2.
double product_value(int r, std::size_t i, int n) {
    return i % static_cast<std::size_t>(n) == static_cast<std::size_t>(r) ? 2.0 : 1.0;
}

double contribution(const std::string& redop, int r, std::size_t i, int n) {
    return redop == "prod" ? product_value(r, i, n) : value(r, i);
}

// The reduction of every rank's contribution at element `i`.
template <class T>
double reduced(const std::string& redop, std::size_t i, int n) {
    double acc = contribution(redop, 0, i, n);
    for (int r = 1; r < n; ++r) {
        double v = contribution(redop, r, i, n);
        if (redop == "sum" || redop == "avg") acc += v;
        if (redop == "prod") acc *= v;
        if (redop == "min") acc = std::min(acc, v);
        if (redop == "max") acc = std::max(acc, v);
    }
    if (redop == "avg") {
        if constexpr (std::is_integral_v<T>) {
            // Integer avg truncates, as corocoll's kernel (and torch's) does.
            long long truncated = static_cast<long long>(acc) / n;
            acc = static_cast<double>(truncated);
        } else {
            acc /= n;
        }
    }
    return acc;
}

// Complex values are real numbers (v, 0): the checks stay those of the reals; bool is v != 0.
template <class T>
T make(double v) {
    if constexpr (std::is_same_v<T, cc::float16> || std::is_same_v<T, cc::bfloat16>) {
        return T(static_cast<float>(v));
    } else if constexpr (cc::detail::is_complex_v<T>) {
        return T(static_cast<typename T::value_type>(v), 0);
    } else if constexpr (std::is_same_v<T, bool>) {
        return v != 0;
    } else {
        return static_cast<T>(v);
    }
}

template <class T>
double read(T v) {
    if constexpr (std::is_same_v<T, cc::float16> || std::is_same_v<T, cc::bfloat16>) {
        return static_cast<double>(static_cast<float>(v));
    } else if constexpr (cc::detail::is_complex_v<T>) {
        return v.imag() == 0 ? static_cast<double>(v.real()) : NAN;
    } else {
        return static_cast<double>(v);
    }
}

template <class T>
bool same(double got, double want) {
    if constexpr (std::is_same_v<T, bool>) {
        return (got != 0) == (want != 0);  // sum and max are or, product and min are and
    } else if constexpr (std::is_integral_v<T>) {
        return got == want;
    } else if constexpr (cc::detail::is_complex_v<T>) {
        return same<typename T::value_type>(got, want);
    } else {
        // Exact for every op but avg, whose quotient rounds in T.
        double tol = std::is_same_v<T, double> ? 1e-12 : std::is_same_v<T, float> ? 1e-6 : 1e-2;
        return std::abs(got - want) <= tol * std::max(1.0, std::abs(want));
    }
}

struct row {
    std::string op;
    std::size_t bytes = 0;
    std::size_t count = 0;
    std::string type;
    std::string redop;
    int root = -1;
    bool in_place = false;
    double time_us = 0;
    double algbw = 0;
    double busbw = 0;
    long long wrong = -1;  // -1: not checked
};

// One collective at one size, with its buffers.
template <class T>
class bench {
public:
    bench(cc::process_group& pg, const config& c, std::string op, std::string redop,
          std::size_t count)
        : pg_(pg),
          c_(c),
          op_(std::move(op)),
          redop_(std::move(redop)),
          count_(count),
          n_(pg.size()),
          rank_(pg.rank()) {
        auto nz = static_cast<std::size_t>(n_);
        if (op_ == "all_reduce" || op_ == "broadcast" || op_ == "reduce" || op_ == "ping_pong") {
            a_.resize(count_);
        } else if (op_ == "all_gather") {
            a_.resize(count_);
            b_.resize(count_ * nz);
        } else if (op_ == "reduce_scatter" || op_ == "all_to_all") {
            a_.resize(count_ * nz);
            b_.resize(count_ * (op_ == "all_to_all" ? nz : 1));
        } else if (op_ == "gather") {
            a_.resize(count_);
            b_.resize(rank_ == c_.root ? count_ * nz : 0);
        } else if (op_ == "scatter") {
            a_.resize(rank_ == c_.root ? count_ * nz : 0);
            b_.resize(count_);
        }
        const std::pair<const char*, which> names[] = {{"all_reduce", which::all_reduce},
                                                       {"broadcast", which::broadcast},
                                                       {"reduce", which::reduce},
                                                       {"all_gather", which::all_gather},
                                                       {"reduce_scatter", which::reduce_scatter},
                                                       {"gather", which::gather},
                                                       {"scatter", which::scatter},
                                                       {"all_to_all", which::all_to_all},
                                                       {"ping_pong", which::ping_pong}};
        for (const auto& [name, w] : names) {
            if (op_ == name) which_ = w;
        }
        if (reduces(op_)) red_ = perf::redop_of(redop_);
    }

    // The timed loop: which operation is decided once, in the constructor, and each case
    // awaits its collective straight from its own loop, as a user's loop does, with no
    // coroutine of the harness's own per call.
    cc::task<> run(int times) {
        switch (which_) {
            case which::all_reduce:
                for (int i = 0; i < times; ++i) co_await pg_.all_reduce(a_, red_);
                break;
            case which::broadcast:
                for (int i = 0; i < times; ++i) co_await pg_.broadcast(a_, c_.root);
                break;
            case which::reduce:
                for (int i = 0; i < times; ++i) co_await pg_.reduce(a_, c_.root, red_);
                break;
            case which::all_gather:
                for (int i = 0; i < times; ++i) co_await pg_.all_gather_into(b_, a_);
                break;
            case which::reduce_scatter:
                for (int i = 0; i < times; ++i) co_await pg_.reduce_scatter_into(b_, a_, red_);
                break;
            case which::gather:
                for (int i = 0; i < times; ++i) co_await pg_.gather_into(a_, b_, c_.root);
                break;
            case which::scatter:
                for (int i = 0; i < times; ++i) co_await pg_.scatter_from(b_, a_, c_.root);
                break;
            case which::all_to_all:
                for (int i = 0; i < times; ++i) co_await pg_.all_to_all_single(b_, a_);
                break;
            case which::ping_pong:
                for (int i = 0; i < times; ++i) {
                    if (rank_ == 0) {
                        co_await pg_.send(a_, 1);
                        co_await pg_.recv(a_, 1);
                    } else if (rank_ == 1) {
                        co_await pg_.recv(a_, 0);
                        co_await pg_.send(a_, 0);
                    }
                }
                break;
        }
    }

    // Mean time per operation on this rank, in microseconds.
    // A barrier first: where connections open on first use, the barrier's own may still be
    // opening on some ranks when others leave it, and a timed loop that begins then pays for
    // them (4 ranks: 9 ms in the first size's 20 calls). Opened here, the second barrier lets
    // the ranks go together.
    cc::task<double> time() {
        co_await pg_.barrier();
        co_await run(c_.sweep.warmup);
        co_await pg_.barrier();
        const loop_counts before = counts_of(pg_);
        auto t0 = clock_type::now();
        co_await run(c_.sweep.iters);
        std::chrono::duration<double, std::micro> took = clock_type::now() - t0;
        counted_ = counts_of(pg_) - before;
        double per = took.count() / std::max(1, c_.sweep.iters);
        co_return op_ == "ping_pong" ? per / 2 : per;
    }

    // What this rank's reactor and group did in the last `time`'s timed loop.
    const loop_counts& counted() const noexcept { return counted_; }

    // Fills the inputs, runs once, and counts the elements that differ from what they must be.
    cc::task<long long> check() {
        fill();
        co_await run(1);
        co_return verify();
    }

private:
    void fill() {
        auto set = [](vec<T>& v, auto f) {
            for (std::size_t i = 0; i < v.size(); ++i) v[i] = make<T>(f(i));
        };
        std::fill(b_.begin(), b_.end(), make<T>(0));
        if (op_ == "all_reduce" || op_ == "reduce" || op_ == "reduce_scatter") {
            set(a_, [&](std::size_t i) { return contribution(redop_, rank_, i, n_); });
        } else if (op_ == "broadcast") {
            set(a_, [&](std::size_t i) { return rank_ == c_.root ? value(rank_, i) : 0.0; });
        } else if (op_ == "all_gather" || op_ == "gather") {
            set(a_, [&](std::size_t i) { return value(rank_, i); });
        } else if (op_ == "scatter") {
            // The part for rank d holds value(d, i).
            set(a_, [&](std::size_t j) { return value(static_cast<int>(j / count_), j % count_); });
        } else if (op_ == "all_to_all") {
            // The part for rank d holds value(rank + d, i): sender and receiver both show.
            set(a_, [&](std::size_t j) {
                return value(rank_ + 2 * static_cast<int>(j / count_), j % count_);
            });
        } else if (op_ == "ping_pong") {
            set(a_, [&](std::size_t i) { return rank_ == 0 ? value(0, i) : 0.0; });
        }
    }

    long long verify() const {
        long long wrong = 0;
        auto expect = [&](const vec<T>& v, auto f) {
            for (std::size_t i = 0; i < v.size(); ++i) {
                if (!same<T>(read(v[i]), f(i))) ++wrong;
            }
        };
        if (op_ == "all_reduce" || (op_ == "reduce" && rank_ == c_.root)) {
            expect(a_, [&](std::size_t i) { return reduced<T>(redop_, i, n_); });
        } else if (op_ == "reduce") {
            // Other ranks' buffers are left as they were.
            expect(a_, [&](std::size_t i) { return contribution(redop_, rank_, i, n_); });
        } else if (op_ == "reduce_scatter") {
            std::size_t first = static_cast<std::size_t>(rank_) * count_;
            expect(b_, [&](std::size_t i) { return reduced<T>(redop_, first + i, n_); });
        } else if (op_ == "broadcast") {
            expect(a_, [&](std::size_t i) { return value(c_.root, i); });
        } else if (op_ == "all_gather" || (op_ == "gather" && rank_ == c_.root)) {
            expect(b_,
                   [&](std::size_t j) { return value(static_cast<int>(j / count_), j % count_); });
        } else if (op_ == "scatter") {
            expect(b_, [&](std::size_t i) { return value(rank_, i); });
        } else if (op_ == "all_to_all") {
            expect(b_, [&](std::size_t j) {
                return value(static_cast<int>(j / count_) + 2 * rank_, j % count_);
            });
        } else if (op_ == "ping_pong" && rank_ <= 1) {
            expect(a_, [&](std::size_t i) { return value(0, i); });
        }
        return wrong;
    }

    cc::process_group& pg_;
    const config& c_;
    loop_counts counted_;
    std::string op_;
    std::string redop_;
    enum class which {
        all_reduce,
        broadcast,
        reduce,
        all_gather,
        reduce_scatter,
        gather,
        scatter,
        all_to_all,
        ping_pong
    };
    which which_ = which::all_reduce;
    cc::reduce_op red_ = cc::reduce_op::sum;
    std::size_t count_;
    int n_;
    int rank_;
    vec<T> a_;
    vec<T> b_;
};

// What every row so far adds up to, for the footer and the exit code.
struct totals {
    long long wrong = 0;
    double busbw = 0;
    int rows = 0;
    // Sizes that cost more than `cliff_factor` times the next larger size of the same sweep
    // (one line each, for the report's end).
    std::vector<std::string> cliffs;
};

// A size that takes this many times as long as the next larger one is a cliff: more bytes
// never cost less but for noise, so something waits (a timer, a sleep) where it should not.
constexpr double cliff_factor = 2.0;

// The text table's columns: nccl-tests' out-of-place and in-place groups.
std::vector<perf::column_group> table_columns() {
    auto measured = [](std::string banner) {
        return perf::column_group{std::move(banner),
                                  {{"time", "(us)", 9},
                                   {"algbw", "(GB/s)", 8},
                                   {"busbw", "(GB/s)", 8},
                                   {"#wrong", "", 7}}};
    };
    return {{"",
             {{"size", "(B)", 12},
              {"count", "(elements)", 12},
              {"type", "", 8},
              {"redop", "", 6},
              {"root", "", 5}}},
            measured("out-of-place"),
            measured("in-place")};
}

void write(perf::report& out, const row& r, int n) {
    perf::record fields = {{"op", r.op},
                           {"ranks", n},
                           {"size", r.bytes},
                           {"count", r.count},
                           {"type", r.type},
                           {"redop", r.redop},
                           {"root", r.root},
                           {"placement", r.in_place ? "in-place" : "out-of-place"},
                           {"time_us", {r.time_us, 3}},
                           {"algbw_gbs", {r.algbw, 4}},
                           {"busbw_gbs", {r.busbw, 4}},
                           {"wrong", r.wrong}};
    std::vector<perf::value> measured = {{r.time_us, 2},
                                         {r.algbw, 3},
                                         {r.busbw, 3},
                                         r.wrong < 0 ? perf::value() : perf::value(r.wrong)};
    std::vector<perf::value> cells = {r.bytes, r.count, r.type, r.redop, r.root};
    for (int group = 0; group < 2; ++group) {
        bool here = (group == 1) == r.in_place;
        for (const auto& v : measured) cells.push_back(here ? v : perf::value());
    }
    out.row(fields, cells);
}

// One line on stderr with what this rank's loop did over `iters` calls of `op` (`--stats`),
// written at once so that the ranks' lines do not mix.
void write_counts(const cc::process_group& pg, const std::string& op, std::size_t bytes, int iters,
                  const loop_counts& d) {
    const auto& s = d.reactor;
    auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
    char line[512];
    std::snprintf(line, sizeof line,
                  "coll_perf stats: rank %d %s %zu B iters %d: turns %llu polls %llu yields %llu "
                  "kernel_waits %llu enters %llu watched_sleeps %llu futex_sleeps %llu "
                  "fenced_sleeps %llu moves %llu wakeups %llu at_once %llu\n",
                  pg.rank(), op.c_str(), bytes, iters, u(s.turns), u(s.polls), u(s.yields),
                  u(s.kernel_waits), u(s.enters), u(s.watched_sleeps), u(s.futex_sleeps),
                  u(s.fenced_sleeps), u(s.moves), u(s.wakeups), u(d.at_once));
    std::fputs(line, stderr);
}

// Every size of one collective, type and reduction; each row is written (on rank 0, where
// `out` is) as soon as it is measured.
template <class T>
cc::task<> sweep(cc::process_group& pg, const config& c, const std::string& op,
                 const std::string& type, const std::string& redop, perf::report* out,
                 totals& sum) {
    const int n = pg.size();
    if (reduces(op) && !cc::op_supported(perf::redop_of(redop), cc::dtype_of<T>)) co_return;
    std::optional<row> last;
    for (std::size_t bytes : c.sweep.sizes()) {
        std::size_t count = elements(op, bytes, sizeof(T), n);
        if (count == 0) continue;  // too small to give every rank an element
        bench<T> b(pg, c, op, redop, count);
        row r;
        r.op = op;
        r.count = count;
        // The bytes actually moved: a size that does not split evenly over the ranks is cut.
        r.bytes =
            count * sizeof(T) * (bytes / sizeof(T) == count ? 1 : static_cast<std::size_t>(n));
        r.type = type;
        r.redop = reduces(op) ? redop : "none";
        r.root = rooted(op) ? c.root : -1;
        r.in_place = in_place(op);
        double mine = co_await b.time();
        if (c.stats) write_counts(pg, op, r.bytes, c.sweep.iters, b.counted());
        std::vector<double> t(1, mine);
        co_await pg.all_reduce(t, cc::reduce_op::max);
        r.time_us = t[0];
        r.algbw = perf::algbw_gbs(r.bytes, r.time_us);
        r.busbw = r.algbw * perf::bus_factor(op, n);
        if (c.sweep.check) {
            long long mine_wrong = co_await b.check();
            std::vector<std::int64_t> wrong(1, mine_wrong);
            co_await pg.all_reduce(wrong, cc::reduce_op::sum);
            r.wrong = wrong[0];
            sum.wrong += r.wrong;
        }
        sum.busbw += r.busbw;
        ++sum.rows;
        if (out != nullptr) write(*out, r, n);
        if (last && last->bytes < r.bytes && last->time_us > cliff_factor * r.time_us) {
            char line[240];
            std::snprintf(line, sizeof line,
                          "Cliff: %s %s%s%s on %d ranks: %zu B take %.2f us, %.1fx the %.2f us "
                          "of %zu B",
                          op.c_str(), type.c_str(), reduces(op) ? " " : "",
                          reduces(op) ? redop.c_str() : "", n, last->bytes, last->time_us,
                          last->time_us / r.time_us, r.time_us, r.bytes);
            sum.cliffs.emplace_back(line);
        }
        last = r;
    }
}

cc::task<> sweep_type(cc::process_group& pg, const config& c, const std::string& op,
                      const std::string& type, const std::string& redop, perf::report* out,
                      totals& sum) {
    if (type == "int8") return sweep<std::int8_t>(pg, c, op, type, redop, out, sum);
    if (type == "uint8") return sweep<std::uint8_t>(pg, c, op, type, redop, out, sum);
    if (type == "int16") return sweep<std::int16_t>(pg, c, op, type, redop, out, sum);
    if (type == "uint16") return sweep<std::uint16_t>(pg, c, op, type, redop, out, sum);
    if (type == "uint32") return sweep<std::uint32_t>(pg, c, op, type, redop, out, sum);
    if (type == "uint64") return sweep<std::uint64_t>(pg, c, op, type, redop, out, sum);
    if (type == "bool") return sweep<bool>(pg, c, op, type, redop, out, sum);
    if (type == "complex64") return sweep<std::complex<float>>(pg, c, op, type, redop, out, sum);
    if (type == "complex128") {
        return sweep<std::complex<double>>(pg, c, op, type, redop, out, sum);
    }
    if (type == "int32") return sweep<std::int32_t>(pg, c, op, type, redop, out, sum);
    if (type == "int64") return sweep<std::int64_t>(pg, c, op, type, redop, out, sum);
    if (type == "float") return sweep<float>(pg, c, op, type, redop, out, sum);
    if (type == "double") return sweep<double>(pg, c, op, type, redop, out, sum);
    if (type == "half") return sweep<cc::float16>(pg, c, op, type, redop, out, sum);
    return sweep<cc::bfloat16>(pg, c, op, type, redop, out, sum);
}

cc::task<> benchmark(cc::process_group& pg, const config& c) {
    const int n = pg.size();
    if (c.root >= n) {
        throw perf::usage_error("-r " + std::to_string(c.root) + ": not a rank of " +
                                std::to_string(n));
    }
    // Rank 0 reports; the others only measure.
    std::optional<perf::report> out;
    if (pg.rank() == 0) out.emplace(perf::format_of(c.format), c.json_path);
    perf::report* report = out ? &*out : nullptr;
    totals sum;
    for (const auto& op : c.colls) {
        if (op == "ping_pong" && n < 2) continue;
        if (!c.algorithm.empty()) {
            if (auto k = kind_of(op)) pg.set_algorithm(*k, algorithm_of(c.algorithm));
        }
        if (report != nullptr) {
            char line[512];
            std::snprintf(line, sizeof line,
                          "corocoll coll_perf: %s on %d ranks, iters %d, warm-up %d, check %d, "
                          "algorithm %s",
                          op.c_str(), n, c.sweep.iters, c.sweep.warmup, c.sweep.check ? 1 : 0,
                          c.algorithm.empty() ? "auto" : c.algorithm.c_str());
            report->comment(line);
            const auto& t = pg.size_thresholds();
            std::snprintf(line, sizeof line,
                          "caches %s; 2-rank arena thresholds: all_reduce's ring from %zu KiB "
                          "below %zu KiB, all_gather's from %zu KiB below %zu KiB, single-copy "
                          "broadcast by tree from %zu KiB, gather below %zu KiB; broadcast and "
                          "scatter by one message from %zu B (gather: %zu B) below %zu KiB; "
                          "3-8 ranks: gather and scatter through the arena below %zu KiB",
                          cc::describe(cc::machine_cache_sizes()).c_str(),
                          t.shm_pair_all_reduce_ring_from >> 10,
                          t.shm_pair_all_reduce_ring_below >> 10, t.shm_pair_ring_from >> 10,
                          t.shm_pair_ring_below >> 10, t.shm_pair_single_copy_tree_from >> 10,
                          t.shm_pair_rooted_below >> 10, t.shm_pair_message_from,
                          t.shm_pair_gather_message_from, t.shm_pair_message_below >> 10,
                          t.shm_rooted_below >> 10);
            report->comment(line);
            report->comment("");
            report->table(table_columns());
        }
        for (const auto& type : c.types) {
            std::vector<std::string> redops(1, "sum");
            if (reduces(op)) redops = c.redops;
            for (const auto& redop : redops) {
                co_await sweep_type(pg, c, op, type, redop, report, sum);
            }
        }
        if (!c.algorithm.empty()) {
            if (auto k = kind_of(op)) {
                pg.set_algorithm(*k, cc::collectives::algorithm::automatic);
            }
        }
    }
    if (report != nullptr) {
        char line[80];
        std::snprintf(line, sizeof line, "Out of bounds values : %lld %s", sum.wrong,
                      !c.sweep.check   ? "(not checked)"
                      : sum.wrong == 0 ? "OK"
                                       : "FAILED");
        report->comment(line);
        std::snprintf(line, sizeof line, "Avg bus bandwidth    : %.4f",
                      sum.rows == 0 ? 0.0 : sum.busbw / sum.rows);
        report->comment(line);
        // A size slower than twice the next one is flagged, never hidden in the table.
        if (sum.cliffs.empty()) {
            std::snprintf(line, sizeof line,
                          "Cliffs               : none (no size over %.0fx "
                          "the next)",
                          cliff_factor);
            report->comment(line);
        }
        for (const auto& cliff : sum.cliffs) {
            report->comment(cliff);
            // CSV and JSON carry rows only: their readers see cliffs on stderr.
            if (perf::format_of(c.format) != perf::format::text) {
                std::fprintf(stderr, "coll_perf: %s\n", cliff.c_str());
            }
        }
        report->finish();
    }
    if (sum.wrong > 0) {
        throw std::runtime_error(std::to_string(sum.wrong) + " wrong element(s) in the check");
    }
}

config parse(int argc, char** argv) {
    config c;
    std::vector<std::string> algorithms;
    for (auto a : forcible_algorithms) {
        algorithms.emplace_back(cc::collectives::algorithm_name(a));
    }
    perf::args a("coll_perf",
                 "Times corocoll's collectives and a ping-pong as nccl-tests does, with its flag "
                 "letters.\nRuns under corocollrun, torchrun or mpirun, or spawns --nproc ranks.");
    a.some_of("--coll", c.colls, all_colls, "the collective (nccl-tests picks it by program name)")
        .some_of("-d,--datatype", c.types, all_types, "the element type")
        .some_of("-o,--op", c.redops, perf::redop_names(),
                 "the reduction of the reducing collectives")
        .integer("-r,--root", c.root, 0, 1 << 20, "the root of broadcast, reduce, gather, scatter");
    c.sweep.declare(a);
    a.one_of("--algo", c.algorithm, algorithms, "force an algorithm (default: by size)")
        .one_of("-F,--format", c.format, {"text", "csv", "json"}, "what stdout carries")
        .text("-J,--output_file", c.json_path, "FILE", "also write the rows to FILE as JSON")
        .boolean("--stats", c.stats,
                 "each rank writes what its reactor did in each size's timed loop to stderr")
        .integer("--nproc", c.nproc, 1, 4096, "ranks to spawn where no launcher started it")
        .moved("-t", "the datatype is -d now, as in nccl-tests")
        .moved("-R", "the reduction is -o now, as in nccl-tests (the collective is --coll)")
        .moved("-a",
               "an algorithm is forced with --algo (nccl-tests' -a, how times are "
               "combined over ranks, is not supported: they are the largest)")
        .note(
            "Sizes take K, M and G (powers of 1024) and must be whole numbers of bytes. "
            "Rows and columns: see the top of benchmarks/coll_perf.cpp.");
    perf::parse_or_exit(a, argc, argv);
    return c;
}

}  // namespace

int main(int argc, char** argv) {
    config c = parse(argc, argv);
    return cc::run_or_spawn(c.nproc, [&c](cc::process_group& pg) { return benchmark(pg, c); });
}
