// NCCL groups of 1-4 ranks on the simulator (tests/gpu/sim/): every operation on every
// element type with results checked against what each rank gave, point-to-point and batches,
// and the failure paths (an injected hang ends in a timeout that names the op and the rank;
// an injected asynchronous error fails every pending and later op on every rank). Ranks are
// threads, each with its reactor and a simulated device of its own. Built with -Dgpu_sim=true
// only: it injects faults through the simulator's test API.

#include "../support/ranks.hpp"
#include "sim/sim.hpp"
#include "values.hpp"

#include <corocoll/gpu.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <system_error>
#include <vector>

namespace cc = corocoll;
using corocoll_test::number;
using corocoll_test::ramp;
using corocoll_test::read;
using corocoll_test::same;
using corocoll_test::value;
using namespace std::chrono_literals;

namespace {

using body_fn = std::function<cc::task<>(cc::gpu::nccl_group&)>;

// `n` ranks as threads, each setting up an NCCL group through a store served here, running
// `body` and closing the group. Each rank's exception, null where it finished.
std::vector<std::exception_ptr> run_nccl(int n, const body_fn& body,
                                         std::chrono::milliseconds timeout = 20s) {
    auto server = std::make_shared<cc::rendezvous::tcp_store_server>(cc::io::endpoint::loopback(0));
    return corocoll_test::run_ranks(n, [&](int rank, cc::io::reactor& r) -> cc::task<> {
        cc::init_options o;
        o.backend = "nccl";
        o.rank = rank;
        o.world_size = n;
        o.timeout = timeout;
        o.store = co_await cc::rendezvous::tcp_store::connect(r, server->local_endpoint(), 20s);
        auto pg = co_await cc::gpu::init_process_group(r, o);
        co_await corocoll_test::run_then_close(*pg, body);
    });
}

// Values 0-2: sums, products and averages of up to 4 ranks stay exact in fp8 too.
template <class T>
std::vector<T> small(std::size_t count, int base) {
    return ramp<T>(count, base, 3);
}

// What op gives over the ranks' `small(count, rank)`.
template <class T>
std::vector<T> expected(int n, std::size_t count, cc::reduce_op op) {
    std::vector<T> want(count);
    for (std::size_t i = 0; i < count; ++i) {
        double acc = number(small<T>(count, 0)[i]);
        for (int p = 1; p < n; ++p) {
            double v = number(small<T>(count, p)[i]);
            if (op == cc::reduce_op::product) acc *= v;
            if (op == cc::reduce_op::min) acc = std::min(acc, v);
            if (op == cc::reduce_op::max) acc = std::max(acc, v);
            if (op == cc::reduce_op::sum || op == cc::reduce_op::avg) acc += v;
        }
        if (op == cc::reduce_op::avg) {
            acc = std::is_integral_v<T> ? std::trunc(acc / n) : acc / n;
        }
        want[i] = value<T>(acc);
    }
    return want;
}

template <class T>
std::vector<T> concat(const std::vector<std::vector<T>>& parts) {
    std::vector<T> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

// Every operation of the group on `count` elements of T, each result checked.
template <class T>
cc::task<> every_op(cc::gpu::nccl_group& pg, std::size_t count) {
    using buffer = cc::gpu::device_buffer<T>;
    using span = cc::gpu::device_span<T>;
    int n = pg.size(), me = pg.rank();
    auto un = static_cast<std::size_t>(n);
    auto mine = small<T>(count, me);
    buffer a(count), b(count), all(count * un), all2(count * un);

    for (auto op : {cc::reduce_op::sum, cc::reduce_op::product, cc::reduce_op::min,
                    cc::reduce_op::max, cc::reduce_op::avg}) {
        a.copy_from(mine);
        co_await pg.all_reduce(a, op);
        same(read(a), expected<T>(n, count, op), cc::op_name(op),
             op == cc::reduce_op::avg && !std::is_integral_v<T> ? 0.07 : 0);
    }
    a.copy_from(small<T>(count, me + 1));
    co_await pg.broadcast(a, n - 1);
    same(read(a), small<T>(count, n), "broadcast");

    a.copy_from(mine);
    co_await pg.reduce(a, 0, cc::reduce_op::max);
    same(read(a), me == 0 ? expected<T>(n, count, cc::reduce_op::max) : mine, "reduce");

    std::vector<std::vector<T>> each;
    for (int p = 0; p < n; ++p) each.push_back(small<T>(count, p));
    a.copy_from(mine);
    co_await pg.all_gather_into(all, a);
    same(read(all), concat(each), "all_gather_into");
    std::vector<buffer> list;
    for (int p = 0; p < n; ++p) list.emplace_back(count);
    std::vector<span> views;
    for (auto& l : list) views.push_back(l.span());
    co_await pg.all_gather(views, a.span());
    for (int p = 0; p < n; ++p)
        same(read(list[static_cast<std::size_t>(p)]), each[static_cast<std::size_t>(p)],
             "all_gather");

    // reduce_scatter: every rank gives the blocks small(p); block me of the sum is n * small(me).
    all.copy_from(concat(each));
    co_await pg.reduce_scatter_into(b, all);
    auto times_n = mine;
    for (auto& x : times_n) x = value<T>(number(x) * n);
    same(read(b), times_n, "reduce_scatter_into");
    for (int p = 0; p < n; ++p)
        list[static_cast<std::size_t>(p)].copy_from(each[static_cast<std::size_t>(p)]);
    auto b_view = b.span();
    co_await pg.reduce_scatter(b_view, views);
    same(read(b), times_n, "reduce_scatter");

    // all_to_all: block q of rank p is small(p * n + q); rank me gets small(p * n + me).
    std::vector<std::vector<T>> out_blocks, in_blocks;
    for (int q = 0; q < n; ++q) {
        out_blocks.push_back(small<T>(count, me * n + q));
        in_blocks.push_back(small<T>(count, q * n + me));
    }
    all.copy_from(concat(out_blocks));
    co_await pg.all_to_all_single(all2, all);
    same(read(all2), concat(in_blocks), "all_to_all_single");
    std::vector<std::size_t> splits(un, count);
    co_await pg.all_to_all_single(all2, all, splits, splits);
    same(read(all2), concat(in_blocks), "all_to_all_single with split sizes");
    for (int q = 0; q < n; ++q)
        list[static_cast<std::size_t>(q)].copy_from(out_blocks[static_cast<std::size_t>(q)]);
    std::vector<buffer> got;
    for (int q = 0; q < n; ++q) got.emplace_back(count);
    std::vector<span> got_views;
    for (auto& g : got) got_views.push_back(g.span());
    co_await pg.all_to_all(got_views, views);
    for (int q = 0; q < n; ++q)
        same(read(got[static_cast<std::size_t>(q)]), in_blocks[static_cast<std::size_t>(q)],
             "all_to_all");

    a.copy_from(mine);
    co_await pg.gather_into(a, all, n - 1);
    if (me == n - 1) same(read(all), concat(each), "gather_into");
    co_await pg.gather(a.span(), got_views, 0);
    if (me == 0) {
        for (int p = 0; p < n; ++p)
            same(read(got[static_cast<std::size_t>(p)]), each[static_cast<std::size_t>(p)],
                 "gather");
    }
    all.copy_from(concat(each));
    b.copy_from(small<T>(count, 99));
    co_await pg.scatter_from(b, all, 0);
    same(read(b), mine, "scatter_from");
    auto out = b.span();
    co_await pg.scatter(out, views, n - 1);
    same(read(b), small<T>(count, (n - 1) * n + me), "scatter");  // views hold root's blocks

    // A ring, both directions at once, as one batch.
    int right = (me + 1) % n, left = (me + n - 1) % n;
    a.copy_from(small<T>(count, me + 5));
    auto ops = pg.batch_isend_irecv(
        {cc::gpu::nccl_p2p_op::isend(a, right), cc::gpu::nccl_p2p_op::irecv(b, left)});
    CHECK(co_await ops[0] == right);
    CHECK(co_await ops[1] == left);
    same(read(b), small<T>(count, left + 5), "batch_isend_irecv");
    co_await pg.barrier();
}

template <class T>
cc::task<> every_op_and_size(cc::gpu::nccl_group& pg) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000}}) {
        CAPTURE(count);
        co_await every_op<T>(pg, count);
    }
}

}  // namespace

