// Costs of the coroutine layer and the reactor, measured on this machine:
//   - ns per awaited task that completes synchronously (frame allocation included);
//   - ns per hop through the reactor's posted queue (`co_await reactor.schedule()`);
//   - µs per 1-byte TCP round trip between two sockets on one reactor (send + recv each way);
//   - heap allocations per message in steady state during that ping-pong (target: 0);
//   - the same through a process group of two spawned ranks: per send or recv, and per
//     all_reduce of 4 bytes (target: 0);
//   - coroutine frames (pooled or not) per point-to-point send and receive, and heap
//     allocations and frames per chunk received by the ring (a 64 KiB all_reduce on two ranks,
//     forced to the ring, cut into 1 KiB chunks: 64 chunks received per call).
// Usage: core_bench [-n iterations] (default 200000).

#include <corocoll/corocoll.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <vector>

// g++ 12 flags free() in our replacement operator delete as mismatched with the replacement
// operator new (which calls malloc) once both are inlined; the pair is consistent.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace cc = corocoll;
using namespace std::chrono_literals;

namespace {
std::atomic<long> allocations{0};
}

// Counts every allocation the program makes, to report allocations per message.
void* operator new(std::size_t n) {
    allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

using clock_type = std::chrono::steady_clock;

double ns_since(clock_type::time_point t0, long n) {
    return std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() /
           static_cast<double>(n);
}

cc::task<long> leaf(long i) { co_return i; }

cc::task<double> awaited_tasks(long n) {
    long sum = 0;
    auto t0 = clock_type::now();
    for (long i = 0; i < n; ++i) sum += co_await leaf(i);
    double ns = ns_since(t0, n);
    if (sum != n * (n - 1) / 2) std::abort();
    co_return ns;
}

cc::task<double> reactor_hops(cc::io::reactor& r, long n) {
    auto t0 = clock_type::now();
    for (long i = 0; i < n; ++i) co_await r.schedule();
    co_return ns_since(t0, n);
}

struct pingpong_result {
    double us_per_round_trip;
    double allocations_per_message;
};

cc::task<pingpong_result> pingpong(cc::io::reactor& r, long n) {
    auto listener = cc::io::acceptor::listen(r, cc::io::endpoint::loopback(0));
    auto conn = co_await cc::when_all(listener.accept(),
                                      cc::io::socket::connect(r, listener.local_endpoint()));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    auto& a = std::get<0>(conn);
    auto& b = std::get<1>(conn);
    std::byte ping[1] = {std::byte{1}}, pong[1] = {};
    auto echo = [&](long rounds) -> cc::task<> {
        for (long i = 0; i < rounds; ++i) {
            co_await b.recv(pong);
            co_await b.send(pong);
        }
    };
    auto drive = [&](long rounds) -> cc::task<> {
        std::byte back[1];
        for (long i = 0; i < rounds; ++i) {
            co_await a.send(ping);
            co_await a.recv(back);
        }
    };
    co_await cc::when_all(echo(n / 10), drive(n / 10));  // warm-up
    long before = allocations.load();
    auto t0 = clock_type::now();
    co_await cc::when_all(echo(n), drive(n));
    double us = ns_since(t0, n) / 1e3;
    // when_all and the two task frames allocate a fixed handful; spread over n messages
    // they tell whether anything allocates per message.
    long allocated = allocations.load() - before;
    co_return pingpong_result{us, static_cast<double>(allocated) / static_cast<double>(4 * n)};
}

// The same question through the process-group API, between two spawned ranks: allocations
// on rank 0 per send/recv of a 4-byte message and per 4-byte all_reduce, once warm. Rank 0
// prints.
cc::task<> group_allocations(cc::process_group& pg, long n) {
    using pool = cc::detail::frame_pool;
    std::vector<float> v(1, 1.0f);
    auto ping = [&](long rounds) -> cc::task<> {
        for (long i = 0; i < rounds; ++i) {
            if (pg.rank() == 0) {
                co_await pg.send(v, 1);
                co_await pg.recv(v, 1);
            } else {
                co_await pg.recv(v, 0);
                co_await pg.send(v, 0);
            }
        }
    };
    auto sends = [&](long rounds) -> cc::task<> {
        for (long i = 0; i < rounds; ++i) {
            if (pg.rank() == 0) {
                co_await pg.send(v, 1);
            } else {
                co_await pg.recv(v, 0);
            }
        }
    };
    auto reduce = [&](long rounds) -> cc::task<> {
        for (long i = 0; i < rounds; ++i) co_await pg.all_reduce(v);
    };
    co_await ping(n / 10 + 100);
    long before = allocations.load();
    co_await ping(n);
    double per_message =
        static_cast<double>(allocations.load() - before) / static_cast<double>(2 * n);
    // Rank 0 only sends and rank 1 only receives: frames per send on 0, per recv on 1. The
    // loop's own frame is one in `n`.
    co_await pg.barrier();
    std::uint64_t frames_before = pool::frames_made();
    co_await sends(n);
    double frames_per_p2p =
        static_cast<double>(pool::frames_made() - frames_before) / static_cast<double>(n);
    co_await pg.barrier();
    co_await reduce(n / 10 + 100);
    before = allocations.load();
    co_await reduce(n);
    double per_all_reduce =
        static_cast<double>(allocations.load() - before) / static_cast<double>(n);

    // The ring, chunk by chunk: 64 KiB of floats over two ranks in 1 KiB chunks is two rounds
    // (reduce-scatter, all-gather) of a 32 KiB block, 32 chunks each.
    std::vector<float> big(16384, 1.0f);
    pg.set_algorithm(cc::collectives::collective_kind::all_reduce,
                     cc::collectives::algorithm::ring);
    pg.set_chunk_bytes(1024);
    constexpr long chunks_per_call = 64;
    long ring_n = std::max(1L, n / 100);
    for (long i = 0; i < ring_n / 10 + 10; ++i) co_await pg.all_reduce(big);
    before = allocations.load();
    frames_before = pool::frames_made();
    for (long i = 0; i < ring_n; ++i) co_await pg.all_reduce(big);
    double ring_chunks = static_cast<double>(ring_n * chunks_per_call);
    double allocs_per_chunk = static_cast<double>(allocations.load() - before) / ring_chunks;
    double frames_per_chunk =
        static_cast<double>(pool::frames_made() - frames_before) / ring_chunks;

    // Rank 1 reports its receive side to rank 0, which prints everything.
    std::vector<double> recv_frames{frames_per_p2p};
    if (pg.rank() == 1) co_await pg.send(recv_frames, 0);
    if (pg.rank() == 0) {
        co_await pg.recv(recv_frames, 1);
        std::printf("%-44s %12.4f\n", "heap allocations per send or recv, group", per_message);
        std::printf("%-44s %12.4f\n", "heap allocations per all_reduce, 2 ranks", per_all_reduce);
        std::printf("%-44s %12.4f\n", "coroutine frames per send, group", frames_per_p2p);
        std::printf("%-44s %12.4f\n", "coroutine frames per recv, group", recv_frames[0]);
        std::printf("%-44s %12.4f\n", "heap allocations per ring chunk received", allocs_per_chunk);
        std::printf("%-44s %12.4f\n", "coroutine frames per ring chunk received", frames_per_chunk);
        std::fflush(stdout);
    }
}

}  // namespace

