// coll_perf: collective and point-to-point timings in the style of nccl-tests.
//
//   coll_perf [-o OP] [-t TYPE] [-R REDOP] [-a ALGORITHM] [-b MIN] [-e MAX] [-f FACTOR]
//             [-n ITERS] [-w WARMUP] [-c 0|1] [-r ROOT] [-F text|csv|json] [--nproc N]
//
//   -o  all_reduce (default), broadcast, reduce, all_gather, reduce_scatter, gather, scatter,
//       all_to_all, ping_pong (one-way time = round trip / 2, between ranks 0 and 1), or all
//   -t  int8, uint8, int32, int64, float (default), double, half, bfloat16, or all
//   -R  sum (default), prod, min, max, avg, or all (reducing ops only)
//   -a  force an algorithm (ring, recursive_doubling, binomial, chain, bruck, linear,
//       pairwise); default: corocoll's choice by size
//   -b, -e, -f  sizes in bytes from MIN to MAX, multiplied by FACTOR (K, M, G suffixes)
//   -n, -w  timed iterations and warm-up iterations per size (default 20 and 5)
//   -c 1    check every result exactly (tolerance for avg on floating types); #wrong counts
//           the elements that differ on any rank, and the exit code is 1 if any does
//   -F      text (nccl-tests' table, the default), csv or json (the same rows)
//
// A size is what nccl-tests calls it: the buffer of all_reduce, broadcast, reduce and
// ping_pong; the whole gathered buffer of all_gather and gather; the whole input of
// reduce_scatter, scatter and all_to_all. time is the mean over the iterations, the largest
// over the ranks; algbw = size / time; busbw = algbw times nccl-tests' factor (all_reduce
// 2(n-1)/n; all_gather, reduce_scatter, gather, scatter, all_to_all (n-1)/n; the others 1).
// corocoll's all_reduce, broadcast and reduce work in place and the others out of place, so
// each row has one of the two column groups and N/A in the other.
//
// Runs under corocollrun, torchrun or mpirun (one rank per process), or spawns --nproc ranks.

#include <corocoll/corocoll.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
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

const std::vector<std::string> all_ops = {"all_reduce", "broadcast",      "reduce",
                                          "all_gather", "reduce_scatter", "gather",
                                          "scatter",    "all_to_all",     "ping_pong"};
const std::vector<std::string> all_types = {"int8",  "uint8",  "int32", "int64",
                                            "float", "double", "half",  "bfloat16"};
const std::vector<std::string> all_redops = {"sum", "prod", "min", "max", "avg"};

struct config {
    std::vector<std::string> ops{"all_reduce"};
    std::vector<std::string> types{"float"};
    std::vector<std::string> redops{"sum"};
    std::string algorithm;
    std::size_t min_bytes = 32;
    std::size_t max_bytes = std::size_t{32} << 20;
    double factor = 2;
    int iters = 20;
    int warmup = 5;
    bool check = false;
    int root = 0;
    std::string format = "text";
    int nproc = 2;
};

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

double bus_factor(const std::string& op, int n) {
    double d = n;
    if (op == "all_reduce") return 2 * (d - 1) / d;
    if (op == "broadcast" || op == "reduce" || op == "ping_pong") return 1;
    return (d - 1) / d;
}

cc::reduce_op redop_of(const std::string& s) {
    if (s == "sum") return cc::reduce_op::sum;
    if (s == "prod") return cc::reduce_op::product;
    if (s == "min") return cc::reduce_op::min;
    if (s == "max") return cc::reduce_op::max;
    if (s == "avg") return cc::reduce_op::avg;
    throw std::invalid_argument("-R " + s + ": expected sum, prod, min, max, avg or all");
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

cc::collectives::algorithm algorithm_of(const std::string& s) {
    using a = cc::collectives::algorithm;
    for (a x : {a::ring, a::recursive_doubling, a::binomial, a::chain, a::bruck, a::linear,
                a::pairwise, a::dissemination}) {
        if (s == cc::collectives::algorithm_name(x)) return x;
    }
    throw std::invalid_argument("-a " + s + ": not an algorithm corocoll has");
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
            acc = static_cast<double>(static_cast<long long>(acc) /
                                      n);  // NOLINT(bugprone-integer-division)
        } else {
            acc /= n;
        }
    }
    return acc;
}

template <class T>
T make(double v) {
    if constexpr (std::is_same_v<T, cc::float16> || std::is_same_v<T, cc::bfloat16>) {
        return T(static_cast<float>(v));
    } else {
        return static_cast<T>(v);
    }
}

