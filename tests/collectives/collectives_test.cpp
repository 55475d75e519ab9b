// Every collective x every element type x every op it supports x world sizes 1, 2, 3, 4, 5, 7,
// 8 x counts 0, 1, n-1, chunk-1, chunk, chunk+1 and a multi-MiB size, once per forced
// algorithm, with exact checks: every value is a small integer, so every result is exact in
// every type (integer-valued floats, as nccl-tests does). Ranks run as threads, one group per
// world size. Under sanitizers, or with COROCOLL_TEST_THIN=1, the matrix is thinner (fewer
// types and world sizes).

#include "../support/bool_vector.hpp"
#include "../support/ranks.hpp"
#include "../support/sanitized.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string_view>
#include <thread>
#include <tuple>

using namespace corocoll_test;
namespace coll = corocoll::collectives;

namespace {

// The thin matrix: under sanitizers, or where COROCOLL_TEST_THIN=1 asks for it (CI's second
// compiler runs the same kernels as the first).
const bool thin = [] {
    const char* v = std::getenv("COROCOLL_TEST_THIN");
    return sanitized || (v != nullptr && std::string_view(v) == "1");
}();

std::vector<int> world_sizes() {
    if (thin) return {1, 2, 3, 5, 8};
    return {1, 2, 3, 4, 5, 7, 8};
}

constexpr std::size_t small_chunk = 64;             // bytes: chunk boundaries at tiny counts
constexpr std::size_t big_bytes = (3u << 20) + 40;  // the multi-MiB case
constexpr std::size_t beyond_lines = 5003;          // elements: more than 4 KiB of any type

// bool takes the value's parity (both values occur); a complex number is (v, -v), so that a
// product is a complex product ((a - ai)(b - bi) = -2abi), not one of the parts'.
template <class T>
T make(double v) {
    if constexpr (std::is_same_v<T, bool>) {
        return static_cast<std::int64_t>(v) % 2 != 0;
    } else if constexpr (cc::detail::is_complex_v<T>) {
        using V = typename T::value_type;
        return T(static_cast<V>(v), static_cast<V>(-v));
    } else if constexpr (std::is_integral_v<T>) {
        return static_cast<T>(static_cast<std::int64_t>(v));  // wraps where the kernel wraps
    } else {
        return T(static_cast<float>(v));
    }
}

template <class T>
bool same_value(T a, T b) {
    if constexpr (cc::detail::is_complex_v<T> || std::is_integral_v<T>) {
        return a == b;
    } else {
        return static_cast<double>(static_cast<float>(a)) ==
               static_cast<double>(static_cast<float>(b));
    }
}

template <class T>
std::string show(T v) {
    std::ostringstream s;
    if constexpr (cc::detail::is_complex_v<T>) {
        s << "(" << v.real() << ", " << v.imag() << ")";
    } else if constexpr (std::is_integral_v<T>) {
        s << static_cast<long double>(v);
    } else {
        s << static_cast<double>(static_cast<float>(v));
    }
    return s.str();
}

// Element i of rank r for op `op`, chosen so that every result is exact in every type.
double value(cc::reduce_op op, int r, std::size_t i) {
    switch (op) {
        case cc::reduce_op::sum:
            return static_cast<double>((static_cast<std::size_t>(r) * 3 + i) % 7 + 1);
        case cc::reduce_op::product:
            return static_cast<double>(1 + (static_cast<std::size_t>(r) + i) % 2);
        case cc::reduce_op::min:
        case cc::reduce_op::max:
            return static_cast<double>((static_cast<std::size_t>(r) * 5 + i * 3) % 11);
        case cc::reduce_op::band:
        case cc::reduce_op::bor:
        case cc::reduce_op::bxor:
            return static_cast<double>((static_cast<std::size_t>(r) * 37 + i * 11) & 0x7f);
        case cc::reduce_op::avg:
            return static_cast<double>(i % 7 + 1);
    }
    return 0;
}

double expected_value(cc::reduce_op op, int n, std::size_t i) {
    std::int64_t acc = static_cast<std::int64_t>(value(op, 0, i));
    for (int r = 1; r < n; ++r) {
        auto v = static_cast<std::int64_t>(value(op, r, i));
        switch (op) {
            case cc::reduce_op::sum:
                acc += v;
                break;
            case cc::reduce_op::product:
                acc *= v;
                break;
            case cc::reduce_op::min:
                acc = std::min(acc, v);
                break;
            case cc::reduce_op::max:
                acc = std::max(acc, v);
                break;
            case cc::reduce_op::band:
                acc &= v;
                break;
            case cc::reduce_op::bor:
                acc |= v;
                break;
            case cc::reduce_op::bxor:
                acc ^= v;
                break;
            case cc::reduce_op::avg:
                break;  // same value on every rank
        }
    }
    return static_cast<double>(acc);
}

// Element i of the reduction over `n` ranks, in T: bool reduces logically (sum, max and bor
// are or; product, min and band are and), complex in complex arithmetic.
template <class T>
T expected(cc::reduce_op op, int n, std::size_t i) {
    if constexpr (std::is_same_v<T, bool>) {
        bool acc = make<bool>(value(op, 0, i));
        for (int r = 1; r < n; ++r) {
            bool v = make<bool>(value(op, r, i));
            switch (op) {
                case cc::reduce_op::sum:
                case cc::reduce_op::max:
                case cc::reduce_op::bor:
                    acc = acc || v;
                    break;
                case cc::reduce_op::bxor:
                    acc = acc != v;
                    break;
                default:
                    acc = acc && v;
            }
        }
        return acc;
    } else if constexpr (cc::detail::is_complex_v<T>) {
        std::complex<double> acc = make<std::complex<double>>(value(op, 0, i));
        for (int r = 1; r < n; ++r) {
            auto v = make<std::complex<double>>(value(op, r, i));
            if (op == cc::reduce_op::sum) acc += v;
            if (op == cc::reduce_op::product) acc *= v;
        }
        using V = typename T::value_type;
        return T(static_cast<V>(acc.real()), static_cast<V>(acc.imag()));
    } else {
        return make<T>(expected_value(op, n, i));
    }
}

// `f(i)` for every element: a double goes through make<T>, a T is taken as it is.
template <class T>
vector_of<T> filled(std::size_t count, auto&& f) {
    vector_of<T> v(count);
    for (std::size_t i = 0; i < count; ++i) {
        auto x = f(i);
        if constexpr (std::is_same_v<decltype(x), T>) {
            v[i] = x;
        } else {
            v[i] = make<T>(x);
        }
    }
    return v;
}

template <class V>
void expect_equal(const V& got, const V& want, const std::string& what) {
    if (got.size() != want.size())
        throw std::runtime_error(what + ": size " + std::to_string(got.size()));
    for (std::size_t i = 0; i < got.size(); ++i) {
        if (!same_value(got[i], want[i])) {
            throw std::runtime_error(what + ": element " + std::to_string(i) + " is " +
                                     show(got[i]) + ", expected " + show(want[i]));
        }
    }
}

template <class T>
std::vector<std::size_t> counts(int n) {
    std::size_t chunk = small_chunk / sizeof(T);
    return {0, 1, static_cast<std::size_t>(n - 1), chunk - 1, chunk, chunk + 1};
}

const cc::reduce_op all_ops[] = {cc::reduce_op::sum,  cc::reduce_op::product, cc::reduce_op::min,
                                 cc::reduce_op::max,  cc::reduce_op::band,    cc::reduce_op::bor,
                                 cc::reduce_op::bxor, cc::reduce_op::avg};

template <class F>
void for_each_type(F&& f) {
    if (thin) {
        f(std::int32_t{});
        f(float{});
        f(cc::bfloat16{});
        return;
    }
    f(std::int8_t{});
    f(std::uint8_t{});
    f(std::int32_t{});
    f(std::int64_t{});
    f(float{});
    f(double{});
    f(cc::float16{});
    f(cc::bfloat16{});
    f(std::int16_t{});
    f(std::uint16_t{});
    f(std::uint32_t{});
    f(std::uint64_t{});
    f(bool{});
    f(std::complex<float>{});
    f(std::complex<double>{});
}

// Runs `per_type(T{})` for every element type, one after another.
template <class F>
cc::task<> each_type(F per_type) {
    std::vector<cc::task<>> types;
    for_each_type([&](auto tag) { types.push_back(per_type(tag)); });
    for (auto& t : types) co_await std::move(t);  // one after another, in order
}

std::string label(const char* coll, coll::algorithm a, cc::dtype t, const char* op,
                  std::size_t count, int n) {
    return std::string(coll) + "/" + coll::algorithm_name(a) + " " + cc::dtype_name(t) + " " + op +
           " count " + std::to_string(count) + " on " + std::to_string(n) + " ranks";
}

// The shared-memory arena of the matrix's groups: small, so that the shm algorithms cut even
// the small counts into many pieces (a slot of 8 ranks is 2 KiB).
constexpr std::size_t matrix_arena_bytes = std::size_t{16} << 10;

// `algos`, and the shared-memory algorithm where the group has an arena (its ranks share this
// host and the transport is shm: not on the TCP rerun, nor on one rank).
std::vector<coll::algorithm> with_shm(const cc::process_group& pg,
                                      std::initializer_list<coll::algorithm> algos) {
    std::vector<coll::algorithm> out(algos);
    if (pg.has_arena()) out.push_back(coll::algorithm::shm);
    return out;
}

// Runs `body(pg)` on every world size; every rank must finish without an exception.
void on_every_world(const std::function<cc::task<>(cc::process_group&)>& body) {
    for (int n : world_sizes()) {
        CAPTURE(n);
        thread_ranks_options o;
        o.timeout = 60s;
        o.limits.shm_arena_bytes = matrix_arena_bytes;
        check_every_rank_ok(run_threads(n, body, o));
    }
}

// Sizes to try: the small counts with tiny chunks, then the multi-MiB one with normal chunks.
template <class T, class F>
cc::task<> over_counts(cc::process_group& pg, bool big, F f) {
    pg.set_chunk_bytes(small_chunk);
    for (std::size_t count : counts<T>(pg.size())) co_await f(count);
    // Sanitizer builds skip it: slow there, and nothing new to find. So do the integer widths
    // that int8/int32/int64 already take through the same kernels (the test's time: 15 types
    // with every big case took 6.5 min on a loaded 2-core machine). The thin matrix asked for
    // by COROCOLL_TEST_THIN=1 keeps it: the TCP rerun needs messages past the 1 MiB chunks.
    constexpr bool same_kernels_as_others =
        std::is_same_v<T, std::int16_t> || std::is_same_v<T, std::uint16_t> ||
        std::is_same_v<T, std::uint32_t> || std::is_same_v<T, std::uint64_t>;
    if (big && !sanitized && !same_kernels_as_others) {
        pg.set_chunk_bytes(std::size_t{1} << 20);
        co_await f(big_bytes / sizeof(T));
    }
}

// Collectives that only move bytes (broadcast, all_gather, gather, scatter, all_to_all) take
// an element's size from its type and nothing else: their multi-MiB case runs for one type of
// each size (1, 2, 4, 8 and 16 bytes), and for every type of the thin matrix. Every type still
// takes every small count. (CI's time: all_gather's case took 98 s of the matrix's 310 s with
// the multi-MiB case on all eleven types.)
template <class T>
bool big_moves_bytes() {
    return thin || std::is_same_v<T, std::int8_t> || std::is_same_v<T, cc::bfloat16> ||
           std::is_same_v<T, float> || std::is_same_v<T, double> ||
           std::is_same_v<T, std::complex<double>>;
}

// all_reduce with `op` on every count (the multi-MiB one for sum), checked exactly.
template <class T>
cc::task<> check_all_reduce(cc::process_group& pg, coll::algorithm algo, cc::reduce_op op) {
    int n = pg.size(), r = pg.rank();
    co_await over_counts<T>(pg, op == cc::reduce_op::sum, [&](std::size_t count) -> cc::task<> {
        auto data = filled<T>(count, [&](std::size_t i) { return value(op, r, i); });
        co_await pg.all_reduce(data, op);
        expect_equal(data, filled<T>(count, [&](std::size_t i) { return expected<T>(op, n, i); }),
                     label("all_reduce", algo, cc::dtype_of<T>, cc::op_name(op), count, n));
    });
}

// broadcast from the first, middle and last rank on every count (the multi-MiB one from the
// middle), checked exactly.
template <class T>
cc::task<> check_broadcast(cc::process_group& pg, coll::algorithm algo) {
    int n = pg.size(), r = pg.rank();
    for (int root : {0, n / 2, n - 1}) {
        co_await over_counts<T>(
            pg, root == n / 2 && big_moves_bytes<T>(), [&](std::size_t count) -> cc::task<> {
                auto data = filled<T>(
                    count, [&](std::size_t i) { return value(cc::reduce_op::sum, r, i); });
                co_await pg.broadcast(data, root);
                expect_equal(
                    data,
                    filled<T>(count,
                              [&](std::size_t i) { return value(cc::reduce_op::sum, root, i); }),
                    label("broadcast", algo, cc::dtype_of<T>, "-", count, n) + " root " +
                        std::to_string(root));
            });
    }
}

// all_gather_into on every count, checked exactly.
template <class T>
cc::task<> check_all_gather(cc::process_group& pg, coll::algorithm algo) {
    int n = pg.size(), r = pg.rank();
    co_await over_counts<T>(pg, big_moves_bytes<T>(), [&](std::size_t count) -> cc::task<> {
        auto in = filled<T>(count, [&](std::size_t i) { return value(cc::reduce_op::sum, r, i); });
        vector_of<T> out(count * n);
        co_await pg.all_gather_into(out, in);
        std::size_t per = std::max<std::size_t>(count, 1);
        expect_equal(out,
                     filled<T>(count * n,
                               [&](std::size_t i) {
                                   return value(cc::reduce_op::sum, static_cast<int>(i / per),
                                                i % per);
                               }),
                     label("all_gather", algo, cc::dtype_of<T>, "-", count, n));
    });
}

}  // namespace

