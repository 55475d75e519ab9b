// The GPU layer on a GPU: every NCCL operation and element type on a world of one, the
// one-GPU-per-rank check, and CUDA buffers staged over CPU groups with 2-4 ranks sharing one
// GPU. Exits 77 (Meson's SKIP) where no CUDA device is visible.

#define DOCTEST_CONFIG_IMPLEMENT
#include "../support/ranks.hpp"
#include "values.hpp"

#include <corocoll/gpu.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

namespace cc = corocoll;
using corocoll_test::number;
using corocoll_test::ramp;
using corocoll_test::read;
using corocoll_test::same;
using corocoll_test::value;
using namespace std::chrono_literals;

namespace {

// A world of one: rank 0 through a file store.
template <class Body>
void with_nccl_world_of_one(Body body) {
    cc::io::reactor r;
    cc::init_options o;
    o.backend = "nccl";
    o.rank = 0;
    o.world_size = 1;
    o.timeout = 60s;
    static int n = 0;
    std::string path =
        "/tmp/corocoll_gpu_device_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++);
    o.init_method = "file://" + path;
    r.run([&]() -> cc::task<> {
        auto pg = co_await cc::gpu::init_process_group(r, o);
        co_await corocoll_test::run_then_close(*pg, body);
    }());
    std::remove(path.c_str());
}

template <class T>
cc::task<> every_op(cc::gpu::nccl_group& pg) {
    const std::size_t n = 1000;
    auto host = ramp<T>(n, 1);
    cc::gpu::device_buffer<T> a(n), b(n);
    a.copy_from(host);

    co_await pg.all_reduce(a, cc::reduce_op::sum);
    same(read(a), host, "all_reduce sum");
    for (auto op :
         {cc::reduce_op::product, cc::reduce_op::min, cc::reduce_op::max, cc::reduce_op::avg}) {
        co_await pg.all_reduce(a, op);
        same(read(a), host, cc::op_name(op));
    }
    co_await pg.broadcast(a, 0);
    same(read(a), host, "broadcast");
    co_await pg.reduce(a, 0, cc::reduce_op::max);
    same(read(a), host, "reduce");
    co_await pg.reduce(a, 0, cc::reduce_op::avg);  // avg of one rank: NCCL 2.28 lacks fp8 there
    same(read(a), host, "reduce avg");
    co_await pg.all_gather_into(b, a);
    same(read(b), host, "all_gather_into");
    std::vector<cc::gpu::device_span<T>> list{b.span()};
    co_await pg.all_gather(list, a.span());
    same(read(b), host, "all_gather");
    co_await pg.reduce_scatter_into(b, a);
    same(read(b), host, "reduce_scatter_into");
    co_await pg.reduce_scatter_into(b, a, cc::reduce_op::avg);
    same(read(b), host, "reduce_scatter_into avg");
    co_await pg.all_to_all_single(b, a);
    same(read(b), host, "all_to_all_single");
    // Named: g++ 12 rejects a braced list in a co_await operand ("array used as initializer").
    std::vector<std::size_t> splits{n};
    co_await pg.all_to_all_single(b, a, splits, splits);
    same(read(b), host, "all_to_all_single with split sizes");
    co_await pg.gather_into(a, b, 0);
    same(read(b), host, "gather_into");
    co_await pg.scatter_from(b, a, 0);
    same(read(b), host, "scatter_from");
    std::vector<cc::gpu::device_span<T>> ins{a.span()}, outs{b.span()};
    co_await pg.all_to_all(outs, ins);
    same(read(b), host, "all_to_all");
    auto ops = pg.batch_isend_irecv(
        {cc::gpu::nccl_p2p_op::isend(a, 0), cc::gpu::nccl_p2p_op::irecv(b, 0)});
    for (auto& w : ops) CHECK(co_await w == 0);
    same(read(b), host, "batch_isend_irecv to itself");
    co_await pg.barrier();
}

}  // namespace

