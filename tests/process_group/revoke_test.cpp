// A group's failure as the program sees it, with ranks as processes: `revoke` from one rank
// ends whatever every other rank waits in (a recv, a collective, a barrier) with words that
// name the revoker, and takes nobody for failed; `when_failed` wakes a supervisor coroutine
// while the rank computes; a rank killed by SIGKILL is in every survivor's `failed_ranks`;
// a close wakes `when_failed` too. Runs over shared memory, and again over TCP
// (COROCOLL_TRANSPORT=tcp, as meson.build's tcp_again_tests do).

#include "../support/process_board.hpp"

#include <corocoll/corocoll.hpp>

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace cc = corocoll;
using namespace std::chrono_literals;

namespace {

// What each rank saw, in memory that the test process and every rank share.
struct rank_record {
    std::atomic<int> waiting{0};    // 1 once the rank is about to wait in its operation
    std::atomic<int> op_failed{0};  // its operation ended with an error
    std::atomic<int> cause{-1};     // failure()->cause
    std::atomic<int> named{-2};     // failure()->rank
    std::atomic<unsigned> failed_mask{0};
    std::atomic<int> woke{0};  // when_failed completed
    std::atomic<int> woke_cause{-1};
    std::atomic<int> woke_named{-2};
    std::atomic<long> completed{0};  // operations done before the failure
    char text[1500] = {};
    char woke_text[1500] = {};
};
struct board {
    rank_record ranks[8];
};

board* new_board() { return corocoll_test::new_shared_board<board>(); }

using corocoll_test::note;

unsigned mask_of(const std::vector<int>& ranks) {
    unsigned m = 0;
    for (int r : ranks) m |= 1u << r;
    return m;
}

// What the group says of its failure, on the board.
void record_failure(rank_record& me, cc::process_group& pg) {
    auto f = pg.failure();
    if (!f) return;
    me.cause = static_cast<int>(f->cause);
    me.named = f->rank;
    me.failed_mask = mask_of(pg.failed_ranks());
}

// A supervisor: waits for the group's failure (or close) and notes the report.
cc::task<> supervise(cc::process_group& pg, rank_record& me) {
    cc::group_failure f = co_await pg.when_failed();
    me.woke_cause = static_cast<int>(f.cause);
    me.woke_named = f.rank;
    note(me.woke_text, f.what);
    me.woke = 1;
}

// Runs `body` on `ranks` process ranks, each in a group of its own set-up, then closes it.
// A rank exits 0 unless set-up or close failed (or `body` threw what it did not expect).
cc::spawn_result run_job(int ranks, std::function<cc::task<>(cc::process_group&)> body) {
    corocoll_test::process_job j;  // no status round: nothing ends by a stall verdict
    j.ranks = ranks;
    return corocoll_test::run_process_job(j, corocoll_test::then_close(std::move(body)));
}

void check_exits(const cc::spawn_result& res, int except = -1) {
    for (std::size_t r = 0; r < res.ranks.size(); ++r) {
        if (static_cast<int>(r) == except) continue;
        CAPTURE(r);
        CAPTURE(res.ranks[r].describe());
        CHECK(res.ranks[r].ok());
    }
}

bool has(const char* text, const std::string& words) {
    return std::string(text).find(words) != std::string::npos;
}

}  // namespace

// What ranks 1-3 wait in while rank 0 revokes the group.
enum class blocked_in { recv, all_reduce, barrier };