TEST_CASE("NCCL groups of 1-4 ranks: every op on every element type, results checked") {
    for (int n : {1, 2, 3, 4}) {
        CAPTURE(n);
        auto errors = run_nccl(n, [](cc::gpu::nccl_group& pg) -> cc::task<> {
            co_await corocoll_test::for_each_nccl_type(
                [&]<class T>() { return every_op_and_size<T>(pg); });
        });
        corocoll_test::check_every_rank_ok(errors);
    }
}

TEST_CASE("NCCL: isend and irecv around a ring of 2-4, each awaited") {
    for (int n : {2, 3, 4}) {
        CAPTURE(n);
        auto errors = run_nccl(n, [](cc::gpu::nccl_group& pg) -> cc::task<> {
            int me = pg.rank(), n = pg.size();
            cc::gpu::device_buffer<float> out(100), in(100);
            out.copy_from(small<float>(100, me));
            // Even ranks send first, odd ranks receive first: no pair waits on itself.
            if (me % 2 == 0) {
                co_await pg.send(out, (me + 1) % n);
                CHECK(co_await pg.recv(in, (me + n - 1) % n) == (me + n - 1) % n);
            } else {
                CHECK(co_await pg.recv(in, (me + n - 1) % n) == (me + n - 1) % n);
                co_await pg.send(out, (me + 1) % n);
            }
            same(read(in), small<float>(100, (me + n - 1) % n), "ring");
        });
        corocoll_test::check_every_rank_ok(errors);
    }
}