TEST_CASE("NCCL, world of one: every op on every element type NCCL has") {
    with_nccl_world_of_one([](cc::gpu::nccl_group& pg) -> cc::task<> {
        int cc_major = 0;
        cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, pg.device());
        // NCCL reduces FP8 on Hopper and later.
        co_await corocoll_test::for_each_nccl_type([&]<class T>() { return every_op<T>(pg); },
                                                   cc_major >= 9);
    });
}

TEST_CASE("NCCL: bad arguments are refused before the enqueue, in the CPU group's words") {
    with_nccl_world_of_one([](cc::gpu::nccl_group& pg) -> cc::task<> {
        cc::gpu::device_buffer<int> a(8), b(5);
        CHECK_THROWS_WITH_AS((void)pg.all_reduce(a, cc::reduce_op::band),
                             doctest::Contains("not available with the NCCL backend"),
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS((void)pg.broadcast(a, 1),
                             doctest::Contains("root 1 is outside [0, 1)"), std::invalid_argument);
        CHECK_THROWS_WITH_AS((void)pg.send(a, 0, 7), doctest::Contains("NCCL has no tags"),
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS((void)pg.recv(a, -1), doctest::Contains("any source"),
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS((void)pg.all_gather_into(b, a),
                             "corocoll: rank 0: all_gather: output has 5 elements, 8 expected",
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS((void)pg.all_to_all_single(a, a, {4, 4}),
                             "corocoll: rank 0: all_to_all: output splits has 2 elements, 1 "
                             "expected",
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS((void)pg.all_to_all_single(a, a, {}, {7}),
                             "corocoll: rank 0: all_to_all: input has 8 elements, 7 expected",
                             std::invalid_argument);
        std::vector<cc::gpu::device_span<int>> one{a.span()}, two{a.span(), a.span()};
        CHECK_THROWS_WITH_AS((void)pg.all_to_all(two, one),
                             "corocoll: rank 0: all_to_all: output list has 2 elements, 1 "
                             "expected",
                             std::invalid_argument);
        std::vector<cc::gpu::device_span<int>> short_entry{b.span()};
        auto out = a.span();
        CHECK_THROWS_WITH_AS((void)pg.scatter(out, short_entry, 0),
                             "corocoll: rank 0: scatter: scatter_list entry has 5 elements, 8 "
                             "expected",
                             std::invalid_argument);
        co_await pg.all_reduce(a);  // still usable
        CHECK_FALSE(pg.failed());
    });
}

TEST_CASE("NCCL: two ranks on one GPU are refused, both named") {
    if (cc::gpu::device_count() > 1) return;  // each rank would get a GPU of its own
    auto server = std::make_shared<cc::rendezvous::tcp_store_server>(cc::io::endpoint::loopback(0));
    std::vector<std::string> errors(2);
    std::vector<std::jthread> ranks;
    for (int rank = 0; rank < 2; ++rank) {
        ranks.emplace_back([&, rank] {
            try {
                cc::io::reactor r;
                r.run([&]() -> cc::task<> {
                    cc::init_options o;
                    o.backend = "nccl";
                    o.rank = rank;
                    o.world_size = 2;
                    o.timeout = 20s;
                    o.store = co_await cc::rendezvous::tcp_store::connect(
                        r, server->local_endpoint(), 20s);
                    auto pg = co_await cc::gpu::init_process_group(r, o);
                    co_await pg->close();
                }());
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(rank)] = e.what();
            }
        });
    }
    ranks.clear();
    for (const auto& e : errors) {
        CAPTURE(e);
        CHECK(e.find("ranks 0 and 1 both use") != std::string::npos);
        CHECK(e.find("a GPU of its own per rank") != std::string::npos);
    }
}

namespace {

template <class T>
cc::task<> staged_ops(cc::process_group& pg) {
    cc::gpu::staged st(pg);
    int n = pg.size(), me = pg.rank();
    const std::size_t count = 3000;  // not a multiple of the chunk size
    cc::gpu::device_buffer<T> a(count), all(count * static_cast<std::size_t>(n)), part(count);

    // all_reduce: sum of ramps.
    a.copy_from(ramp<T>(count, me));
    co_await st.all_reduce(a);
    std::vector<T> want(count);
    for (std::size_t i = 0; i < count; ++i) {
        double s = 0;
        for (int p = 0; p < n; ++p) s += (p + static_cast<int>(i)) % 7;
        want[i] = value<T>(s);
    }
    same(read(a), want, "staged all_reduce");

    // broadcast from the last rank.
    a.copy_from(ramp<T>(count, 100 + me));
    co_await st.broadcast(a, n - 1);
    same(read(a), ramp<T>(count, 100 + n - 1), "staged broadcast");

    // all_gather_into.
    a.copy_from(ramp<T>(count, me));
    co_await st.all_gather_into(all, a);
    std::vector<T> gathered;
    for (int p = 0; p < n; ++p) {
        auto r = ramp<T>(count, p);
        gathered.insert(gathered.end(), r.begin(), r.end());
    }
    same(read(all), gathered, "staged all_gather_into");

    // reduce_scatter_into: every rank gives the gathered vector; block `me`, times n.
    all.copy_from(gathered);
    co_await st.reduce_scatter_into(part, all);
    auto mine = ramp<T>(count, me);
    for (auto& x : mine) x = value<T>(number(x) * n);
    same(read(part), mine, "staged reduce_scatter_into");

    // all_to_all_single: block p of rank q's input is ramp(q * 10 + p).
    std::vector<T> blocks, expect;
    for (int p = 0; p < n; ++p) {
        auto r = ramp<T>(count, me * 10 + p);
        blocks.insert(blocks.end(), r.begin(), r.end());
        auto e = ramp<T>(count, p * 10 + me);
        expect.insert(expect.end(), e.begin(), e.end());
    }
    cc::gpu::device_buffer<T> out(count * static_cast<std::size_t>(n));
    all.copy_from(blocks);
    co_await st.all_to_all_single(out, all);
    same(read(out), expect, "staged all_to_all_single");

    // gather_into rank 0, scatter_from rank 0.
    a.copy_from(ramp<T>(count, me));
    co_await st.gather_into(a, all, 0);
    if (me == 0) same(read(all), gathered, "staged gather_into");
    all.copy_from(gathered);
    co_await st.scatter_from(a, all, 0);
    same(read(a), ramp<T>(count, me), "staged scatter_from");

    // send/recv around the ring, both at once.
    int right = (me + 1) % n, left = (me + n - 1) % n;
    a.copy_from(ramp<T>(count, me + 50));
    cc::gpu::device_buffer<T> in(count);
    auto [sent, from] = co_await cc::when_all(st.send(a, right), st.recv(in, left));
    (void)sent;
    CHECK(from == left);
    same(read(in), ramp<T>(count, left + 50), "staged send/recv");
    co_await st.barrier();
}

}  // namespace

TEST_CASE("CUDA buffers over CPU groups: 2, 3 and 4 ranks sharing one GPU") {
    for (int n : {2, 3, 4}) {
        CAPTURE(n);
        auto errors = corocoll_test::run_threads(n, [](cc::process_group& pg) -> cc::task<> {
            co_await staged_ops<float>(pg);
            co_await staged_ops<std::int64_t>(pg);
            co_await staged_ops<__half>(pg);
            co_await staged_ops<__nv_bfloat16>(pg);
        });
        for (const auto& e : errors) CHECK(corocoll_test::what(e) == "");
    }
}

int main(int argc, char** argv) {
    if (cc::gpu::device_count() == 0) {
        std::printf("SKIP: no CUDA device: %s\n", cc::gpu::no_device_reason().c_str());
        return 77;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