void revoke_case(blocked_in op, const char* op_name) {
    board& b = *new_board();
    constexpr int n = 4;
    auto res = run_job(n, [&b, op](cc::process_group& pg) -> cc::task<> {
        rank_record& me = b.ranks[pg.rank()];
        co_await pg.barrier();  // every rank is up
        std::vector<float> v(16, 1.0f);
        try {
            if (pg.rank() == 0) {
                // Once every other rank is about to wait: it may be waiting already, or call
                // its operation just after the revoke; both end the same way.
                for (int r = 1; r < n; ++r) {
                    while (b.ranks[r].waiting == 0) co_await pg.reactor().sleep_for(1ms);
                }
                co_await pg.reactor().sleep_for(50ms);
                pg.revoke("the supervisor says stop");
                // The revoker's own next call fails the same way.
                co_await pg.barrier();
            } else {
                me.waiting = 1;
                switch (op) {
                    case blocked_in::recv:
                        co_await pg.recv(v, 0, 9);
                        break;  // never sent
                    case blocked_in::all_reduce:
                        co_await pg.all_reduce(v);
                        break;
                    case blocked_in::barrier:
                        co_await pg.barrier();
                        break;
                }
            }
        } catch (const std::system_error& e) {
            me.op_failed = 1;
            note(me.text, e.what());
            CHECK(e.code() == std::errc::operation_canceled);
        }
        record_failure(me, pg);
        // A later operation fails at once, the same way.
        try {
            co_await pg.send(v, (pg.rank() + 1) % n, 1);
            ++me.completed;
        } catch (const std::system_error&) {
        }
    });
    check_exits(res);
    for (int r = 0; r < n; ++r) {
        const rank_record& rec = b.ranks[r];
        CAPTURE(r);
        CAPTURE(std::string(rec.text));
        CHECK(rec.op_failed == 1);
        CHECK(has(rec.text, "rank 0 revoked process group 'default': the supervisor says stop"));
        CHECK(has(rec.text, r == 0 ? "barrier" : op_name));
        CHECK(rec.cause == static_cast<int>(cc::failure_cause::revoked));
        CHECK(rec.named == 0);
        CHECK(rec.failed_mask == 0u);  // nobody failed
        CHECK(rec.completed == 0);
    }
    ::munmap(&b, sizeof(board));
}

TEST_CASE("a revoke from one rank ends a recv, a collective and a barrier on every other rank") {
    SUBCASE("recv") { revoke_case(blocked_in::recv, "recv from rank 0 (tag 9)"); }
    SUBCASE("all_reduce") { revoke_case(blocked_in::all_reduce, "all_reduce(sum, float32 x 16"); }
    SUBCASE("barrier") { revoke_case(blocked_in::barrier, "barrier"); }
}

TEST_CASE("when_failed wakes a supervisor while the rank computes, and failure() agrees") {
    board& b = *new_board();
    constexpr int n = 4;
    auto res = run_job(n, [&b](cc::process_group& pg) -> cc::task<> {
        rank_record& me = b.ranks[pg.rank()];
        CHECK_FALSE(pg.failure().has_value());
        CHECK(pg.failed_ranks().empty());
        auto work = [&]() -> cc::task<> {
            std::vector<double> v(64);
            try {
                for (long i = 0; i < 1'000'000; ++i) {
                    std::fill(v.begin(), v.end(), 1.0);
                    co_await pg.all_reduce(v);
                    if (v.front() != n) throw std::runtime_error("wrong sum");
                    ++me.completed;
                    if (pg.rank() == 2 && i == 20) pg.revoke();
                }
            } catch (const std::system_error& e) {
                me.op_failed = 1;
                note(me.text, e.what());
            }
        };
        co_await cc::when_all(supervise(pg, me), work());
        record_failure(me, pg);
    });
    check_exits(res);
    for (int r = 0; r < n; ++r) {
        const rank_record& rec = b.ranks[r];
        CAPTURE(r);
        CAPTURE(std::string(rec.text));
        CAPTURE(std::string(rec.woke_text));
        CHECK(rec.op_failed == 1);
        CHECK(rec.woke == 1);
        CHECK(rec.woke_cause == static_cast<int>(cc::failure_cause::revoked));
        CHECK(rec.woke_named == 2);
        CHECK(has(rec.woke_text, "rank 2 revoked process group 'default'"));
        CHECK(rec.cause == rec.woke_cause);
        CHECK(rec.named == 2);
        // Rank 2 revoked after its 21st all_reduce: nobody got further than that.
        CHECK(rec.completed <= 21);
        CHECK(rec.completed >= 20);
    }
    ::munmap(&b, sizeof(board));
}