TEST_CASE("an injected hang ends in a timeout naming the op and the rank; later ops fail too") {
    corocoll_sim::inject({corocoll_sim::fault_kind::hang, 1, 2});
    std::vector<std::string> later(3);
    auto errors = run_nccl(
        3,
        [&](cc::gpu::nccl_group& pg) -> cc::task<> {
            cc::gpu::device_buffer<int> a(16);
            co_await pg.all_reduce(a);    // launch 0
            co_await pg.broadcast(a, 0);  // launch 1
            std::exception_ptr failed;
            try {
                co_await pg.all_reduce(a);  // launch 2: hangs on rank 1
            } catch (...) {
                failed = std::current_exception();
            }
            try {
                co_await pg.barrier();
            } catch (const std::exception& e) {
                later[static_cast<std::size_t>(pg.rank())] = e.what();
            }
            CHECK(pg.failed());
            if (failed) std::rethrow_exception(failed);
        },
        2s);
    corocoll_sim::clear_faults();
    int timeouts = 0;
    for (int rank = 0; rank < 3; ++rank) {
        std::string e = corocoll_test::what(errors[static_cast<std::size_t>(rank)]);
        CAPTURE(rank);
        CAPTURE(e);
        CHECK(e.find("rank " + std::to_string(rank) + ": all_reduce: ") != std::string::npos);
        timeouts += e.find("did not finish before the deadline") != std::string::npos;
        CHECK(later[static_cast<std::size_t>(rank)].find("barrier") != std::string::npos);
        CHECK(later[static_cast<std::size_t>(rank)].find("aborted") != std::string::npos);
    }
    CHECK(timeouts >= 1);
}

TEST_CASE("an injected async error fails every pending and later op on every rank, naming it") {
    corocoll_sim::inject({corocoll_sim::fault_kind::async_error, 2, 1});
    std::vector<std::vector<std::string>> seen(3);
    auto errors = run_nccl(3, [&](cc::gpu::nccl_group& pg) -> cc::task<> {
        auto& mine = seen[static_cast<std::size_t>(pg.rank())];
        cc::gpu::device_buffer<float> a(16), b(16);
        co_await pg.all_reduce(a);  // launch 0
        // Two ops pending at once: launch 1 fails on rank 2.
        auto w1 = cc::start(pg.all_reduce(a));
        auto w2 = cc::start(pg.broadcast(b, 1));
        for (auto* w : {&w1, &w2}) {
            try {
                co_await *w;
                mine.push_back("");
            } catch (const std::exception& e) {
                mine.push_back(e.what());
            }
        }
        try {
            co_await pg.all_reduce(b);
            mine.push_back("");
        } catch (const std::exception& e) {
            mine.push_back(e.what());
        }
    });
    corocoll_sim::clear_faults();
    corocoll_test::check_every_rank_ok(errors);
    for (int rank = 0; rank < 3; ++rank) {
        CAPTURE(rank);
        const auto& mine = seen[static_cast<std::size_t>(rank)];
        REQUIRE(mine.size() == 3);
        // NCCL's asynchronous error belongs to the communicator, not to an op: whichever op of
        // the rank sees it first is named, and the others report that first failure.
        for (const auto& e : mine) {
            CAPTURE(e);
            CHECK(e.find("corocoll: rank " + std::to_string(rank) + ": ") == 0);
            CHECK(e.find(rank == 2 ? "unhandled system error" : "remote process exited") !=
                  std::string::npos);
            CHECK(e.find("injected failure of AllReduce (launch 1) on rank 2") !=
                  std::string::npos);
        }
    }
}

