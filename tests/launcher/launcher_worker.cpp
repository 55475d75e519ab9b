// A worker for the corocollrun tests. Every mode first prints "pid <rank> <pid>" so that the
// test can check afterwards that no process is left behind.
//
//   plain-fail R C      rank R writes three stderr lines and exits with code C; the others
//                       sleep (they do not use corocoll: only the launcher can stop them)
//   plain-kill R        rank R kills itself with SIGKILL; the others sleep
//   stubborn-fail R     as plain-fail R 1, but the others ignore SIGTERM
//   sleep               every rank starts a grandchild that sleeps, then sleeps itself
//   corocoll-fail R     corocoll ranks: rank R throws after a barrier, the others all_reduce
//   collectives         all_reduce and broadcast across the world, checked
//   fail-first-attempt R  rank R exits 1 in attempt 0; every attempt after that all_reduces
//   survive-kill R      corocoll ranks: rank R kills itself with SIGKILL after a barrier; the
//                       others all_reduce until the group fails, print its failed_ranks,
//                       then meet in a group of their own over the store and exit 0
//   replace R           corocoll ranks: rank R kills itself with SIGKILL after a barrier; the
//                       others shrink, wait for its replacement (COROCOLL_JOIN=1, which
//                       joins) and grow back to the full size; all print an all_reduce

#include <corocoll/corocoll.hpp>

#include <signal.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace cc = corocoll;