TEST_CASE("all_reduce: every type, op, world size and count, with each algorithm") {
    on_every_world([](cc::process_group& pg) -> cc::task<> {
        for (auto algo :
             with_shm(pg, {coll::algorithm::ring, coll::algorithm::recursive_doubling})) {
            pg.set_algorithm(coll::collective_kind::all_reduce, algo);
            auto per_type = [&](auto tag) -> cc::task<> {
                using T = decltype(tag);
                for (auto op : all_ops) {
                    if (cc::op_supported(op, cc::dtype_of<T>))
                        co_await check_all_reduce<T>(pg, algo, op);
                }
            };
            co_await each_type(per_type);
        }
    });
}

TEST_CASE("all_reduce by single copies: every type and op on 2 ranks, none on more") {
    // With single copies from 16 KiB every all_reduce of 2 ranks' arena from there reads the
    // other's half straight from its buffer (all_reduce_single_copies). 20,011 elements: halves
    // of uneven length, from 20 KiB of int8 on; one sum of 300,007 floats: halves of several
    // pieces. Groups of 3 and 4 make none for all_reduce whatever the option.
    thread_ranks_options o;
    o.timeout = 60s;
    o.limits.shm_arena_bytes = matrix_arena_bytes;
    o.limits.shm_arena_single_copy_bytes = std::size_t{16} << 10;
    for (int n : {2, 3, 4}) {
        CAPTURE(n);
        check_every_rank_ok(run_threads(
            n,
            [](cc::process_group& pg) -> cc::task<> {
                using k = coll::collective_kind;
                const std::size_t want = pg.size() == 2 ? std::size_t{16} << 10 : 0;
                if (pg.arena_single_copy_from(k::all_reduce) != want) {
                    throw std::runtime_error(
                        "all_reduce's single copies from " +
                        std::to_string(pg.arena_single_copy_from(k::all_reduce)));
                }
                int n = pg.size(), r = pg.rank();
                auto one = [&](auto tag, cc::reduce_op op, std::size_t count) -> cc::task<> {
                    using T = decltype(tag);
                    auto data = filled<T>(count, [&](std::size_t i) { return value(op, r, i); });
                    co_await pg.all_reduce(data, op);
                    expect_equal(
                        data,
                        filled<T>(count, [&](std::size_t i) { return expected<T>(op, n, i); }),
                        label("all_reduce", coll::algorithm::shm, cc::dtype_of<T>, cc::op_name(op),
                              count, n));
                };
                auto per_type = [&](auto tag) -> cc::task<> {
                    for (auto op : all_ops) {
                        if (cc::op_supported(op, cc::dtype_of<decltype(tag)>))
                            co_await one(tag, op, 20011);
                    }
                };
                if (n == 2) co_await each_type(per_type);
                co_await one(float{}, cc::reduce_op::sum, 300007);
            },
            o));
    }
}

TEST_CASE(
    "reduce: every type, op, world size, count and root, with each algorithm; other buffers "
    "untouched") {
    on_every_world([](cc::process_group& pg) -> cc::task<> {
        int n = pg.size(), r = pg.rank();
        for (auto algo : with_shm(pg, {coll::algorithm::binomial})) {
            pg.set_algorithm(coll::collective_kind::reduce, algo);
            auto per_type = [&](auto tag) -> cc::task<> {
                using T = decltype(tag);
                for (auto op : all_ops) {
                    if (!cc::op_supported(op, cc::dtype_of<T>)) continue;
                    for (int root : {0, n - 1}) {
                        auto one = [&](std::size_t count) -> cc::task<> {
                            auto mine =
                                filled<T>(count, [&](std::size_t i) { return value(op, r, i); });
                            auto data = mine;
                            co_await pg.reduce(data, root, op);
                            auto want = r == root ? filled<T>(count,
                                                              [&](std::size_t i) {
                                                                  return expected<T>(op, n, i);
                                                              })
                                                  : mine;
                            expect_equal(
                                data, want,
                                label("reduce", algo, cc::dtype_of<T>, cc::op_name(op), count, n) +
                                    " root " + std::to_string(root));
                        };
                        co_await over_counts<T>(pg, op == cc::reduce_op::sum && root == 0, one);
                        // Beyond a step's lines (4 KiB) and over several slots of the data
                        // sets, with every op: the arena's reduce in slices.
                        if (algo == coll::algorithm::shm) co_await one(beyond_lines);
                    }
                }
            };
            co_await each_type(per_type);
        }
    });
}

TEST_CASE("reduce_scatter: every type, op, world size and count, with each algorithm") {
    on_every_world([](cc::process_group& pg) -> cc::task<> {
        int n = pg.size(), r = pg.rank();
        for (auto algo :
             with_shm(pg, {coll::algorithm::ring, coll::algorithm::recursive_doubling})) {
            pg.set_algorithm(coll::collective_kind::reduce_scatter, algo);
            auto per_type = [&](auto tag) -> cc::task<> {
                using T = decltype(tag);
                for (auto op : all_ops) {
                    if (!cc::op_supported(op, cc::dtype_of<T>)) continue;
                    co_await over_counts<T>(
                        pg, op == cc::reduce_op::sum, [&](std::size_t count) -> cc::task<> {
                            auto in = filled<T>(count * n,
                                                [&](std::size_t i) { return value(op, r, i); });
                            auto in_copy = in;
                            vector_of<T> out(count);
                            co_await pg.reduce_scatter_into(out, in, op);
                            expect_equal(out,
                                         filled<T>(count,
                                                   [&](std::size_t i) {
                                                       return expected<T>(op, n, r * count + i);
                                                   }),
                                         label("reduce_scatter", algo, cc::dtype_of<T>,
                                               cc::op_name(op), count, n));
                            expect_equal(in, in_copy, "reduce_scatter leaves its input");
                        });
                }
            };
            co_await each_type(per_type);
        }
    });
}