// ---- issue 20: defects found by reading the layer against NCCL 2.28 and the CUDA runtime ----

TEST_CASE("an error NCCL returns for an argument fails the group: later ops and close agree") {
    // A buffer on another device: NCCL refuses it (argcheck.cc, CudaPtrCheck) and, the
    // communicator being non-blocking, keeps the error for every later call.
    std::string first, later;
    bool failed = false;
    auto errors = run_nccl(1, [&](cc::gpu::nccl_group& pg) -> cc::task<> {
        cudaSetDevice(3);
        cc::gpu::device_buffer<float> elsewhere(8);
        cudaSetDevice(pg.device());
        try {
            co_await pg.all_reduce(elsewhere);
        } catch (const std::exception& e) {
            first = e.what();
        }
        failed = pg.failed();
        cc::gpu::device_buffer<float> here(8);
        try {
            co_await pg.all_reduce(here);
        } catch (const std::exception& e) {
            later = e.what();
        }
    });
    corocoll_test::check_every_rank_ok(errors);  // close did not fail
    CAPTURE(first);
    CAPTURE(later);
    CHECK(first.find("corocoll: rank 0: all_reduce: NCCL: invalid argument") == 0);
    // What the call asked, for a reader without NCCL_DEBUG=WARN.
    CHECK(first.find("(asked: 8 float32 elements, sum)") != std::string::npos);
    CHECK(failed);
    CHECK(later.find("the NCCL group was aborted: " + first) != std::string::npos);
}

TEST_CASE("fp8 reductions are checked against the lowest compute capability of the group") {
    corocoll_sim::set_compute_capability(1, 8, 0);  // rank 1's device; rank 0's is 9.0
    std::vector<std::string> refused(2);
    auto errors = run_nccl(2, [&](cc::gpu::nccl_group& pg) -> cc::task<> {
        cc::gpu::device_buffer<__nv_fp8_e4m3> a(4);
        try {
            (void)pg.all_reduce(a);
        } catch (const std::invalid_argument& e) {
            refused[static_cast<std::size_t>(pg.rank())] = e.what();
        }
        co_await pg.broadcast(a, 0);  // moves are fine, and the group is still usable
        CHECK_FALSE(pg.failed());
    });
    corocoll_sim::set_compute_capability(1, 9, 0);
    corocoll_test::check_every_rank_ok(errors);
    for (const auto& e : refused) {
        CAPTURE(e);
        CHECK(e.find("all_reduce: NCCL reduces fp8 from compute capability 9.0") !=
              std::string::npos);
        CHECK(e.find("rank 1 has 8.0") != std::string::npos);
    }
}

TEST_CASE("an op that finished before close is not reported as closed") {
    // World of one: a batch to itself stays ncclInProgress for a poll; meanwhile other work
    // goes on the stream, so the event recorded after the batch ends later than the batch,
    // and close's finalize (which waits for NCCL's work only) can end first.
    std::string outcome = "not run";
    auto errors = run_nccl(1, [&](cc::gpu::nccl_group& pg) -> cc::task<> {
        cc::gpu::device_buffer<int> a(4), b(4);
        auto ops = pg.batch_isend_irecv(
            {cc::gpu::nccl_p2p_op::isend(a, 0), cc::gpu::nccl_p2p_op::irecv(b, 0)});
        auto* stall = corocoll_sim::hold(pg.stream());
        corocoll_sim::set_in_progress_polls(0);
        auto closing = cc::start(pg.close());
        co_await pg.reactor().sleep_for(50ms);  // the batch and finalize finish meanwhile
        corocoll_sim::release(stall);
        try {
            for (auto& w : ops) co_await w;
            outcome = "done";
        } catch (const std::exception& e) {
            outcome = e.what();
        }
        co_await closing;
    });
    corocoll_sim::set_in_progress_polls(1);
    corocoll_test::check_every_rank_ok(errors);
    CHECK(outcome == "done");
}