template <class T>
double read(T v) {
    if constexpr (std::is_same_v<T, cc::float16> || std::is_same_v<T, cc::bfloat16>) {
        return static_cast<double>(static_cast<float>(v));
    } else {
        return static_cast<double>(v);
    }
}

template <class T>
bool same(double got, double want) {
    if constexpr (std::is_integral_v<T>) {
        return got == want;
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
        if (reduces(op_)) red_ = redop_of(redop_);
    }

    // The timed loop's body: which operation is decided once, in the constructor.
    cc::task<> run_once() {
        switch (which_) {
            case which::all_reduce:
                co_await pg_.all_reduce(a_, red_);
                break;
            case which::broadcast:
                co_await pg_.broadcast(a_, c_.root);
                break;
            case which::reduce:
                co_await pg_.reduce(a_, c_.root, red_);
                break;
            case which::all_gather:
                co_await pg_.all_gather_into(b_, a_);
                break;
            case which::reduce_scatter:
                co_await pg_.reduce_scatter_into(b_, a_, red_);
                break;
            case which::gather:
                co_await pg_.gather_into(a_, b_, c_.root);
                break;
            case which::scatter:
                co_await pg_.scatter_from(b_, a_, c_.root);
                break;
            case which::all_to_all:
                co_await pg_.all_to_all_single(b_, a_);
                break;
            case which::ping_pong:
                if (rank_ == 0) {
                    co_await pg_.send(a_, 1);
                    co_await pg_.recv(a_, 1);
                } else if (rank_ == 1) {
                    co_await pg_.recv(a_, 0);
                    co_await pg_.send(a_, 0);
                }
                break;
        }
    }

    // Mean time per operation on this rank, in microseconds.
    cc::task<double> time() {
        for (int i = 0; i < c_.warmup; ++i) co_await run_once();
        co_await pg_.barrier();
        auto t0 = clock_type::now();
        for (int i = 0; i < c_.iters; ++i) co_await run_once();
        std::chrono::duration<double, std::micro> took = clock_type::now() - t0;
        double per = took.count() / std::max(1, c_.iters);
        co_return op_ == "ping_pong" ? per / 2 : per;
    }

    // Fills the inputs, runs once, and counts the elements that differ from what they must be.
    cc::task<long long> check() {
        fill();
        co_await run_once();
        co_return verify();
    }

private:
    void fill() {
        auto set = [](std::vector<T>& v, auto f) {
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
        auto expect = [&](const std::vector<T>& v, auto f) {
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
    std::vector<T> a_;
    std::vector<T> b_;
};

template <class T>
cc::task<> sweep(cc::process_group& pg, const config& c, const std::string& op,
                 const std::string& type, const std::string& redop, std::vector<row>& rows) {
    const int n = pg.size();
    for (std::size_t bytes = c.min_bytes; bytes <= c.max_bytes;) {
        std::size_t count = elements(op, bytes, sizeof(T), n);
        auto next = static_cast<std::size_t>(static_cast<double>(bytes) * c.factor);
        if (count == 0) {  // too small to give every rank an element
            if (next <= bytes) break;
            bytes = next;
            continue;
        }
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
        std::vector<double> t(1, mine);
        co_await pg.all_reduce(t, cc::reduce_op::max);
        r.time_us = t[0];
        r.algbw = r.time_us > 0 ? static_cast<double>(r.bytes) / r.time_us / 1e3 : 0;  // GB/s
        r.busbw = r.algbw * bus_factor(op, n);
        if (c.check) {
            long long mine_wrong = co_await b.check();
            std::vector<std::int64_t> wrong(1, mine_wrong);
            co_await pg.all_reduce(wrong, cc::reduce_op::sum);
            r.wrong = wrong[0];
        }
        rows.push_back(r);
        if (next <= bytes) break;
        bytes = next;
    }
}

cc::task<> sweep_type(cc::process_group& pg, const config& c, const std::string& op,
                      const std::string& type, const std::string& redop, std::vector<row>& rows) {
    if (type == "int8") return sweep<std::int8_t>(pg, c, op, type, redop, rows);
    if (type == "uint8") return sweep<std::uint8_t>(pg, c, op, type, redop, rows);
    if (type == "int32") return sweep<std::int32_t>(pg, c, op, type, redop, rows);
    if (type == "int64") return sweep<std::int64_t>(pg, c, op, type, redop, rows);
    if (type == "float") return sweep<float>(pg, c, op, type, redop, rows);
    if (type == "double") return sweep<double>(pg, c, op, type, redop, rows);
    if (type == "half") return sweep<cc::float16>(pg, c, op, type, redop, rows);
    return sweep<cc::bfloat16>(pg, c, op, type, redop, rows);
}

std::string fixed(double v, int decimals) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return buf;
}

void print_text_header(const config& c, const std::string& op, int n) {
    std::printf(
        "# corocoll coll_perf: %s on %d ranks, iters %d, warm-up %d, check %d, algorithm %s\n",
        op.c_str(), n, c.iters, c.warmup, c.check ? 1 : 0,
        c.algorithm.empty() ? "auto" : c.algorithm.c_str());
    std::printf("#\n#%53s%36s\n", "out-of-place", "in-place");
    std::printf("#%12s %12s %8s %6s %5s %9s %8s %8s %7s %9s %8s %8s %7s\n", "size", "count", "type",
                "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
                "#wrong");
    std::printf("#%12s %12s %8s %6s %5s %9s %8s %8s %7s %9s %8s %8s %7s\n", "(B)", "(elements)", "",
                "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

void print_text_row(const row& r) {
    std::string wrong = r.wrong < 0 ? "N/A" : std::to_string(r.wrong);
    char measured[128];
    std::snprintf(measured, sizeof measured, "%9s %8s %8s %7s", fixed(r.time_us, 2).c_str(),
                  fixed(r.algbw, 3).c_str(), fixed(r.busbw, 3).c_str(), wrong.c_str());
    char absent[128];
    std::snprintf(absent, sizeof absent, "%9s %8s %8s %7s", "N/A", "N/A", "N/A", "N/A");
    std::printf(" %12zu %12zu %8s %6s %5d %s %s\n", r.bytes, r.count, r.type.c_str(),
                r.redop.c_str(), r.root, r.in_place ? absent : measured,
                r.in_place ? measured : absent);
}

void print_csv(const std::vector<row>& rows, int n) {
    std::printf(
        "op,ranks,size,count,type,redop,root,placement,time_us,algbw_gbs,busbw_gbs,wrong\n");
    for (const auto& r : rows) {
        std::printf("%s,%d,%zu,%zu,%s,%s,%d,%s,%.3f,%.4f,%.4f,%lld\n", r.op.c_str(), n, r.bytes,
                    r.count, r.type.c_str(), r.redop.c_str(), r.root,
                    r.in_place ? "in-place" : "out-of-place", r.time_us, r.algbw, r.busbw, r.wrong);
    }
}

void print_json(const std::vector<row>& rows, int n) {
    std::printf("[\n");
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        std::printf(
            "  {\"op\": \"%s\", \"ranks\": %d, \"size\": %zu, \"count\": %zu, "
            "\"type\": \"%s\", \"redop\": \"%s\", \"root\": %d, \"placement\": \"%s\", "
            "\"time_us\": %.3f, \"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f, "
            "\"wrong\": %lld}%s\n",
            r.op.c_str(), n, r.bytes, r.count, r.type.c_str(), r.redop.c_str(), r.root,
            r.in_place ? "in-place" : "out-of-place", r.time_us, r.algbw, r.busbw, r.wrong,
            i + 1 < rows.size() ? "," : "");
    }
    std::printf("]\n");
}

cc::task<> benchmark(cc::process_group& pg, const config& c) {
    const int n = pg.size();
    if (c.root < 0 || c.root >= n) {
        throw std::invalid_argument("-r " + std::to_string(c.root) + ": not a rank of " +
                                    std::to_string(n));
    }
    std::vector<row> all_rows;
    long long wrong_total = 0;
    for (const auto& op : c.ops) {
        if (op == "ping_pong" && n < 2) continue;
        if (!c.algorithm.empty()) {
            if (auto k = kind_of(op)) pg.set_algorithm(*k, algorithm_of(c.algorithm));
        }
        if (pg.rank() == 0 && c.format == "text") print_text_header(c, op, n);
        for (const auto& type : c.types) {
            std::vector<std::string> redops(1, "sum");
            if (reduces(op)) redops = c.redops;
            for (const auto& redop : redops) {
                std::vector<row> rows;
                co_await sweep_type(pg, c, op, type, redop, rows);
                for (const auto& r : rows) {
                    if (r.wrong > 0) wrong_total += r.wrong;
                    if (pg.rank() == 0 && c.format == "text") print_text_row(r);
                }
                all_rows.insert(all_rows.end(), rows.begin(), rows.end());
            }
        }
        if (!c.algorithm.empty()) {
            if (auto k = kind_of(op)) {
                pg.set_algorithm(*k, cc::collectives::algorithm::automatic);
            }
        }
    }
    if (pg.rank() == 0) {
        if (c.format == "csv") print_csv(all_rows, n);
        if (c.format == "json") print_json(all_rows, n);
        if (c.format == "text") {
            double sum = 0;
            for (const auto& r : all_rows) sum += r.busbw;
            std::printf("# Out of bounds values : %lld %s\n", wrong_total,
                        !c.check           ? "(not checked)"
                        : wrong_total == 0 ? "OK"
                                           : "FAILED");
            std::printf("# Avg bus bandwidth    : %.4f\n",
                        all_rows.empty() ? 0.0 : sum / static_cast<double>(all_rows.size()));
        }
        std::fflush(stdout);
    }
    if (wrong_total > 0) {
        throw std::runtime_error(std::to_string(wrong_total) + " wrong element(s) in the check");
    }
}

std::size_t parse_size(const std::string& flag, const std::string& s) {
    std::size_t used = 0;
    double v = 0;
    try {
        v = std::stod(s, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    double mult = 1;
    if (used + 1 == s.size()) {
        char u = s.back();
        mult = u == 'K' || u == 'k'   ? 1024.0
               : u == 'M' || u == 'm' ? 1048576.0
               : u == 'G' || u == 'g' ? 1073741824.0
                                      : 0;
        if (mult != 0) ++used;
    }
    if (used != s.size() || s.empty() || !(v >= 0)) {
        throw std::invalid_argument(flag + " " + s +
                                    ": expected a size in bytes (K, M, G allowed)");
    }
    return static_cast<std::size_t>(v * mult);
}

int parse_int(const std::string& flag, const std::string& s, int lo) {
    std::size_t used = 0;
    int v = lo - 1;
    try {
        v = std::stoi(s, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != s.size() || v < lo) {
        throw std::invalid_argument(flag + " " + s +
                                    ": expected a whole number >= " + std::to_string(lo));
    }
    return v;
}

std::vector<std::string> pick(const std::string& flag, const std::string& s,
                              const std::vector<std::string>& known) {
    if (s == "all") return known;
    if (std::find(known.begin(), known.end(), s) == known.end()) {
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
        throw std::invalid_argument(flag + " " + s + ": expected one of " + list + ", all");
    }
    return {s};
}

config parse(int argc, char** argv) {
    config c;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            std::printf(
                "usage: coll_perf [-o OP] [-t TYPE] [-R REDOP] [-a ALGO] [-b MIN] [-e MAX] "
                "[-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1] [-r ROOT] [-F text|csv|json] "
                "[--nproc N]\n(see the top of benchmarks/coll_perf.cpp)\n");
            std::exit(0);
        }
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        std::string v = argv[++i];
        if (a == "-o")
            c.ops = pick(a, v, all_ops);
        else if (a == "-t")
            c.types = pick(a, v, all_types);
        else if (a == "-R")
            c.redops = pick(a, v, all_redops);
        else if (a == "-a")
            c.algorithm = v;
        else if (a == "-b")
            c.min_bytes = parse_size(a, v);
        else if (a == "-e")
            c.max_bytes = parse_size(a, v);
        else if (a == "-f") {
            c.factor = std::atof(v.c_str());
            if (!(c.factor > 1)) throw std::invalid_argument("-f " + v + ": must be above 1");
        } else if (a == "-n")
            c.iters = parse_int(a, v, 1);
        else if (a == "-w")
            c.warmup = parse_int(a, v, 0);
        else if (a == "-c")
            c.check = parse_int(a, v, 0) != 0;
        else if (a == "-r")
            c.root = parse_int(a, v, 0);
        else if (a == "-F") {
            if (v != "text" && v != "csv" && v != "json") {
                throw std::invalid_argument("-F " + v + ": expected text, csv or json");
            }
            c.format = v;
        } else if (a == "--nproc")
            c.nproc = parse_int(a, v, 1);
        else
            throw std::invalid_argument("unknown option " + a + " (see --help)");
    }
    if (c.min_bytes == 0) c.min_bytes = 1;
    if (c.max_bytes < c.min_bytes) throw std::invalid_argument("-e is below -b");
    if (!c.algorithm.empty()) algorithm_of(c.algorithm);  // refuse an unknown name up front
    return c;
}

}  // namespace

int main(int argc, char** argv) {
    config c;
    try {
        c = parse(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "coll_perf: %s\n", e.what());
        return 2;
    }
    return cc::run_or_spawn(c.nproc, [&c](cc::process_group& pg) { return benchmark(pg, c); });
}