TEST_CASE("broadcast: every type, world size, count and root, with each algorithm") {
    on_every_world([](cc::process_group& pg) -> cc::task<> {
        for (auto algo : with_shm(pg, {coll::algorithm::binomial, coll::algorithm::chain})) {
            pg.set_algorithm(coll::collective_kind::broadcast, algo);
            auto per_type = [&](auto tag) -> cc::task<> {
                co_await check_broadcast<decltype(tag)>(pg, algo);
            };
            co_await each_type(per_type);
        }
    });
}

TEST_CASE("all_gather: every type, world size and count, with each algorithm") {
    on_every_world([](cc::process_group& pg) -> cc::task<> {
        for (auto algo : with_shm(pg, {coll::algorithm::ring, coll::algorithm::bruck})) {
            pg.set_algorithm(coll::collective_kind::all_gather, algo);
            auto per_type = [&](auto tag) -> cc::task<> {
                co_await check_all_gather<decltype(tag)>(pg, algo);
            };
            co_await each_type(per_type);
        }
    });
}

TEST_CASE("gather and scatter: every type, world size, count and root, with each algorithm") {
    on_every_world([](cc::process_group& pg) -> cc::task<> {
        int n = pg.size(), r = pg.rank();
        for (auto algo : with_shm(pg, {coll::algorithm::binomial, coll::algorithm::linear})) {
            pg.set_algorithm(coll::collective_kind::gather, algo);
            pg.set_algorithm(coll::collective_kind::scatter, algo);
            auto per_type = [&](auto tag) -> cc::task<> {
                using T = decltype(tag);
                for (int root : {0, n - 1}) {
                    co_await over_counts<T>(
                        pg, root == 0 && big_moves_bytes<T>(),
                        [&](std::size_t count) -> cc::task<> {
                            std::size_t c1 = std::max<std::size_t>(count, 1);
                            auto whole = filled<T>(count * n, [&](std::size_t i) {
                                return value(cc::reduce_op::sum, static_cast<int>(i / c1), i % c1);
                            });
                            auto in = filled<T>(count, [&](std::size_t i) {
                                return value(cc::reduce_op::sum, r, i);
                            });
                            vector_of<T> out(r == root ? count * n : 0);
                            co_await pg.gather_into(in, out, root);
                            if (r == root)
                                expect_equal(out, whole,
                                             label("gather", algo, cc::dtype_of<T>, "-", count, n) +
                                                 " root " + std::to_string(root));
                            vector_of<T> mine(count), source;
                            // Named: no temporary inside co_await (g++ 12).
                            if (r == root) source = whole;
                            co_await pg.scatter_from(mine, source, root);
                            expect_equal(mine, in,
                                         label("scatter", algo, cc::dtype_of<T>, "-", count, n) +
                                             " root " + std::to_string(root));
                        });
                }
            };
            co_await each_type(per_type);
        }
    });
}

TEST_CASE(
    "all_to_all: every type, world size and count, equal and given splits, with each algorithm") {
    on_every_world([](cc::process_group& pg) -> cc::task<> {
        int n = pg.size(), r = pg.rank();
        for (auto algo : with_shm(pg, {coll::algorithm::pairwise, coll::algorithm::linear})) {
            pg.set_algorithm(coll::collective_kind::all_to_all, algo);
            auto per_type = [&](auto tag) -> cc::task<> {
                using T = decltype(tag);
                co_await over_counts<T>(
                    pg, big_moves_bytes<T>(), [&](std::size_t count) -> cc::task<> {
                        // Equal blocks: block p of rank r holds (r, p)-dependent values.
                        auto in = filled<T>(count * n, [&](std::size_t i) {
                            return static_cast<double>((r * 13 + i) % 97);
                        });
                        vector_of<T> out(count * n);
                        co_await pg.all_to_all_single(out, in);
                        std::size_t c1 = std::max<std::size_t>(count, 1);
                        expect_equal(out,
                                     filled<T>(count * n,
                                               [&](std::size_t i) {
                                                   std::size_t from = i / c1;
                                                   return static_cast<double>(
                                                       (from * 13 + r * count + i % c1) % 97);
                                               }),
                                     label("all_to_all", algo, cc::dtype_of<T>, "-", count, n));
                    });
                // Given splits: rank r sends (r + p) % 3 elements to rank p.
                std::vector<std::size_t> in_splits(n), out_splits(n);
                for (int p = 0; p < n; ++p) {
                    in_splits[p] = static_cast<std::size_t>((r + p) % 3);
                    out_splits[p] = static_cast<std::size_t>((p + r) % 3);
                }
                vector_of<T> in, out;
                for (int p = 0; p < n; ++p) {
                    for (std::size_t k = 0; k < in_splits[p]; ++k)
                        in.push_back(make<T>(r * 10 + p + k));
                }
                vector_of<T> want;
                for (int p = 0; p < n; ++p) {
                    for (std::size_t k = 0; k < out_splits[p]; ++k)
                        want.push_back(make<T>(p * 10 + r + k));
                }
                out.resize(want.size());
                co_await pg.all_to_all_single(out, in, out_splits, in_splits);
                // Uneven splits go pairwise whatever is set (the arena's readers need equal
                // blocks).
                expect_equal(out, want,
                             label("all_to_all splits", coll::algorithm::pairwise, cc::dtype_of<T>,
                                   "-", in.size(), n));
            };
            co_await each_type(per_type);
        }
    });
}

TEST_CASE("barrier: nobody leaves before everyone arrived") {
    on_every_world([](cc::process_group& pg) -> cc::task<> {
        // Each rank arrives later than the one before; after the barrier, every rank must see
        // that the last one arrived (its arrival time is broadcast afterwards).
        co_await pg.reactor().sleep_for(std::chrono::milliseconds(5 * pg.rank()));
        auto arrived = std::chrono::steady_clock::now().time_since_epoch().count();
        co_await pg.barrier();
        auto left = std::chrono::steady_clock::now().time_since_epoch().count();
        std::vector<std::int64_t> last{arrived};
        co_await pg.broadcast(last, pg.size() - 1);
        if (left < last[0])
            throw std::runtime_error("left the barrier before the last rank arrived");
    });
}

// Hosts laid out by host tags (engine_options::host_tag): one letter per rank, the rank's
// host. Ranks of one host share memory, ranks of different hosts talk over TCP, and the group's
// topology says so; hosts need not hold consecutive ranks nor as many ranks each.
TEST_CASE("hierarchical: all_reduce, broadcast and all_gather on ranks laid out over hosts") {
    std::vector<std::string> layouts{"aab", "ababa"};
    if (!thin) {
        layouts.push_back("aabb");
        layouts.push_back("abcabca");
    }
    // Forced on layouts where the automatic choice would not pick it: one host, and hosts of
    // one rank each.
    std::vector<std::string> forced_layouts{"aaa", "ab"};
    auto run_layout = [](const std::string& layout, bool forced) {
        CAPTURE(layout);
        thread_ranks_options o;
        o.timeout = 60s;
        for (char h : layout) o.host_tags.emplace_back(1, h);
        auto body = [&layout, forced](cc::process_group& pg) -> cc::task<> {
            int n = pg.size(), r = pg.rank();
            const auto& t = pg.topology();
            std::string letters = layout;
            std::sort(letters.begin(), letters.end());
            auto distinct = std::unique(letters.begin(), letters.end()) - letters.begin();
            if (t.hosts() != distinct) {
                throw std::runtime_error("topology: " + t.describe() + " for layout " + layout);
            }
            for (int p = 0; p < n; ++p) {
                bool same =
                    layout[static_cast<std::size_t>(p)] == layout[static_cast<std::size_t>(r)];
                if ((t.host_of(p) == t.host_of(r)) != same) {
                    throw std::runtime_error("topology: rank " + std::to_string(p) +
                                             " misplaced: " + t.describe());
                }
                // A pair that has not talked yet has no channel (connections open on first
                // use); one that has, across hosts, is on TCP.
                std::string_view kind = pg.channel_to(p);
                if (p != r && !same && kind != "tcp" && !kind.empty()) {
                    throw std::runtime_error("rank " + std::to_string(p) +
                                             " on another host: " + pg.channel_to(p));
                }
            }
            for (auto k : {coll::collective_kind::all_reduce, coll::collective_kind::broadcast,
                           coll::collective_kind::all_gather}) {
                auto chosen = coll::select(k, 1 << 20, n, {}, {}, &t);
                if ((chosen == coll::algorithm::hierarchical) != t.hierarchical()) {
                    throw std::runtime_error(std::string("automatic choice for ") +
                                             coll::kind_name(k) + ": " +
                                             coll::algorithm_name(chosen));
                }
                if (forced) pg.set_algorithm(k, coll::algorithm::hierarchical);
            }
            auto algo = coll::algorithm::hierarchical;
            auto per_type = [&](auto tag) -> cc::task<> {
                using T = decltype(tag);
                for (auto op : {cc::reduce_op::sum, cc::reduce_op::max, cc::reduce_op::avg}) {
                    if (cc::op_supported(op, cc::dtype_of<T>))
                        co_await check_all_reduce<T>(pg, algo, op);
                }
                co_await check_broadcast<T>(pg, algo);
                co_await check_all_gather<T>(pg, algo);
            };
            // The phases run the algorithms that the matrix above proves on every type; these
            // types cover integer, float and 16-bit float kernels.
            co_await per_type(std::int32_t{});
            co_await per_type(float{});
            if (!thin) co_await per_type(cc::bfloat16{});
        };
        check_every_rank_ok(run_threads(static_cast<int>(layout.size()), body, o));
    };
    for (const auto& layout : layouts) run_layout(layout, false);
    for (const auto& layout : forced_layouts) run_layout(layout, true);
}