TEST_CASE("two groups driven by one thread keep their devices across suspensions") {
    // One reactor, a group on device 0 and one on device 1 (worlds of one, set up and used
    // at once): each coroutine's suspension lets the other switch the thread's device.
    auto server = std::make_shared<cc::rendezvous::tcp_store_server>(cc::io::endpoint::loopback(0));
    cc::io::reactor r;
    std::vector<std::string> errors(2);
    auto rank = [&](int me) -> cc::task<> {
        try {
            cc::init_options o;
            o.backend = "nccl";
            o.rank = 0;
            o.world_size = 1;
            o.timeout = 10s;
            o.group_name = "group" + std::to_string(me);
            o.store = co_await cc::rendezvous::tcp_store::connect(r, server->local_endpoint(), 10s);
            cc::gpu::nccl_options g;
            g.device = me;
            auto pg = co_await cc::gpu::init_process_group(r, o, g);
            cudaSetDevice(me);
            cc::gpu::device_buffer<float> a(8), b(8);
            a.copy_from(std::vector<float>(8, 1.0f + static_cast<float>(me)));
            cudaSetDevice(3);  // and the other coroutine sets its own while this one waits
            auto ops = pg->batch_isend_irecv(
                {cc::gpu::nccl_p2p_op::isend(a, 0), cc::gpu::nccl_p2p_op::irecv(b, 0)});
            for (auto& w : ops) co_await w;
            co_await pg->all_reduce(b);
            co_await pg->barrier();
            co_await cc::gpu::synchronize(r, pg->stream());
            cudaSetDevice(me);
            same(read(b), std::vector<float>(8, 1.0f + static_cast<float>(me)), "batch");
            co_await pg->close();
        } catch (const std::exception& e) {
            errors[static_cast<std::size_t>(me)] = e.what();
        }
    };
    r.run(cc::when_all(rank(0), rank(1)));
    CHECK(errors[0] == "");
    CHECK(errors[1] == "");
}

TEST_CASE("operations leave the caller's current device as it was") {
    std::vector<int> seen;
    auto errors = run_nccl(1, [&](cc::gpu::nccl_group& pg) -> cc::task<> {
        cc::gpu::device_buffer<float> a(8), b(8);
        auto now = [&] {
            int d = -1;
            cudaGetDevice(&d);
            seen.push_back(d);
        };
        cudaSetDevice(3);
        co_await pg.all_reduce(a);
        now();
        co_await pg.barrier();
        now();
        auto ops = pg.batch_isend_irecv(
            {cc::gpu::nccl_p2p_op::isend(a, 0), cc::gpu::nccl_p2p_op::irecv(b, 0)});
        for (auto& w : ops) co_await w;
        now();
        co_await cc::gpu::synchronize(pg.reactor(), pg.stream());
        now();
        cudaSetDevice(pg.device());
    });
    corocoll_test::check_every_rank_ok(errors);
    CHECK(seen == std::vector<int>{3, 3, 3, 3});
}

TEST_CASE("send and recv awaited together are fused into one NCCL group") {
    for (int n : {2, 3}) {
        CAPTURE(n);
        auto errors = run_nccl(
            n,
            [](cc::gpu::nccl_group& pg) -> cc::task<> {
                int me = pg.rank(), n = pg.size();
                int right = (me + 1) % n, left = (me + n - 1) % n;
                cc::gpu::device_buffer<float> out(64), in(64);
                out.copy_from(small<float>(64, me));
                // The CPU idiom: each rank's send waits for a receive that NCCL would queue
                // behind it, unless both are one group.
                auto [sent, from] = co_await cc::when_all(pg.send(out, right), pg.recv(in, left));
                (void)sent;
                CHECK(from == left);
                same(read(in), small<float>(64, left), "send/recv");
                auto w1 = pg.isend(out, right);
                auto w2 = pg.irecv(in, left);
                co_await w1;
                CHECK(co_await w2 == left);
            },
            5s);
        corocoll_test::check_every_rank_ok(errors);
    }
}

TEST_CASE("a staging buffer whose copy is still in flight is never freed nor reused") {
    std::uint64_t before = corocoll_sim::seen().pinned_freed_in_flight;
    corocoll_test::thread_ranks_options short_timeout;
    short_timeout.timeout = 500ms;
    auto errors = corocoll_test::run_threads(
        1,
        [](cc::process_group& pg) -> cc::task<> {
            cc::gpu::device_buffer<float> a(256);
            corocoll_sim::gate* stall = nullptr;
            {
                cc::gpu::staged st(pg);
                stall = corocoll_sim::hold(st.stream());
                bool timed_out = false;
                try {
                    co_await st.all_reduce(a);
                } catch (const std::system_error& e) {
                    timed_out = e.code() == std::errc::timed_out;
                }
                CHECK(timed_out);
            }  // ~staged: the device-to-host copy still waits behind the stall
            corocoll_sim::release(stall);
            cudaDeviceSynchronize();
        },
        short_timeout);
    corocoll_test::check_every_rank_ok(errors);
    CHECK(corocoll_sim::seen().pinned_freed_in_flight == before);
}