int main(int argc, char** argv) try {
    long n = 200000;
    for (int i = 1; i + 1 < argc; ++i) {
        if (std::strcmp(argv[i], "-n") == 0) n = std::atol(argv[i + 1]);
    }
    // The reactor goes before spawn, which needs a thread without one.
    auto r = std::make_unique<cc::io::reactor>();
    double task_ns = cc::sync_wait(awaited_tasks(n * 10));
    double hop_ns = r->run(reactor_hops(*r, n));
    pingpong_result pp = r->run(pingpong(*r, n));
    r.reset();
    std::printf("# corocoll core_bench, %ld iterations\n", n);
    std::printf("%-44s %12s\n", "measure", "value");
    std::printf("%-44s %12.1f\n", "ns per awaited task (synchronous)", task_ns);
    std::printf("%-44s %12.1f\n", "ns per reactor hop (schedule)", hop_ns);
    std::printf("%-44s %12.2f\n", "us per 1-byte TCP round trip, one reactor",
                pp.us_per_round_trip);
    std::printf("%-44s %12.4f\n", "heap allocations per message (steady state)",
                pp.allocations_per_message);
    std::fflush(stdout);
    long group_n = std::min(n, 20000L);
    return cc::spawn(2,
                     [group_n](cc::process_group& pg) { return group_allocations(pg, group_n); });
} catch (const std::exception& e) {
    std::fprintf(stderr, "core_bench: %s\n", e.what());
    return 1;
}