TEST_CASE(
    "hierarchical: a topology numbers hosts by their lowest rank and is chosen only "
    "across hosts with a host of several ranks") {
    std::vector<std::string> keys{"x", "y", "x", "z", "y"};
    auto t = coll::topology::from_keys(keys);
    CHECK(t.hosts() == 3);
    CHECK(std::vector<int>{t.host_of(0), t.host_of(1), t.host_of(2), t.host_of(3), t.host_of(4)} ==
          std::vector<int>{0, 1, 0, 2, 1});
    CHECK(std::vector<int>(t.ranks_on(1).begin(), t.ranks_on(1).end()) == std::vector<int>{1, 4});
    CHECK(std::vector<int>(t.leaders().begin(), t.leaders().end()) == std::vector<int>{0, 1, 3});
    CHECK(t.describe() == "3 hosts: ranks 0,2 | 1,4 | 3");
    CHECK(t.hierarchical());
    auto k = coll::collective_kind::all_reduce;
    CHECK(coll::select(k, 4, 5, {}, {}, &t) == coll::algorithm::hierarchical);
    CHECK(coll::select(coll::collective_kind::reduce, 4, 5, {}, {}, &t) ==
          coll::algorithm::binomial);
    coll::algorithm_choice ring;
    ring.force(k, coll::algorithm::ring);
    CHECK(coll::select(k, 4, 5, ring, {}, &t) == coll::algorithm::ring);  // forced wins

    std::vector<std::string> apart{"a", "b", "c"}, together{"a", "a", "a"};
    CHECK_FALSE(coll::topology::from_keys(apart).hierarchical());
    CHECK_FALSE(coll::topology::from_keys(together).hierarchical());
    CHECK(coll::topology::from_keys(together).describe() == "1 host: ranks 0,1,2");
    CHECK(coll::topology{}.hosts() == 1);
    CHECK(coll::select(k, 4, 3, {}, {}, nullptr) == coll::algorithm::recursive_doubling);
    CHECK_THROWS_AS(ring.force(coll::collective_kind::reduce, coll::algorithm::hierarchical),
                    std::invalid_argument);
}

TEST_CASE(
    "hierarchical: a group across hosts runs it without being told, as a rank that forces "
    "another algorithm finds out") {
    // Ranks 0 and 2 choose by themselves; rank 1 forces the ring. If the group picked the ring
    // too, the call would succeed: every rank fails only because the others ran hierarchical.
    thread_ranks_options o;
    o.host_tags = {"a", "a", "b"};
    auto errors = run_threads(
        3,
        [](cc::process_group& pg) -> cc::task<> {
            if (pg.rank() == 1) {
                pg.set_algorithm(coll::collective_kind::all_reduce, coll::algorithm::ring);
            }
            std::vector<std::int32_t> t(1 << 16, 1);
            co_await pg.all_reduce(t);
            co_await pg.barrier();  // a rank whose all_reduce ended learns the failure here
        },
        o);
    check_every_rank_names(errors, {"all_reduce(sum, int32 x 65536, hierarchical)",
                                    "all_reduce(sum, int32 x 65536, ring)"});
}

TEST_CASE("hierarchical: a host tag longer than 63 bytes is refused, naming the option") {
    cc::transport::engine_options o;
    o.host_tag = std::string(63, 'x');
    CHECK(o.host_tag.view().size() == 63);
    std::string refused;
    try {
        o.host_tag = std::string(64, 'y');
    } catch (const std::invalid_argument& e) {
        refused = e.what();
    }
    CHECK(refused.find("engine_options::host_tag") != std::string::npos);
    CHECK(refused.find("longer than 63 bytes") != std::string::npos);
    CHECK(o.host_tag.view() == std::string(63, 'x'));  // unchanged
}

TEST_CASE(
    "shm arena: one-host groups and their subgroups get one; tcp, split hosts and 0 bytes do not") {
    auto arena_of = [](int n, thread_ranks_options o) {
        std::vector<int> has(static_cast<std::size_t>(n), -1), sub(has);
        check_every_rank_ok(run_threads(
            n,
            [&](cc::process_group& pg) -> cc::task<> {
                has[static_cast<std::size_t>(pg.rank())] = pg.has_arena() ? 1 : 0;
                auto g = co_await pg.new_group({0, 1});
                if (g) sub[static_cast<std::size_t>(pg.rank())] = g->has_arena() ? 1 : 0;
                // The group works whatever it has.
                std::vector<std::int32_t> v(3, pg.rank() + 1);
                co_await pg.all_reduce(v);
                if (v[0] != n * (n + 1) / 2) throw std::runtime_error("wrong sum");
            },
            o));
        return std::pair{has, sub};
    };
    thread_ranks_options o;
    auto [has, sub] = arena_of(3, o);
    CHECK(has == std::vector<int>{1, 1, 1});
    CHECK(sub == std::vector<int>{1, 1, -1});
    o.limits.transport = cc::transport::transport_choice::tcp;
    CHECK(arena_of(3, o).first == std::vector<int>{0, 0, 0});
    o = {};
    o.host_tags = {"a", "a", "b"};
    CHECK(arena_of(3, o) == std::pair{std::vector<int>{0, 0, 0}, std::vector<int>{1, 1, -1}});
    o = {};
    o.limits.shm_arena_bytes = 0;
    CHECK(arena_of(3, o).first == std::vector<int>{0, 0, 0});
}

// A 1,000-element all_reduce on 3 ranks, `before` times by the group's own choice (the
// arena), then once more with rank 1 forcing recursive doubling, then a barrier (where a rank
// whose all_reduce ended learns the failure): every rank's error must name both algorithms.
static void check_forced_all_reduce_is_named(int before) {
    auto errors = run_threads(3, [before](cc::process_group& pg) -> cc::task<> {
        std::vector<std::int32_t> t(1000, 1);
        std::int32_t want = 1;
        for (int i = 0; i < before; ++i, want *= 3) co_await pg.all_reduce(t);
        if (t[0] != want) throw std::runtime_error("all_reduce: " + std::to_string(t[0]));
        if (pg.rank() == 1) {
            pg.set_algorithm(coll::collective_kind::all_reduce,
                             coll::algorithm::recursive_doubling);
        }
        co_await pg.all_reduce(t);
        co_await pg.barrier();
    });
    check_every_rank_names(errors, {"all_reduce(sum, int32 x 1000, shm)",
                                    "all_reduce(sum, int32 x 1000, recursive_doubling)"});
}

TEST_CASE("a group remembers its last choice per call only until set_algorithm") {
    // Every rank chooses the arena for the first two calls of this size, and remembers it.
    // Had rank 1 kept its remembered choice after set_algorithm, the third call would succeed.
    check_forced_all_reduce_is_named(2);
}

TEST_CASE(
    "a broadcast over messages where one rank chose the tree and the others the chain fails") {
    // Without an arena a broadcast of 4 MiB on 4 ranks goes along the chain of 1 MiB chunks;
    // rank 3, with chunks of 4 MiB, chooses the binomial tree. Every rank must fail naming
    // both algorithms within the timeout, not wait for chunks that never come.
    thread_ranks_options o;
    o.timeout = 5s;
    o.limits.shm_arena_bytes = 0;
    auto errors = run_threads(
        4,
        [](cc::process_group& pg) -> cc::task<> {
            std::vector<std::uint8_t> b(std::size_t{4} << 20, 1);
            co_await pg.broadcast(b, 0);
            if (pg.rank() == 3) pg.set_chunk_bytes(std::size_t{4} << 20);
            co_await pg.broadcast(b, 0);
            co_await pg.barrier();
        },
        o);
    check_every_rank_names(errors, {"chain)", "binomial)"});
}