TEST_CASE("a rank killed by SIGKILL is in every survivor's failed_ranks") {
    board& b = *new_board();
    constexpr int n = 4;
    constexpr int victim = 2;
    auto res = run_job(n, [&b](cc::process_group& pg) -> cc::task<> {
        rank_record& me = b.ranks[pg.rank()];
        auto work = [&]() -> cc::task<> {
            std::vector<float> v(256);
            try {
                for (long i = 0; i < 1'000'000; ++i) {
                    if (pg.rank() == victim && i == 10) ::raise(SIGKILL);
                    std::fill(v.begin(), v.end(), 1.0f);
                    co_await pg.all_reduce(v);
                    ++me.completed;
                }
            } catch (const std::system_error& e) {
                me.op_failed = 1;
                note(me.text, e.what());
            }
        };
        co_await cc::when_all(supervise(pg, me), work());
        record_failure(me, pg);
    });
    check_exits(res, victim);
    CHECK_FALSE(res.ranks[victim].ok());
    for (int r = 0; r < n; ++r) {
        if (r == victim) continue;
        const rank_record& rec = b.ranks[r];
        CAPTURE(r);
        CAPTURE(std::string(rec.text));
        CHECK(rec.op_failed == 1);
        CHECK(has(rec.text, "rank 2"));
        CHECK(rec.cause == static_cast<int>(cc::failure_cause::rank_failed));
        CHECK(rec.named == victim);
        CHECK(rec.failed_mask == 1u << victim);
        CHECK(rec.woke == 1);
        CHECK(rec.woke_cause == static_cast<int>(cc::failure_cause::rank_failed));
        // Rank 2 finished its 10th all_reduce; a survivor may have lost the last frames of
        // it (a reset connection drops what was not read yet).
        CHECK(rec.completed <= 10);
        CHECK(rec.completed >= 9);
    }
    ::munmap(&b, sizeof(board));
}

TEST_CASE("a close wakes when_failed with cause closed, and a revoke after it is refused") {
    board& b = *new_board();
    constexpr int n = 2;
    auto res = cc::spawn_processes(n, [&b]() -> int {
        cc::io::reactor r;
        try {
            r.run([&]() -> cc::task<> {
                // Named: g++ 12 frees a braced temporary inside co_await twice.
                cc::init_options io;
                auto pg = co_await cc::init_process_group(r, io);
                rank_record& me = b.ranks[pg->rank()];
                auto closer = [&]() -> cc::task<> {
                    co_await pg->barrier();
                    co_await pg->close();
                };
                co_await cc::when_all(supervise(*pg, me), closer());
                record_failure(me, *pg);
                try {
                    pg->revoke();
                } catch (const std::logic_error& e) {
                    note(me.text, e.what());
                }
            }());
        } catch (const std::exception& e) {
            std::fprintf(stderr, "rank failed: %s\n", e.what());
            return 1;
        }
        return 0;
    });
    check_exits(res);
    for (int r = 0; r < n; ++r) {
        const rank_record& rec = b.ranks[r];
        CAPTURE(r);
        CHECK(rec.woke == 1);
        CHECK(rec.woke_cause == static_cast<int>(cc::failure_cause::closed));
        CHECK(rec.woke_named == -1);
        CHECK(has(rec.woke_text, "the process group was closed"));
        CHECK(rec.cause == static_cast<int>(cc::failure_cause::closed));
        CHECK(rec.failed_mask == 0u);
        CHECK(has(rec.text, "revoke"));
        CHECK(has(rec.text, "process group 'default' is closed"));
    }
    ::munmap(&b, sizeof(board));
}