namespace {

int env_int(const char* name) {
    const char* v = std::getenv(name);
    if (v == nullptr) throw std::runtime_error(std::string(name) + " is not set");
    return std::atoi(v);
}

[[noreturn]] void sleep_forever() {
    for (;;) ::pause();
}

cc::task<> all_reduce_check(cc::process_group& pg) {
    std::vector<std::int64_t> v{pg.rank() + 1, 10};
    co_await pg.all_reduce(v);
    std::int64_t n = pg.size();
    if (v[0] != n * (n + 1) / 2 || v[1] != 10 * n)
        throw std::runtime_error("all_reduce: wrong sum");
    std::printf("all_reduce ok: %lld\n", static_cast<long long>(v[0]));
    std::fflush(stdout);
}

// After a barrier rank `target` kills itself (SIGKILL); the others all_reduce until that
// fails them. The barrier is inside the try: `target` leaves it as soon as its own part is
// done, and its death fails every op still pending on the group (architecture.md, "Every
// failure ends the group as a whole"), so a rank still in the barrier then may fail there.
cc::task<> lose_rank(cc::process_group& pg, int target) {
    std::vector<float> v(4, 1.0f);
    try {
        co_await pg.barrier();
        if (pg.rank() == target) ::raise(SIGKILL);
        for (;;) co_await pg.all_reduce(v);
    } catch (const std::system_error&) {
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: launcher_worker MODE [ARGS]\n");
        return 2;
    }
    std::string mode = argv[1];
    int target = argc > 2 ? std::atoi(argv[2]) : -1;
    int rank = env_int("RANK");
    std::printf("pid %d %d\n", rank, static_cast<int>(::getpid()));
    std::fflush(stdout);

    if (mode == "plain-fail" || mode == "plain-kill" || mode == "stubborn-fail") {
        if (rank != target) {
            if (mode == "stubborn-fail") ::signal(SIGTERM, SIG_IGN);
            sleep_forever();
        }
        ::usleep(200'000);
        if (mode == "plain-kill") ::raise(SIGKILL);
        std::fprintf(stderr, "rank %d: first line\nrank %d: second line\nrank %d: giving up\n",
                     rank, rank, rank);
        return mode == "plain-fail" && argc > 3 ? std::atoi(argv[3]) : 1;
    }
    if (mode == "sleep") {
        pid_t child = ::fork();
        if (child == 0) sleep_forever();
        std::printf("grandchild %d %d\n", rank, static_cast<int>(child));
        std::fflush(stdout);
        sleep_forever();
    }
    if (mode == "corocoll-fail") {
        return cc::run([target](cc::process_group& pg) -> cc::task<> {
            co_await pg.barrier();
            if (pg.rank() == target) {
                ::usleep(100'000);
                throw std::runtime_error("rank " + std::to_string(target) + " gives up on purpose");
            }
            std::vector<float> v(4, 1.0f);
            co_await pg.all_reduce(v);
        });
    }
    if (mode == "collectives") {
        return cc::run([](cc::process_group& pg) -> cc::task<> {
            co_await all_reduce_check(pg);
            std::vector<std::int32_t> b(3, pg.rank() == 1 ? 42 : -1);
            co_await pg.broadcast(b, 1);
            for (auto x : b)
                if (x != 42) throw std::runtime_error("broadcast: wrong value");
            std::printf("broadcast ok: %d (world %d, node %s)\n", b[0], pg.size(),
                        std::getenv("GROUP_RANK"));
            // Across hosts with two ranks on each, these three run hierarchically: large
            // enough for the ring among the leaders and chunks within a host.
            std::printf("topology: %s%s\n", pg.topology().describe().c_str(),
                        pg.topology().hierarchical() ? ", hierarchical" : "");
            std::vector<float> big((std::size_t{1} << 18) + 3);
            for (std::size_t i = 0; i < big.size(); ++i)
                big[i] = static_cast<float>((i + static_cast<std::size_t>(pg.rank())) % 5);
            co_await pg.all_reduce(big);
            for (std::size_t i = 0; i < big.size(); ++i) {
                float want = 0;
                for (int q = 0; q < pg.size(); ++q)
                    want += static_cast<float>((i + static_cast<std::size_t>(q)) % 5);
                if (big[i] != want) throw std::runtime_error("large all_reduce: wrong sum");
            }
            std::vector<std::int32_t> mine{pg.rank() * 10, pg.rank() * 10 + 1};
            std::vector<std::int32_t> all(mine.size() * static_cast<std::size_t>(pg.size()));
            co_await pg.all_gather_into(all, mine);
            for (std::size_t i = 0; i < all.size(); ++i)
                if (all[i] != static_cast<std::int32_t>((i / 2) * 10 + i % 2))
                    throw std::runtime_error("all_gather: wrong block");
            int last = pg.size() - 1;
            std::vector<std::int32_t> from_last(1000, pg.rank() == last ? 7 : 0);
            co_await pg.broadcast(from_last, last);
            for (auto x : from_last)
                if (x != 7) throw std::runtime_error("broadcast from the last rank: wrong value");
            std::printf("hierarchical ok\n");
        });
    }
    if (mode == "survive-kill") {
        cc::io::reactor r;
        r.run([&]() -> cc::task<> {
            cc::init_options io;  // named: g++ 12 frees a braced temporary in co_await twice
            auto pg = co_await cc::init_process_group(r, io);
            co_await lose_rank(*pg, target);
            std::string failed;
            for (int f : pg->failed_ranks()) {
                if (!failed.empty()) failed += ", ";
                failed += std::to_string(f);
            }
            int me = pg->rank();
            int world = pg->size();
            auto store = pg->shared_store();
            co_await pg->close();
            // The survivors still share the store (the launcher serves it): a barrier of
            // their own there, proof that each went on.
            if (co_await store->add("survivors", 1) == world - 1) {
                co_await store->set("survivors-done", "1");
            }
            std::vector<std::string> done{"survivors-done"};  // named: g++ 12, as above
            co_await store->wait(done, std::chrono::seconds(30));
            std::printf(
                "rank %d: rank %d failed (failed_ranks [%s]); the survivors' barrier "
                "passed\n",
                me, target, failed.c_str());
            std::fflush(stdout);
        }());
        return 0;
    }
    if (mode == "replace") {
        // Rank R (its first process) kills itself; the others shrink, wait for its replacement
        // (corocollrun --on_failure=replace starts it with COROCOLL_JOIN=1) and grow back.
        cc::io::reactor r;
        r.run([&]() -> cc::task<> {
            cc::init_options io;  // named: g++ 12, as above
            if (cc::joining()) {
                auto g = co_await cc::join_process_group(r, io);
                std::vector<std::int64_t> v{g->rank() + 1};
                co_await g->all_reduce(v);
                std::printf("joined as rank %d of %d; all_reduce %lld\n", g->rank(), g->size(),
                            static_cast<long long>(v[0]));
                std::fflush(stdout);
                co_await g->close();
                co_return;
            }
            auto pg = co_await cc::init_process_group(r, io);
            const int size = pg->size();
            co_await lose_rank(*pg, target);
            auto small = co_await pg->shrink();
            co_await pg->close();
            int waiting = 0;
            for (int i = 0; i < 600 && waiting == 0; ++i) {
                waiting = co_await small->joiners_waiting();
                if (waiting == 0) {
                    co_await r.sleep_until(std::chrono::steady_clock::now() +
                                           std::chrono::milliseconds(50));
                }
            }
            auto whole = co_await small->grow(small->size() + waiting);
            co_await small->close();
            std::vector<std::int64_t> v{whole->rank() + 1};
            co_await whole->all_reduce(v);
            std::printf("rank %d: shrank to %d, grew back to %d of %d; all_reduce %lld\n", rank,
                        size - 1, whole->size(), size, static_cast<long long>(v[0]));
            std::fflush(stdout);
            co_await whole->close();
        }());
        return 0;
    }
    if (mode == "fail-first-attempt") {
        int attempt = env_int("TORCHELASTIC_RESTART_COUNT");
        std::printf("attempt %d\n", attempt);
        std::fflush(stdout);
        if (attempt == 0 && rank == target) {
            ::usleep(100'000);
            std::fprintf(stderr, "rank %d fails in attempt 0\n", rank);
            return 1;
        }
        return cc::run(all_reduce_check);
    }
    std::fprintf(stderr, "launcher_worker: unknown mode %s\n", mode.c_str());
    return 2;
}