TEST_CASE(
    "shm arena: the group chooses it without being told, as a rank that forces another finds out") {
    // Ranks 0 and 2 choose by themselves; rank 1 forces recursive doubling. If the group picked
    // it too, the call would succeed.
    check_forced_all_reduce_is_named(0);
    // What the choice is, size by size (docs/architecture.md, "The shared arena").
    using k = coll::collective_kind;
    auto pick = [](k kind, std::size_t bytes, int n) {
        return coll::select(kind, bytes, n, {}, {}, nullptr, true);
    };
    CHECK(pick(k::all_reduce, 4, 2) == coll::algorithm::shm);
    CHECK(pick(k::all_reduce, std::size_t{1} << 20, 2) == coll::algorithm::ring);
    CHECK(pick(k::all_reduce, std::size_t{64} << 20, 2) == coll::algorithm::shm);
    CHECK(pick(k::all_reduce, std::size_t{1} << 20, 4) == coll::algorithm::shm);
    CHECK(pick(k::broadcast, 4, 2) == coll::algorithm::shm);
    CHECK(pick(k::broadcast, std::size_t{1} << 20, 2) == coll::algorithm::binomial);
    CHECK(pick(k::all_gather, std::size_t{1} << 20, 2) == coll::algorithm::ring);
    // all_gather of 2 ranks whose arena makes no single copies (a slow or missing
    // process_vm_readv): the pair's ring at every size from the window's start (the data sets
    // trailed it up to 16 MiB and tied from 32); with single copies (8 KiB blocks), the arena's.
    CHECK(pick(k::all_gather, std::size_t{8} << 20, 2) == coll::algorithm::ring);
    CHECK(pick(k::all_gather, std::size_t{64} << 20, 2) == coll::algorithm::ring);
    CHECK(coll::select(k::all_gather, std::size_t{8} << 20, 2, {}, {}, nullptr, true, 8192) ==
          coll::algorithm::shm);
    // A single copy from a block beyond the ring's window (an option) leaves the data sets
    // between the two.
    CHECK(coll::select(k::all_gather, std::size_t{8} << 20, 2, {}, {}, nullptr, true,
                       std::size_t{64} << 20) == coll::algorithm::shm);
    CHECK(coll::select(k::all_gather, std::size_t{1} << 20, 2, {}, {}, nullptr, true,
                       std::size_t{64} << 20) == coll::algorithm::ring);
    // Small broadcasts: the arena's queue where it keeps 32 step places (up to 8 ranks), the
    // tree below 4 KiB where it keeps 8.
    CHECK(pick(k::broadcast, 4, 4) == coll::algorithm::shm);
    CHECK(pick(k::broadcast, 2048, 8) == coll::algorithm::shm);
    CHECK(pick(k::broadcast, 4, 9) == coll::algorithm::binomial);
    CHECK(pick(k::broadcast, 4095, 16) == coll::algorithm::binomial);
    CHECK(pick(k::broadcast, 4096, 16) == coll::algorithm::shm);
    CHECK(pick(k::broadcast, std::size_t{1} << 20, 4) == coll::algorithm::shm);
    CHECK(pick(k::all_gather, 4, 8) == coll::algorithm::shm);
    // reduce, gather and scatter in the step lines (4 KiB: reduce's buffer, gather's block,
    // scatter's n blocks), by messages beyond (on more than 2 ranks).
    CHECK(pick(k::reduce, 4, 2) == coll::algorithm::shm);
    CHECK(pick(k::reduce, 4096, 8) == coll::algorithm::shm);
    CHECK(pick(k::reduce, 4112, 2) == coll::algorithm::binomial);
    // On 3 to 8 ranks, a reduce from 128 KiB through the arena's data sets in slices; on 2
    // ranks and beyond 8 by the tree at every size beyond the lines.
    CHECK(pick(k::reduce, 4112, 4) == coll::algorithm::binomial);
    CHECK(pick(k::reduce, (std::size_t{128} << 10) - 4, 3) == coll::algorithm::binomial);
    CHECK(pick(k::reduce, std::size_t{128} << 10, 3) == coll::algorithm::shm);
    CHECK(pick(k::reduce, std::size_t{128} << 10, 8) == coll::algorithm::shm);
    CHECK(pick(k::reduce, std::size_t{64} << 20, 4) == coll::algorithm::shm);
    CHECK(pick(k::reduce, std::size_t{1} << 20, 2) == coll::algorithm::binomial);
    CHECK(pick(k::reduce, std::size_t{1} << 20, 9) == coll::algorithm::binomial);
    CHECK(pick(k::gather, 256, 8) == coll::algorithm::shm);
    CHECK(pick(k::scatter, 128, 2) == coll::algorithm::shm);
    // On 3 to 8 ranks gather and scatter beyond the lines through the arena too, below 1 MiB
    // in all (as on 2 ranks, half the L2 of the machine measured); by messages from there,
    // and on more ranks.
    CHECK(pick(k::gather, 8192, 4) == coll::algorithm::shm);
    CHECK(pick(k::scatter, 1024, 8) == coll::algorithm::shm);
    CHECK(pick(k::gather, (std::size_t{128} << 10) - 4, 8) == coll::algorithm::shm);
    CHECK(pick(k::scatter, (std::size_t{256} << 10) - 4, 4) == coll::algorithm::shm);
    CHECK(pick(k::gather, (std::size_t{256} << 10) - 4, 3) == coll::algorithm::shm);
    CHECK(pick(k::gather, std::size_t{256} << 10, 4) == coll::algorithm::linear);
    CHECK(pick(k::scatter, std::size_t{128} << 10, 8) == coll::algorithm::linear);
    CHECK(pick(k::gather, 8192, 9) == coll::algorithm::binomial);
    CHECK(pick(k::scatter, 1024, 9) == coll::algorithm::binomial);
    // On 2 ranks gather through the arena below 1 MiB in all (the gathered buffer, half the
    // 2 MiB L2 of the machine measured), a block of 512 KiB by messages; scatter through the
    // arena at every size.
    CHECK(pick(k::gather, std::size_t{256} << 10, 2) == coll::algorithm::shm);
    CHECK(pick(k::gather, (std::size_t{512} << 10) - 4, 2) == coll::algorithm::shm);
    CHECK(pick(k::gather, std::size_t{512} << 10, 2) == coll::algorithm::linear);
    CHECK(pick(k::scatter, std::size_t{512} << 10, 2) == coll::algorithm::shm);
    CHECK(pick(k::gather, std::size_t{1} << 20, 2) == coll::algorithm::linear);
    CHECK(pick(k::scatter, std::size_t{1} << 20, 2) == coll::algorithm::shm);
    CHECK(pick(k::scatter, std::size_t{32} << 20, 2) == coll::algorithm::shm);
    CHECK(pick(k::scatter, std::size_t{1} << 20, 4) == coll::algorithm::linear);
    // On 2 ranks, broadcast, scatter and gather by one message (the buffer, a block) from
    // 512 bytes (gather: beyond the 4 KiB of a step's lines) up to 32 KiB; the arena on
    // either side, and on 4 ranks.
    const std::pair<k, std::size_t> message_from[] = {
        {k::broadcast, 512}, {k::scatter, 512}, {k::gather, 4100}};
    for (const auto& window : message_from) {
        // (Not a structured binding: clang 14 cannot name one inside CAPTURE's lambda.)
        const k kind = window.first;
        const std::size_t from = window.second;
        CAPTURE(coll::kind_name(kind));
        const auto message =
            kind == k::broadcast ? coll::algorithm::binomial : coll::algorithm::linear;
        CHECK(pick(kind, from / 2, 2) == coll::algorithm::shm);
        CHECK(pick(kind, from, 2) == message);
        CHECK(pick(kind, std::size_t{16} << 10, 2) == message);
        CHECK(pick(kind, (std::size_t{32} << 10) - 4, 2) == message);
        CHECK(pick(kind, std::size_t{32} << 10, 2) == coll::algorithm::shm);
    }
    CHECK(pick(k::gather, 2048, 4) == coll::algorithm::shm);
    CHECK(pick(k::gather, 4096, 2) == coll::algorithm::shm);  // the whole of a step's lines
    // The window is the thresholds' own: closed, the arena keeps these sizes.
    coll::thresholds closed;
    closed.shm_pair_message_below = 0;
    for (k kind : {k::broadcast, k::gather, k::scatter}) {
        CHECK(coll::select(kind, 4096, 2, {}, closed, nullptr, true) == coll::algorithm::shm);
    }
    CHECK(pick(k::reduce, 2048, 2) == coll::algorithm::shm);  // reduce stays in the lines
    CHECK(coll::select(k::reduce, 4, 2, {}, {}, nullptr, false) == coll::algorithm::binomial);
    CHECK(pick(k::reduce_scatter, 8, 2) == coll::algorithm::shm);
    CHECK(pick(k::reduce_scatter, std::size_t{32} << 10, 2) == coll::algorithm::shm);
    CHECK(pick(k::reduce_scatter, std::size_t{64} << 10, 2) == coll::algorithm::ring);
    CHECK(pick(k::reduce_scatter, std::size_t{256} << 10, 4) == coll::algorithm::shm);
    CHECK(pick(k::reduce_scatter, std::size_t{512} << 10, 4) == coll::algorithm::ring);
    CHECK(pick(k::all_to_all, 8, 2) == coll::algorithm::shm);
    CHECK(pick(k::all_to_all, std::size_t{64} << 10, 2) == coll::algorithm::pairwise);
    CHECK(pick(k::all_to_all, 64, 8) == coll::algorithm::shm);
    CHECK(coll::select(k::reduce_scatter, 8, 2, {}, {}, nullptr, false) == coll::algorithm::ring);
    // Without an arena, small inputs of 4 or more ranks by a whole all_reduce (log2 n steps
    // against the ring's n - 1), up to the model's crossover; never on 2, 3, 5 or 6 ranks.
    auto by_messages = [](k kind, std::size_t bytes, int n) {
        return coll::select(kind, bytes, n, {}, {}, nullptr, false);
    };
    CHECK(by_messages(k::reduce_scatter, 64, 4) == coll::algorithm::recursive_doubling);
    CHECK(by_messages(k::reduce_scatter, std::size_t{32} << 10, 4) ==
          coll::algorithm::recursive_doubling);
    CHECK(by_messages(k::reduce_scatter, std::size_t{64} << 10, 4) == coll::algorithm::ring);
    CHECK(by_messages(k::reduce_scatter, std::size_t{128} << 10, 8) ==
          coll::algorithm::recursive_doubling);
    CHECK(by_messages(k::reduce_scatter, std::size_t{256} << 10, 8) == coll::algorithm::ring);
    for (int n : {2, 3, 5, 6}) {
        CHECK(coll::reduce_scatter_doubling_below({}, n) == 0);
        CHECK(by_messages(k::reduce_scatter, 4, n) == coll::algorithm::ring);
    }
    CHECK(coll::reduce_scatter_doubling_below({}, 16) > coll::reduce_scatter_doubling_below({}, 8));
    // all_to_all without an arena: blocks below 64 KiB all at once on more than 2 ranks,
    // larger ones by the exchange.
    CHECK(by_messages(k::all_to_all, std::size_t{128} << 10, 4) == coll::algorithm::linear);
    CHECK(by_messages(k::all_to_all, std::size_t{256} << 10, 4) == coll::algorithm::pairwise);
    CHECK(by_messages(k::all_to_all, 8, 2) == coll::algorithm::pairwise);  // one exchange
    // With an arena the arena's exchange keeps small inputs.
    CHECK(pick(k::reduce_scatter, 64, 4) == coll::algorithm::shm);
    CHECK(coll::select(k::all_reduce, 4, 2, {}, {}, nullptr, false) ==
          coll::algorithm::recursive_doubling);
    // With single copies from 256 KiB (2 ranks by default): all_gather stays on the arena,
    // broadcast up to 2 MiB.
    auto pick_single = [](k kind, std::size_t bytes, int n) {
        return coll::select(kind, bytes, n, {}, {}, nullptr, true, std::size_t{256} << 10);
    };
    CHECK(pick_single(k::all_gather, std::size_t{1} << 20, 2) == coll::algorithm::shm);
    CHECK(pick_single(k::all_gather, std::size_t{256} << 10, 2) == coll::algorithm::shm);
    CHECK(pick_single(k::broadcast, std::size_t{1} << 20, 2) == coll::algorithm::shm);
    CHECK(pick_single(k::broadcast, std::size_t{4} << 20, 2) == coll::algorithm::binomial);
    // all_reduce by its single copies from their size; by the ring below (1 MiB on 2 ranks).
    CHECK(pick_single(k::all_reduce, std::size_t{1} << 20, 2) == coll::algorithm::shm);
    CHECK(pick_single(k::all_reduce, std::size_t{256} << 10, 2) == coll::algorithm::shm);
    CHECK(pick(k::all_reduce, std::size_t{1} << 20, 2) == coll::algorithm::ring);
    // all_to_all by single copies at every size from a block of the single-copy size.
    CHECK(pick_single(k::all_to_all, std::size_t{512} << 10, 2) == coll::algorithm::shm);
    CHECK(pick_single(k::all_to_all, std::size_t{64} << 20, 2) == coll::algorithm::shm);
    CHECK(pick_single(k::all_to_all, std::size_t{256} << 10, 2) == coll::algorithm::pairwise);
    // On 3 to 8 ranks (scatter's single copies from blocks of 64 KiB, all_to_all's from 24 KiB
    // by default): scatter through the arena at every size from a block of that size, where
    // it would go by messages without; all_to_all likewise, where it would take the exchange.
    auto pick_from = [](k kind, std::size_t bytes, int n, std::size_t from) {
        return coll::select(kind, bytes, n, {}, {}, nullptr, true, from);
    };
    const std::size_t scatter_from = std::size_t{64} << 10, exchange_from = std::size_t{24} << 10;
    CHECK(pick_from(k::scatter, std::size_t{1} << 20, 4, scatter_from) == coll::algorithm::shm);
    CHECK(pick_from(k::scatter, std::size_t{1} << 20, 4, 0) == coll::algorithm::linear);
    CHECK(pick_from(k::scatter, std::size_t{16} << 20, 8, scatter_from) == coll::algorithm::shm);
    CHECK(pick_from(k::scatter, std::size_t{512} << 10, 3, scatter_from) == coll::algorithm::shm);
    CHECK(pick_from(k::scatter, std::size_t{32} << 10, 4, scatter_from) == coll::algorithm::shm);
    CHECK(pick_from(k::scatter, std::size_t{512} << 10, 4, std::size_t{1} << 20) ==
          coll::algorithm::linear);
    CHECK(pick_from(k::all_to_all, std::size_t{1} << 20, 4, exchange_from) == coll::algorithm::shm);
    CHECK(pick_from(k::all_to_all, std::size_t{64} << 20, 3, exchange_from) ==
          coll::algorithm::shm);
    // Past the data sets and without single copies, all at once on one host up to 16 MiB
    // blocks (every channel's ring busy at once), by the exchange from there; on more than 8
    // ranks (not measured) by the exchange, as without an arena.
    CHECK(pick_from(k::all_to_all, std::size_t{1} << 20, 4, 0) == coll::algorithm::linear);
    CHECK(pick_from(k::all_to_all, std::size_t{4} << 20, 8, std::size_t{1} << 20) ==
          coll::algorithm::linear);
    CHECK(pick_from(k::all_to_all, (std::size_t{48} << 20) - 3, 3, 0) == coll::algorithm::linear);
    CHECK(pick_from(k::all_to_all, std::size_t{48} << 20, 3, 0) == coll::algorithm::pairwise);
    CHECK(pick_from(k::all_to_all, std::size_t{64} << 20, 4, 0) == coll::algorithm::pairwise);
    CHECK(pick_from(k::all_to_all, std::size_t{4} << 20, 9, 0) == coll::algorithm::pairwise);
    CHECK(pick(k::all_to_all, std::size_t{1} << 20, 2) == coll::algorithm::pairwise);
}

TEST_CASE("select: the ring's and the chain's switch points move up with the ranks beyond 8") {
    using k = coll::collective_kind;
    const coll::thresholds t{};
    auto pick = [&](k kind, std::size_t bytes, int n) {
        return coll::select(kind, bytes, n, {}, t, nullptr, false);
    };
    // Up to 8 ranks, as measured.
    for (int n = 2; n <= 8; ++n) {
        for (auto kind : {k::all_reduce, k::broadcast, k::all_gather}) {
            CHECK(coll::rank_growth(kind, n) == 1.0);
        }
    }
    CHECK(pick(k::all_reduce, t.all_reduce_ring_bytes, 8) == coll::algorithm::ring);
    CHECK(pick(k::all_reduce, t.all_reduce_ring_bytes - 4, 8) ==
          coll::algorithm::recursive_doubling);
    CHECK(pick(k::all_gather, t.all_gather_ring_bytes, 8) == coll::algorithm::ring);
    // Beyond, growing with n; collectives without a latency-bound rival keep theirs, and the
    // broadcast counts its chain's pieces at every n (the test above).
    CHECK(coll::rank_growth(k::broadcast, 1024) == 1.0);
    for (auto kind : {k::all_reduce, k::all_gather}) {
        CAPTURE(coll::kind_name(kind));
        double before = 1.0;
        for (int n = 16; n <= 8192; n *= 2) {
            CAPTURE(n);
            CHECK(coll::rank_growth(kind, n) > before);
            before = coll::rank_growth(kind, n);
        }
    }
    CHECK(coll::rank_growth(k::reduce_scatter, 1024) == 1.0);
    // At 1,024 ranks: all_reduce's crossover (2 * 1023 - 10) / (10 - 2046 / 1024) against 8
    // ranks' 11 / 1.25, 28.9x: the ring from 256 KiB x 28.9 = 7.4 MiB on.
    CHECK(coll::rank_growth(k::all_reduce, 1024) == doctest::Approx(28.91).epsilon(0.01));
    CHECK(pick(k::all_reduce, std::size_t{1} << 20, 1024) == coll::algorithm::recursive_doubling);
    CHECK(pick(k::all_reduce, std::size_t{7} << 20, 1024) == coll::algorithm::recursive_doubling);
    CHECK(pick(k::all_reduce, std::size_t{8} << 20, 1024) == coll::algorithm::ring);
    // broadcast: more than 1022 / 9 pieces of 1 MiB, the chain from 114 MiB.
    CHECK(pick(k::broadcast, std::size_t{113} << 20, 1024) == coll::algorithm::binomial);
    CHECK(pick(k::broadcast, std::size_t{114} << 20, 1024) == coll::algorithm::chain);
    // all_gather: 1013 * 1024 / 1023 against 4 * 8 / 7, 222x: the ring from 55 MiB.
    CHECK(pick(k::all_gather, std::size_t{32} << 20, 1024) == coll::algorithm::bruck);
    CHECK(pick(k::all_gather, std::size_t{64} << 20, 1024) == coll::algorithm::ring);
    // A threshold the user set moves the same way.
    coll::thresholds mine;
    mine.all_reduce_ring_bytes = 1024;
    CHECK(coll::select(k::all_reduce, 1024, 8, {}, mine) == coll::algorithm::ring);
    CHECK(coll::select(k::all_reduce, 1024, 1024, {}, mine) == coll::algorithm::recursive_doubling);
    CHECK(coll::select(k::all_reduce, 30 * 1024, 1024, {}, mine) == coll::algorithm::ring);
}

TEST_CASE("select: a broadcast goes by the chain only where its pieces beat the tree's copies") {
    // The chain, n - 2 + k steps of a k-th of the message, against the tree's log2(n) steps
    // of the whole: a chain of one 1 MiB piece on 4 ranks is three copies one after another,
    // where the tree makes two (over TCP on 4 ranks of an AMD EPYC, 2026-11-29: 1,160 us at
    // 512 KiB by the chain against Open MPI's 307, coll_perf's binomial 270-410).
    using k = coll::collective_kind;
    const coll::thresholds t{};
    constexpr std::size_t MiB = std::size_t{1} << 20;
    auto pick = [&](std::size_t bytes, int n, const coll::thresholds& th) {
        return coll::select(k::broadcast, bytes, n, {}, th, nullptr, false);
    };
    CHECK(coll::chain_pieces_needed(2) == 0);
    CHECK(coll::chain_pieces_needed(3) == 2);
    CHECK(coll::chain_pieces_needed(4) == 3);
    CHECK(coll::chain_pieces_needed(8) == 4);
    CHECK(coll::chain_pieces_needed(1024) == 114);  // 1022 / 9 = 113.6
    for (int n : {3, 4, 5, 8, 16, 64, 1024, 8192}) {
        CAPTURE(n);
        const std::size_t need = coll::chain_pieces_needed(n);
        // (n - 2 + k) / (k log2 n) below 1 from `need` pieces on, not before.
        const double l = std::ceil(std::log2(static_cast<double>(n)));
        CHECK(n - 2.0 + static_cast<double>(need) < static_cast<double>(need) * l);
        CHECK(n - 2.0 + static_cast<double>(need - 1) >= static_cast<double>(need - 1) * l);
        CHECK(pick(need * MiB, n, t) == coll::algorithm::chain);
        CHECK(pick((need - 1) * MiB, n, t) == coll::algorithm::binomial);
        CHECK(pick(t.broadcast_chain_bytes, n, t) == coll::algorithm::binomial);
    }
    // Two ranks: the chain is the tree's one hop, at any size.
    CHECK(pick(std::size_t{1} << 30, 2, t) == coll::algorithm::binomial);
    // Smaller pieces make the chain's pipeline deeper sooner, down to its floor.
    coll::thresholds small = t;
    small.chain_piece_bytes = 64 << 10;
    CHECK(pick(3 * (64 << 10), 4, small) == coll::algorithm::binomial);  // under the floor
    CHECK(pick(t.broadcast_chain_bytes, 4, small) == coll::algorithm::chain);
    CHECK(pick(t.broadcast_chain_bytes, 64, small) == coll::algorithm::binomial);  // 8 of 13
}

TEST_CASE("broadcast_object_list: the group's chunk size is its chain's piece") {
    on_every_world([](cc::process_group& pg) -> cc::task<> {
        CHECK(pg.size_thresholds().chain_piece_bytes == pg.chunk_bytes());
        pg.set_chunk_bytes(64 << 10);
        CHECK(pg.size_thresholds().chain_piece_bytes == std::size_t{64} << 10);
        // 700 KiB in 11 pieces: the chain on 3-8 ranks (they need 2-4), the tree on 2.
        std::vector<std::string> objects(1);
        if (pg.rank() == 0) {
            objects[0].resize(700 << 10);
            for (std::size_t i = 0; i < objects[0].size(); ++i) objects[0][i] = char('a' + i % 23);
        }
        co_await pg.broadcast_object_list(objects, 0);
        REQUIRE(objects[0].size() == std::size_t{700} << 10);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < objects[0].size(); ++i)
            wrong += objects[0][i] != char('a' + i % 23);
        CHECK(wrong == 0);
        pg.set_chunk_bytes(std::size_t{1} << 20);
    });
}

TEST_CASE("all_to_all: a rank that gives equal split sizes and ranks that give none agree") {
    // Both are equal blocks and take the same path, the arena's at this size (a rank that
    // went pairwise here would wait for ranks waiting in the arena until the deadline).
    for (int n : {2, 3}) {
        CAPTURE(n);
        check_every_rank_ok(run_threads(n, [](cc::process_group& pg) -> cc::task<> {
            const int n = pg.size(), r = pg.rank();
            const std::size_t count = 4;
            std::vector<std::int32_t> in(count * static_cast<std::size_t>(n)), out(in.size());
            for (std::size_t i = 0; i < in.size(); ++i) in[i] = r * 1000 + static_cast<int>(i);
            if (r == 0) {
                co_await pg.all_to_all_single(out, in, std::vector<std::size_t>(n, count),
                                              std::vector<std::size_t>(n, count));
            } else {
                co_await pg.all_to_all_single(out, in);
            }
            for (std::size_t i = 0; i < out.size(); ++i) {
                const auto from = static_cast<int>(i / count);
                if (out[i] !=
                    from * 1000 + r * static_cast<int>(count) + static_cast<int>(i % count)) {
                    throw std::runtime_error("wrong value at " + std::to_string(i));
                }
            }
        }));
    }
}

TEST_CASE("shm arena: forcing it on a group without one is refused, naming the reason") {
    thread_ranks_options o;
    o.limits.transport = cc::transport::transport_choice::tcp;
    auto errors = run_threads(
        2,
        [](cc::process_group& pg) -> cc::task<> {
            pg.set_algorithm(coll::collective_kind::broadcast, coll::algorithm::shm);
            std::vector<float> v(4, 1.0f);
            co_await pg.broadcast(v, 0);
        },
        o);
    check_every_rank_names(errors, {"broadcast", "no shared-memory arena"});
}

TEST_CASE(
    "shm arena: broadcasts from changing roots, mixed with all_reduce, all_gather, gather, "
    "scatter, reduce_scatter and all_to_all, in a loop") {
    // The root goes on without waiting and the others wait for the root alone (broadcast_shm):
    // what any rank writes next must still wait for every rank. Sizes cross the small lines
    // (16 bytes), the step lines (1 and 4 KiB: all_gather's blocks go there, gather's and
    // scatter's too), a slot and the 16 KiB data set; with single copies from 16 KiB, the larger
    // ones copy straight from the ranks' buffers, between calls that go through the arena.
    thread_ranks_options o;
    o.limits.shm_arena_bytes = matrix_arena_bytes;
    // By default (`automatic_single_copy`) groups of 3 and 5 ranks mix the two: scatter's and
    // all_to_all's larger blocks by single copies, the other calls through the arena.
    constexpr std::size_t automatic = cc::transport::engine_options::automatic_single_copy;
    for (std::size_t single : {std::size_t{0}, std::size_t{16} << 10, automatic})
        for (int n : {2, 3, 5}) {
            CAPTURE(n);
            CAPTURE(single);
            o.limits.shm_arena_single_copy_bytes = single;
            check_every_rank_ok(run_threads(
                n,
                [single](cc::process_group& pg) -> cc::task<> {
                    for (auto k :
                         {coll::collective_kind::broadcast, coll::collective_kind::all_gather,
                          coll::collective_kind::gather, coll::collective_kind::scatter,
                          coll::collective_kind::all_to_all}) {
                        if (single != automatic && pg.arena_single_copy_from(k) != single) {
                            throw std::runtime_error(std::string(coll::kind_name(k)) +
                                                     ": single copies from " +
                                                     std::to_string(pg.arena_single_copy_from(k)));
                        }
                    }
                    int n = pg.size(), r = pg.rank();
                    for (auto k :
                         {coll::collective_kind::all_reduce, coll::collective_kind::broadcast,
                          coll::collective_kind::all_gather, coll::collective_kind::reduce_scatter,
                          coll::collective_kind::all_to_all, coll::collective_kind::gather,
                          coll::collective_kind::scatter}) {
                        pg.set_algorithm(k, coll::algorithm::shm);
                    }
                    // 40000 elements: 160,000 bytes, two whole pieces of a backward sweep
                    // and a shorter one (shm_arena::sweep_piece_bytes).
                    const std::size_t sizes[] = {1, 6, 7, 100, 256, 1024, 4096, 5000, 40000};
                    for (int it = 0; it < 60; ++it) {
                        std::size_t count = sizes[static_cast<std::size_t>(it) % std::size(sizes)];
                        int root = (it * 7) % n;
                        // Every element differs, and so does every rank's block of the
                        // all_gather: a piece or block copied to the wrong place shows.
                        auto sent = [it](std::size_t j) {
                            return (it + 1) * 100000 + static_cast<std::int32_t>(j);
                        };
                        std::vector<std::int32_t> b(count, -1);
                        for (std::size_t j = 0; j < count && r == root; ++j) b[j] = sent(j);
                        co_await pg.broadcast(b, root);
                        if (it % 3 == 0) continue;  // broadcasts back to back too
                        std::vector<std::int32_t> s(count, r + it);
                        co_await pg.all_reduce(s);
                        std::vector<std::int32_t> mine(count);
                        for (std::size_t j = 0; j < count; ++j) mine[j] = b[j] * 8 + r;
                        std::vector<std::int32_t> g(count * static_cast<std::size_t>(n));
                        co_await pg.all_gather_into(g, mine);
                        for (std::size_t i = 0; i < g.size(); ++i) {
                            std::size_t j = i % count;
                            auto from = static_cast<std::int32_t>(i / count);
                            if (b[j] != sent(j) || s[j] != n * it + n * (n - 1) / 2 ||
                                g[i] != sent(j) * 8 + from) {
                                throw std::runtime_error("iteration " + std::to_string(it) +
                                                         ": wrong value at " + std::to_string(i));
                            }
                        }
                        // gather and scatter by the same root: rank r's block is its `mine`.
                        std::vector<std::int32_t> gathered(r == root ? g.size() : 0),
                            scattered(count), source;
                        co_await pg.gather_into(mine, gathered, root);
                        if (r == root) source = g;
                        co_await pg.scatter_from(scattered, source, root);
                        if ((r == root && gathered != g) || scattered != mine) {
                            throw std::runtime_error("iteration " + std::to_string(it) +
                                                     ": gather or scatter wrong");
                        }
                        if (it % 3 == 1) continue;
                        // g holds block p = what rank p sent: reduce_scatter sums block r of
                        // every rank's g (n equal copies), all_to_all swaps g's blocks.
                        std::vector<std::int32_t> rs(count), a2a(g.size());
                        co_await pg.reduce_scatter_into(rs, g);
                        co_await pg.all_to_all_single(a2a, g);
                        for (std::size_t i = 0; i < g.size(); ++i) {
                            const bool rs_wrong = i < count && rs[i] != n * g[r * count + i];
                            if (rs_wrong || a2a[i] != g[r * count + i % count]) {
                                throw std::runtime_error(
                                    "iteration " + std::to_string(it) +
                                    ": reduce_scatter or all_to_all wrong at " + std::to_string(i));
                            }
                        }
                    }
                },
                o));
        }
}

TEST_CASE(
    "shm arena: single copies by default: every call from 16 KiB on 2 ranks (all_gather from "
    "8 KiB blocks, all_reduce from the L2's size; where a process_vm_readv is slow, from the L2 "
    "for broadcast, half of it for the blocks of gather, scatter and all_to_all (up to 8 L2s), "
    "none for all_gather and all_reduce); scatter from 64 KiB and all_to_all from 24 KiB blocks "
    "on 3 to 8 ranks (where slow, scatter from the L2 over the ranks, all_to_all none); none "
    "beyond") {
    // Measured (docs/performance.md, "Single copies of scatter and all_to_all on 3 to 8
    // ranks"): on more than 2 ranks broadcast, gather and all_gather were slower by single
    // copies, scatter and all_to_all faster from those blocks. Groups of more than 2 ranks
    // made none before, and 2-rank all_gathers none below 16 KiB blocks ("all_gather of 2
    // ranks by single copies from 8 KiB blocks").
    using k = coll::collective_kind;
    const std::size_t kib = 1024;
    struct expected {
        int n;
        std::size_t broadcast, all_gather, gather, scatter, all_to_all;
    };
    // Rank 0's cost of a process_vm_readv decides the 2-rank sizes; the threads share it.
    const std::size_t l2 = cc::machine_cache_sizes().l2;
    const std::size_t l2_or_2m = l2 > 0 ? l2 : 2048 * kib;
    const bool slow =
        cc::transport::detail::single_copy_cost() >= cc::transport::detail::slow_single_copy;
    const expected pair = slow ? expected{2, l2_or_2m, 0, l2_or_2m / 2, l2_or_2m / 2, l2_or_2m / 2}
                               : expected{2, 16 * kib, 8 * kib, 16 * kib, 16 * kib, 16 * kib};
    const std::string cost = "a process_vm_readv of 64 B costs " +
                             std::to_string(cc::transport::detail::single_copy_cost().count()) +
                             " ns here";
    MESSAGE(cost);
    auto more = [&](int n) {
        const std::size_t per_rank = l2_or_2m / static_cast<std::size_t>(n);
        return slow ? expected{n, 0, 0, 0, std::max(64 * kib, per_rank), 0}
                    : expected{n, 0, 0, 0, 64 * kib, 24 * kib};
    };
    for (const expected& e : {pair, more(3), more(4), more(8), expected{9, 0, 0, 0, 0, 0}}) {
        CAPTURE(e.n);
        thread_ranks_options o;
        o.limits.shm_arena_bytes = matrix_arena_bytes;
        std::vector<std::size_t> got(6, 1), below(6, 1);
        check_every_rank_ok(run_threads(
            e.n,
            [&got, &below](cc::process_group& pg) -> cc::task<> {
                if (pg.rank() == pg.size() - 1) {
                    if (!pg.has_arena()) throw std::runtime_error("no arena");
                    int i = 0;
                    for (k kind : {k::broadcast, k::all_gather, k::gather, k::scatter,
                                   k::all_to_all, k::all_reduce}) {
                        below[static_cast<std::size_t>(i)] = pg.arena_single_copy_below(kind);
                        got[static_cast<std::size_t>(i++)] = pg.arena_single_copy_from(kind);
                    }
                }
                co_return;
            },
            o));
        CHECK(got[0] == e.broadcast);
        CHECK(got[1] == e.all_gather);
        CHECK(got[2] == e.gather);
        CHECK(got[3] == e.scatter);
        CHECK(got[4] == e.all_to_all);
        // all_reduce on 2 ranks from a buffer the size of rank 0's L2 (2 MiB where not known),
        // none where a process_vm_readv is slow.
        CHECK(got[5] == (e.n == 2 && !slow ? l2_or_2m : 0));
        // The one bound: all_to_all of 2 ranks where a process_vm_readv is slow.
        const bool bounded = slow && e.n == 2;
        CHECK(below == std::vector<std::size_t>{0, 0, 0, 0, bounded ? 8 * l2_or_2m : 0, 0});
    }
}

TEST_CASE(
    "shm arena: a root of small broadcasts runs ahead of readers that have not come yet "
    "without waiting once: 24 calls on 2 ranks, 96 on 3 to 8") {
    // Groups of 3 to 8 ranks keep 128 step places per rank, 2 ranks 32
    // (transport::detail::arena_steps_for): the root writes its next calls' lines while the
    // others are still asleep, each call done at once, its reactor not turning once. With 8
    // places it waited at the 8th call; with 32 (3 to 8 ranks until 2026-12-02), at the 32nd.
    thread_ranks_options o;
    o.limits.shm_arena_bytes = matrix_arena_bytes;
    CHECK(cc::transport::detail::arena_steps_for(2) == 32);
    CHECK(cc::transport::detail::arena_steps_for(3) == 128);
    CHECK(cc::transport::detail::arena_steps_for(8) == 128);
    CHECK(cc::transport::detail::arena_steps_for(9) == 8);
    for (const auto& run : {std::pair{2, 24}, std::pair{3, 96}, std::pair{8, 96}}) {
        const int n = run.first, calls = run.second;
        CAPTURE(n);
        std::uint64_t turns_ahead = 1;
        check_every_rank_ok(run_threads(
            n,
            [&turns_ahead, calls](cc::process_group& pg) -> cc::task<> {
                pg.set_algorithm(coll::collective_kind::broadcast, coll::algorithm::shm);
                std::vector<std::int32_t> b(4);
                co_await pg.barrier();
                if (pg.rank() != 0) {
                    // Asleep, its reactor stopped: the root's calls cannot find it at any step.
                    std::this_thread::sleep_for(std::chrono::milliseconds(100));
                } else {
                    const std::uint64_t before = pg.reactor().stats().turns;
                    for (int it = 0; it < calls; ++it) {
                        b.assign(4, it);
                        co_await pg.broadcast(b, 0);
                    }
                    turns_ahead = pg.reactor().stats().turns - before;
                }
                for (int it = 0; it < calls; ++it) {
                    if (pg.rank() != 0) {
                        b.assign(4, -1);
                        co_await pg.broadcast(b, 0);
                        if (b != std::vector<std::int32_t>(4, it))
                            throw std::runtime_error("call " + std::to_string(it) + " read wrong");
                    }
                }
                co_await pg.barrier();
            },
            o));
        CHECK(turns_ahead == 0);
    }
}

TEST_CASE(
    "shm arena: small broadcasts, reduces, gathers and scatters from changing roots run ahead "
    "as a queue, between calls through the data sets") {
    // The ranks that only write (a broadcast's or scatter's root, a reduce's or gather's
    // others) go on without waiting and write their step lines again up to arena_steps_for(n) steps
    // ahead of the slowest reader (shm_arena::settle_lines); a call through the data sets
    // (an all_reduce of 5,000 elements) waits for every step gone past first. Every value
    // differs by iteration, rank and element: a line read too late or too soon shows.
    thread_ranks_options o;
    o.limits.shm_arena_bytes = matrix_arena_bytes;
    // 9 ranks: a group with 8 step places per rank (arena_steps_for), 2 ranks 32, the others
    // 128.
    for (int n : {2, 3, 5, 9}) {
        CAPTURE(n);
        check_every_rank_ok(run_threads(
            n,
            [](cc::process_group& pg) -> cc::task<> {
                int n = pg.size(), r = pg.rank();
                for (auto k : {coll::collective_kind::broadcast, coll::collective_kind::reduce,
                               coll::collective_kind::gather, coll::collective_kind::scatter}) {
                    pg.set_algorithm(k, coll::algorithm::shm);
                }
                auto fail = [](int it, const char* what) {
                    throw std::runtime_error("iteration " + std::to_string(it) + ": " + what +
                                             " wrong");
                };
                // A root far ahead: the others start late, and the root's writes must wait
                // for their reads once it is arena_steps_for(n) calls ahead (not overwrite them):
                // twice as many calls as the places.
                if (r != 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
                const auto ahead = static_cast<int>(2 * cc::transport::detail::arena_steps_for(n));
                for (int it = 0; it < ahead; ++it) {
                    std::vector<std::int32_t> b(5, r == 0 ? it : -1);
                    co_await pg.broadcast(b, 0);
                    if (b != std::vector<std::int32_t>(5, it)) fail(it, "broadcast ahead");
                }
                // 1,024 int32: the whole 4 KiB of a step's lines.
                const std::size_t counts[] = {1, 4, 5, 1024};
                for (int it = 0; it < 400; ++it) {
                    const std::size_t count = counts[static_cast<std::size_t>(it) % 4];
                    const int root = (it / 4) % n;
                    auto v = [it](int rank, std::size_t j) {
                        return it * 1000 + rank * 100 + static_cast<std::int32_t>(j);
                    };
                    std::vector<std::int32_t> b(count, -1);
                    if (r == root)
                        for (std::size_t j = 0; j < count; ++j) b[j] = v(root, j);
                    co_await pg.broadcast(b, root);
                    for (std::size_t j = 0; j < count; ++j)
                        if (b[j] != v(root, j)) fail(it, "broadcast");
                    std::vector<std::int32_t> red(count);
                    for (std::size_t j = 0; j < count; ++j) red[j] = v(r, j);
                    co_await pg.reduce(red, root);
                    for (std::size_t j = 0; j < count && r == root; ++j) {
                        std::int32_t want = 0;
                        for (int p = 0; p < n; ++p) want += v(p, j);
                        if (red[j] != want) fail(it, "reduce");
                    }
                    // gather and scatter blocks of count / n (at least 1).
                    const std::size_t block = std::max<std::size_t>(count / n, 1);
                    std::vector<std::int32_t> in(block), all(r == root ? block * n : 0);
                    for (std::size_t j = 0; j < block; ++j) in[j] = v(r, j);
                    co_await pg.gather_into(in, all, root);
                    for (std::size_t i = 0; i < all.size(); ++i)
                        if (all[i] != v(static_cast<int>(i / block), i % block)) fail(it, "gather");
                    std::vector<std::int32_t> part(block), whole;
                    if (r == root) whole = all;
                    co_await pg.scatter_from(part, whole, root);
                    if (part != in) fail(it, "scatter");
                    if (it % 17 == 0) {
                        std::vector<std::int32_t> big(5000, r + it);
                        co_await pg.all_reduce(big);
                        for (auto x : big)
                            if (x != n * it + n * (n - 1) / 2) fail(it, "all_reduce");
                    }
                }
            },
            o));
    }
}
