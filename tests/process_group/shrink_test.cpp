// A group that survives a rank's death, with ranks as processes: after SIGKILL of one rank
// (of 4, of 8) in the middle of an all_reduce loop, the survivors shrink the group and the
// next all_reduce is exactly the sum over the survivors on every one of them, with p2p and a
// broadcast working too; three deaths in a row at 8 ranks, each followed by a shrink; a rank
// that dies during the shrink itself is left out by a second try; a rank stopped with SIGSTOP
// is found by the stall check and left out, and when it runs again it learns that it was;
// agree gives every survivor the same AND and failed ranks; a subgroup is shrunk the same way;
// 100 shrinks in a row leave no descriptor, mapping or store key behind. Grow: after a shrink a
// process that joins (join_process_group) is admitted and the group is whole again; too few
// joiners fail every rank's grow with the count, and the group goes on; a joiner that gave up
// is not counted and the next grow passes over it; 100 grows in a row leave nothing behind.
// Runs over shared memory, and again over TCP (COROCOLL_TRANSPORT=tcp). The store is served
// by the test process (as corocollrun's agent serves it), so it outlives every rank.

#include "../support/port.hpp"
#include "../support/process_board.hpp"
#include "../support/sanitized.hpp"

#include <corocoll/corocoll.hpp>

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <new>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace cc = corocoll;
using namespace std::chrono_literals;

namespace {

struct rank_record {
    std::atomic<int> pid{0};
    std::atomic<long> completed{0};  // all_reduces of the first group
    std::atomic<int> shrinks{0};     // shrinks that gave a group
    std::atomic<int> final_size{0};
    std::atomic<int> final_rank{-1};
    std::atomic<unsigned> final_members{0};  // the first group's ranks in the last group
    std::atomic<long> sum{0};                // its all_reduce of (first rank + 1)
    std::atomic<int> checked{0};             // p2p and broadcast in the last group were right
    std::atomic<int> left_out{0};            // shrink said this rank was left out
    char text[1500] = {};
};
struct board {
    rank_record ranks[8];
};

board* new_board() { return corocoll_test::new_shared_board<board>(); }

void note(rank_record& r, const std::string& s) { corocoll_test::note(r.text, s); }

// Runs `body` on `ranks` process ranks (stall checks as given), each in a group of its own
// set-up; a rank exits 0 unless something it did not expect threw.
// With `store_port`, rank 0 serves the store on it (env:// without a launcher's store), so
// that the store dies with rank 0.
cc::spawn_result run_job(int ranks, const char* stall_s,
                         std::function<cc::task<>(std::shared_ptr<cc::process_group>)> body,
                         const corocoll_test::reserved_port* store_port = nullptr) {
    corocoll_test::process_job j;
    j.ranks = ranks;
    j.stall_s = stall_s;
    j.job_timeout = 100s;
    if (store_port != nullptr) {
        j.before = [store_port] {
            ::unsetenv("TORCHELASTIC_USE_AGENT_STORE");
            ::setenv("MASTER_PORT", std::to_string(store_port->port()).c_str(), 1);
        };
    }
    return corocoll_test::run_process_job(j, std::move(body));
}

// all_reduces on `pg` until it fails (or `victim` kills itself after `after` of them).
cc::task<> loop_until_failure(cc::process_group& pg, rank_record& me, int victim, long after) {
    std::vector<float> v(64);
    try {
        for (long i = 0; i < 1'000'000; ++i) {
            if (pg.rank() == victim && i == after) ::raise(SIGKILL);
            std::fill(v.begin(), v.end(), 1.0f);
            co_await pg.all_reduce(v);
            if (v.front() != static_cast<float>(pg.size())) throw std::logic_error("wrong sum");
            ++me.completed;
        }
    } catch (const std::system_error&) {
    }
}

// What the last group does, and the board learns: who is in it (as ranks of the first
// group), the all_reduce of (first rank + 1) over it, a ring of sends and a broadcast.
cc::task<> check_group(cc::process_group& g, rank_record& me, int first_rank) {
    std::vector<std::int64_t> mine{first_rank + 1};
    co_await g.all_reduce(mine);
    std::vector<int> members;
    co_await g.all_gather_object(members, first_rank);
    unsigned mask = 0;
    for (int m : members) mask |= 1u << m;
    std::vector<std::int32_t> token{first_rank}, got{-1};
    int next = (g.rank() + 1) % g.size();
    int prev = (g.rank() + g.size() - 1) % g.size();
    auto sent = g.isend(token, next, 7);
    co_await g.recv(got, prev, 7);
    co_await std::move(sent);
    std::vector<std::int32_t> root_says{g.rank() == 0 ? 1234 : 0};
    co_await g.broadcast(root_says, 0);
    me.final_size = g.size();
    me.final_rank = g.rank();
    me.final_members = mask;
    me.sum = mine[0];
    me.checked = got[0] == members[static_cast<std::size_t>(prev)] && root_says[0] == 1234 &&
                 std::is_sorted(members.begin(), members.end());
}

long sum_of(unsigned members) {
    long s = 0;
    for (int r = 0; r < 32; ++r) {
        if (members & (1u << r)) s += r + 1;
    }
    return s;
}

unsigned all_but(int n, std::vector<int> gone) {
    unsigned m = (1u << n) - 1;
    for (int r : gone) m &= ~(1u << r);
    return m;
}

// Every rank of `survivors` ended in one group of exactly them, ranked in order, with the
// right sum, ring and broadcast.
void check_survivors(const board& b, unsigned survivors, int shrinks) {
    int index = 0;
    for (int r = 0; r < 8; ++r) {
        if (!(survivors & (1u << r))) continue;
        const rank_record& rec = b.ranks[r];
        CAPTURE(r);
        CAPTURE(std::string(rec.text));
        CHECK(rec.final_members == survivors);
        CHECK(rec.final_size == __builtin_popcount(survivors));
        CHECK(rec.final_rank == index++);
        CHECK(rec.sum == sum_of(survivors));
        CHECK(rec.checked == 1);
        CHECK(rec.shrinks == shrinks);
    }
}

void kill_case(int n, int victim, const corocoll_test::reserved_port* store_port = nullptr) {
    board& b = *new_board();
    auto res = run_job(
        n, "60",
        [&b, victim](std::shared_ptr<cc::process_group> pg) -> cc::task<> {
            rank_record& me = b.ranks[pg->rank()];
            int first = pg->rank();
            co_await loop_until_failure(*pg, me, victim, 25);
            auto failed = pg->failed_ranks();
            if (failed != std::vector<int>{victim}) {
                note(me, "failed_ranks is not {victim}: " + pg->failure()->what);
            }
            auto small = co_await pg->shrink();
            ++me.shrinks;
            co_await pg->close();
            co_await check_group(*small, me, first);
            co_await small->close();
        },
        store_port);
    for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        CAPTURE(res.ranks[static_cast<std::size_t>(r)].describe());
        CHECK(res.ranks[static_cast<std::size_t>(r)].ok() == (r != victim));
    }
    check_survivors(b, all_but(n, {victim}), 1);
    ::munmap(&b, sizeof(board));
}

}  // namespace

TEST_CASE("after SIGKILL of one rank the survivors shrink, and the next all_reduce is theirs") {
    SUBCASE("1 of 4") { kill_case(4, 2); }
    SUBCASE("1 of 8") { kill_case(8, 5); }
    SUBCASE("rank 0 of 4") { kill_case(4, 0); }
}

TEST_CASE("the rank that serves the store dies: the survivors shrink through a stand-in") {
    // env:// without a launcher's store: rank 0 serves it, and ranks 1 and 2 stand in.
    corocoll_test::reserved_port port;
    SUBCASE("rank 0 of 4") { kill_case(4, 0, &port); }
    SUBCASE("rank 0 of 8") { kill_case(8, 0, &port); }
    SUBCASE("rank 0, then the first stand-in") {
        board& b = *new_board();
        auto res = run_job(
            4, "60",
            [&b](std::shared_ptr<cc::process_group> pg) -> cc::task<> {
                rank_record& me = b.ranks[pg->rank()];
                const int first = pg->rank();
                for (int victim : {0, 1}) {
                    // Rank 0 dies in the first group; rank 1 of the first group (rank 0 of
                    // the shrunk one, serving its store) in the second.
                    co_await loop_until_failure(*pg, me, first == victim ? pg->rank() : -1, 5);
                    auto next = co_await pg->shrink();
                    ++me.shrinks;
                    co_await pg->close();
                    pg = std::move(next);
                }
                co_await check_group(*pg, me, first);
                co_await pg->close();
            },
            &port);
        CHECK_FALSE(res.ranks[0].ok());
        CHECK_FALSE(res.ranks[1].ok());
        check_survivors(b, all_but(4, {0, 1}), 2);
        ::munmap(&b, sizeof(board));
    }
}

TEST_CASE("three deaths in a row at 8 ranks, each followed by a shrink") {
    board& b = *new_board();
    // The ranks of the first group that die, one per round, each in the group of that round.
    static constexpr int victims[] = {1, 4, 6};
    auto res = run_job(8, "60", [&b](std::shared_ptr<cc::process_group> pg) -> cc::task<> {
        rank_record& me = b.ranks[pg->rank()];
        const int first = pg->rank();
        for (int victim : victims) {
            // The victim kills itself after 5 all_reduces of this round's group.
            co_await loop_until_failure(*pg, me, first == victim ? pg->rank() : -1, 5);
            auto next = co_await pg->shrink();
            ++me.shrinks;
            co_await pg->close();
            pg = std::move(next);
        }
        co_await check_group(*pg, me, first);
        co_await pg->close();
    });
    for (int r = 0; r < 8; ++r) {
        CAPTURE(r);
        bool victim = std::find(std::begin(victims), std::end(victims), r) != std::end(victims);
        CHECK(res.ranks[static_cast<std::size_t>(r)].ok() == !victim);
    }
    check_survivors(b, all_but(8, {1, 4, 6}), 3);
    ::munmap(&b, sizeof(board));
}

TEST_CASE("a rank that dies during the shrink itself is left out by the next try") {
    board& b = *new_board();
    auto res = run_job(4, "60", [&b](std::shared_ptr<cc::process_group> pg) -> cc::task<> {
        rank_record& me = b.ranks[pg->rank()];
        const int first = pg->rank();
        co_await loop_until_failure(*pg, me, 1, 10);
        if (first == 3) {
            // Dies 3 ms into its shrink: before it said it was alive, or while the new group
            // is set up, or just after; each ends with the same group on the others.
            auto die = [&]() -> cc::task<> {
                co_await pg->reactor().sleep_for(3ms);
                ::raise(SIGKILL);
            };
            co_await cc::when_all(pg->shrink(2s), die());
        }
        // Shrink (again, if the group it gave lost rank 3 too) until a group works.
        for (int round = 0; round < 3; ++round) {
            auto next = co_await pg->shrink(2s);
            ++me.shrinks;
            co_await pg->close();
            pg = std::move(next);
            try {
                co_await check_group(*pg, me, first);
                break;
            } catch (const std::system_error& e) {
                note(me, e.what());
            }
        }
        co_await pg->close();
    });
    CHECK_FALSE(res.ranks[1].ok());
    CHECK_FALSE(res.ranks[3].ok());
    for (int r : {0, 2}) {
        const rank_record& rec = b.ranks[r];
        CAPTURE(r);
        CAPTURE(std::string(rec.text));
        CHECK(res.ranks[static_cast<std::size_t>(r)].ok());
        CHECK(rec.final_members == all_but(4, {1, 3}));
        CHECK(rec.sum == 1 + 3);
        CHECK(rec.checked == 1);
        CHECK(rec.shrinks >= 1);
        CHECK(rec.shrinks <= 2);
    }
    ::munmap(&b, sizeof(board));
}

TEST_CASE("a stopped rank, found by the stall check, is left out, and learns it when it wakes") {
    board& b = *new_board();
    constexpr int n = 4;
    constexpr int victim = 2;
    // The stopper: SIGSTOP to the victim once every rank did 20 all_reduces, SIGCONT once the
    // survivors are done with their shrunk group.
    pid_t stopper = ::fork();
    REQUIRE(stopper >= 0);
    if (stopper == 0) {
        auto every = [&](auto pred) {
            for (int r = 0; r < n; ++r) {
                if (!pred(b.ranks[r], r)) return false;
            }
            return true;
        };
        for (int i = 0; i < 60'000 && !every([](rank_record&rec, int) {
                            return rec.pid != 0 && rec.completed >= 20;
                        });
             ++i) {
            ::usleep(1000);
        }
        ::kill(b.ranks[victim].pid, SIGSTOP);
        for (int i = 0; i < 60'000 && !every([](rank_record&rec, int r) {
                            return r == victim || rec.checked != 0;
                        });
             ++i) {
            ::usleep(1000);
        }
        ::kill(b.ranks[victim].pid, SIGCONT);
        ::_exit(0);
    }
    // Stall checks every 2 s (a 1 s answer window): failure_test's, which holds under TSan.
    auto res = run_job(n, "2", [&b](std::shared_ptr<cc::process_group> pg) -> cc::task<> {
        rank_record& me = b.ranks[pg->rank()];
        me.pid = ::getpid();
        const int first = pg->rank();
        co_await loop_until_failure(*pg, me, -1, 0);
        try {
            auto small = co_await pg->shrink(5s);
            ++me.shrinks;
            co_await check_group(*small, me, first);
            co_await small->close();
        } catch (const std::runtime_error& e) {
            note(me, e.what());
            me.left_out = 1;
        }
        co_await pg->close();
    });
    int status = 0;
    ::waitpid(stopper, &status, 0);
    for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        CAPTURE(res.ranks[static_cast<std::size_t>(r)].describe());
        CHECK(res.ranks[static_cast<std::size_t>(r)].ok());
    }
    check_survivors(b, all_but(n, {victim}), 1);
    const rank_record& late = b.ranks[victim];
    CAPTURE(std::string(late.text));
    CHECK(late.left_out == 1);
    CHECK(std::string(late.text).find("rank 2 of group 'default' was left out of the shrunk "
                                      "group: the others agreed on rank(s) 0,1,3") !=
          std::string::npos);
    ::munmap(&b, sizeof(board));
}

TEST_CASE("agree gives every survivor the same AND of their flags and the same failed ranks") {
    board& b = *new_board();
    constexpr int n = 4;
    auto res = run_job(n, "60", [&b](std::shared_ptr<cc::process_group> pg) -> cc::task<> {
        rank_record& me = b.ranks[pg->rank()];
        // On a sound group: everyone is counted; one false flag makes the AND false.
        auto sound = co_await pg->agree(true);
        auto one_no = co_await pg->agree(pg->rank() != 1);
        co_await loop_until_failure(*pg, me, 3, 5);
        // On the failed group, over the survivors.
        auto all_yes = co_await pg->agree(true);
        auto some_no = co_await pg->agree(pg->rank() != 2);
        bool ok = sound.value && sound.failed.empty() && !one_no.value && one_no.failed.empty() &&
                  all_yes.value && all_yes.failed == std::vector<int>{3} && !some_no.value &&
                  some_no.failed == std::vector<int>{3};
        me.checked = ok ? 1 : 0;
        if (!ok) {
            note(me, "agree: " + std::to_string(sound.value) + std::to_string(one_no.value) +
                         std::to_string(all_yes.value) + std::to_string(some_no.value) +
                         " failed sizes " + std::to_string(all_yes.failed.size()) +
                         std::to_string(some_no.failed.size()));
        }
        co_await pg->close();
    });
    for (int r = 0; r < 3; ++r) {
        CAPTURE(r);
        CAPTURE(std::string(b.ranks[r].text));
        CHECK(res.ranks[static_cast<std::size_t>(r)].ok());
        CHECK(b.ranks[r].checked == 1);
    }
    CHECK_FALSE(res.ranks[3].ok());
    ::munmap(&b, sizeof(board));
}

// A job of `n` ranks and `joiners` more processes: the ranks set a group of `n` up and run
// `body`; the joiners (RANK n, n+1, ...) wait until `ready` reaches `n - 1` (the survivors
// say when to come), then call join_process_group and run `check_group` on what they got,
// posing as rank `stands_for` of the first group, under board slot RANK.
// A process that joins (join_process_group) and checks the group it is admitted to, where it
// stands for the first group's rank `stands_for`.
cc::task<> join_and_check(cc::io::reactor& r, cc::init_options io, rank_record& me,
                          int stands_for) {
    auto g = co_await cc::join_process_group(r, io);
    co_await check_group(*g, me, stands_for);
    co_await g->close();
}

cc::spawn_result grow_job(board& b, int n, int joiners, std::atomic<int>& ready, int stands_for,
                          std::function<cc::task<>(std::shared_ptr<cc::process_group>)> body) {
    cc::spawn_options o;
    o.stop_others_on_failure = false;
    o.timeout = 100s;
    return cc::spawn_processes(
        n + joiners,
        [&]() -> int {
            ::setenv("COROCOLL_STALL_S", "60", 1);
            const int rank = std::atoi(std::getenv("RANK"));
            cc::io::reactor r;
            cc::init_options io;
            io.timeout = 60s;
            try {
                if (rank < n) {
                    ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
                    r.run([&]() -> cc::task<> {
                        co_await body(co_await cc::init_process_group(r, io));
                    }());
                    return 0;
                }
                for (int i = 0; i < 6000 && ready.load() < n - 1; ++i) ::usleep(10'000);
                r.run(join_and_check(r, io, b.ranks[rank], stands_for));
            } catch (const std::exception& e) {
                std::fprintf(stderr, "rank %d failed: %s\n", rank, e.what());
                return 1;
            }
            return 0;
        },
        o);
}

TEST_CASE("after a shrink, a process that joins is admitted by grow: the group is whole again") {
    board& b = *new_board();
    std::atomic<int>& ready = *corocoll_test::new_shared_board<std::atomic<int>>();
    constexpr int n = 4, victim = 3;
    auto res = grow_job(b, n, 1, ready, victim,
                        [&b, &ready](std::shared_ptr<cc::process_group> pg) -> cc::task<> {
                            rank_record& me = b.ranks[pg->rank()];
                            const int first = pg->rank();
                            co_await loop_until_failure(*pg, me, victim, 20);
                            auto small = co_await pg->shrink();
                            ++me.shrinks;
                            co_await pg->close();
                            ++ready;  // the launcher would start the replacement now
                            auto whole = co_await small->grow(n);
                            co_await small->close();
                            co_await check_group(*whole, me, first);
                            co_await whole->close();
                        });
    for (int r = 0; r <= n; ++r) {
        CAPTURE(r);
        CAPTURE(res.ranks[static_cast<std::size_t>(r)].describe());
        CHECK(res.ranks[static_cast<std::size_t>(r)].ok() == (r != victim));
    }
    // The survivors keep ranks 0-2; the joiner (slot 4) is rank 3, standing for the victim:
    // every member sees the first group's ranks {0, 1, 2, 3} again, and the sum 1+2+3+4.
    for (int r : {0, 1, 2, 4}) {
        const rank_record& rec = b.ranks[r];
        CAPTURE(r);
        CAPTURE(std::string(rec.text));
        CHECK(rec.final_members == 0b1111u);
        CHECK(rec.final_size == n);
        CHECK(rec.final_rank == (r == 4 ? victim : r));
        CHECK(rec.sum == 10);
        CHECK(rec.checked == 1);
    }
    ::munmap(&ready, sizeof(std::atomic<int>));
    ::munmap(&b, sizeof(board));
}

TEST_CASE("grow with too few joiners fails on every rank, and the group goes on") {
    board& b = *new_board();
    std::atomic<int>& ready = *corocoll_test::new_shared_board<std::atomic<int>>();
    // 3 ranks ask for 5; one process joins (it waits for the second grow, which wants one).
    auto res = grow_job(b, 3, 1, ready, 3,
                        [&b, &ready](std::shared_ptr<cc::process_group> pg) -> cc::task<> {
                            rank_record& me = b.ranks[pg->rank()];
                            const int first = pg->rank();
                            std::string error;
                            try {
                                if (co_await pg->grow(5, 300ms)) error = "it grew";
                            } catch (const std::runtime_error& e) {
                                error = e.what();
                            }
                            note(me, error);
                            std::vector<std::int64_t> one{1};
                            co_await pg->all_reduce(one);  // still sound
                            me.left_out = one[0] == 3 && !error.empty();
                            ready = 2;
                            auto four = co_await pg->grow(4);
                            co_await pg->close();
                            co_await check_group(*four, me, first);
                            co_await four->close();
                        });
    for (int r = 0; r < 4; ++r) {
        CAPTURE(r);
        CAPTURE(res.ranks[static_cast<std::size_t>(r)].describe());
        CHECK(res.ranks[static_cast<std::size_t>(r)].ok());
    }
    for (int r = 0; r < 3; ++r) {
        const std::string text = b.ranks[r].text;
        CAPTURE(r);
        CAPTURE(text);
        CHECK(b.ranks[r].left_out == 1);
        CHECK(text.find("was to grow to 5 ranks") != std::string::npos);
        CHECK(text.find("within 300 ms") != std::string::npos);
        // Rank 0 counted who came; the others heard it from rank 0.
        if (r == 0) CHECK(text.find("but 0 of the 2 process(es)") != std::string::npos);
    }
    for (int r : {0, 1, 2, 3}) {
        CAPTURE(r);
        CHECK(b.ranks[r].final_size == 4);
        CHECK(b.ranks[r].sum == 10);
        CHECK(b.ranks[r].checked == 1);
    }
    ::munmap(&ready, sizeof(std::atomic<int>));
    ::munmap(&b, sizeof(board));
}

TEST_CASE("a joiner that gave up is not counted, and the next grow passes over it") {
    board& b = *new_board();
    // step: 1 the quitter gave up, 2 the second joiner may go.
    std::atomic<int>& step = *corocoll_test::new_shared_board<std::atomic<int>>();
    constexpr int n = 3;
    cc::spawn_options o;
    o.stop_others_on_failure = false;
    o.timeout = 100s;
    auto res = cc::spawn_processes(
        n + 2,
        [&]() -> int {
            ::setenv("COROCOLL_STALL_S", "60", 1);
            const int slot = std::atoi(std::getenv("RANK"));
            rank_record& me = b.ranks[slot];
            cc::io::reactor r;
            cc::init_options io;
            io.timeout = 60s;
            auto wait_for = [&](int s) {
                for (int i = 0; i < 6000 && step.load() < s; ++i) ::usleep(10'000);
            };
            try {
                if (slot < n) {
                    ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
                    r.run([&]() -> cc::task<> {
                        auto pg = co_await cc::init_process_group(r, io);
                        wait_for(1);
                        me.left_out = co_await pg->joiners_waiting();  // the quitter: gone
                        co_await pg->barrier();
                        if (pg->rank() == 0) step = 2;
                        auto four = co_await pg->grow(n + 1, 30s);
                        co_await pg->close();
                        co_await check_group(*four, me, slot);
                        co_await four->close();
                    }());
                } else if (slot == n) {
                    // The quitter: waits 300 ms for a grow that does not come, and leaves.
                    io.timeout = 300ms;
                    try {
                        r.run([&]() -> cc::task<> { co_await cc::join_process_group(r, io); }());
                        note(me, "admitted");
                    } catch (const std::system_error& e) {
                        note(me, e.what());
                    }
                    step = 1;
                } else {
                    wait_for(2);
                    r.run(join_and_check(r, io, me, n));
                }
            } catch (const std::exception& e) {
                std::fprintf(stderr, "slot %d failed: %s\n", slot, e.what());
                return 1;
            }
            return 0;
        },
        o);
    for (int r = 0; r < n + 2; ++r) {
        CAPTURE(r);
        CAPTURE(res.ranks[static_cast<std::size_t>(r)].describe());
        CHECK(res.ranks[static_cast<std::size_t>(r)].ok());
    }
    const std::string quitter = b.ranks[n].text;
    CAPTURE(quitter);
    CHECK(quitter.find("was not admitted to group 'default' within 300 ms") != std::string::npos);
    for (int r : {0, 1, 2, 4}) {
        const rank_record& rec = b.ranks[r];
        CAPTURE(r);
        CAPTURE(std::string(rec.text));
        if (r < n) CHECK(rec.left_out == 0);  // joiners_waiting did not count the quitter
        CHECK(rec.final_members == 0b1111u);
        CHECK(rec.final_size == n + 1);
        CHECK(rec.final_rank == (r == 4 ? n : r));
        CHECK(rec.sum == 10);
        CHECK(rec.checked == 1);
    }
    ::munmap(&step, sizeof(std::atomic<int>));
    ::munmap(&b, sizeof(board));
}

TEST_CASE("a subgroup made by new_group is shrunk the same way") {
    board& b = *new_board();
    auto res = run_job(4, "60", [&b](std::shared_ptr<cc::process_group> world) -> cc::task<> {
        rank_record& me = b.ranks[world->rank()];
        const int first = world->rank();
        std::vector<int> three{0, 1, 3};
        auto sub = co_await world->new_group(three);
        if (sub) {
            // Rank 1 of the world (1 in the subgroup too) dies in the subgroup's loop.
            co_await loop_until_failure(*sub, me, first == 1 ? sub->rank() : -1, 5);
            auto small = co_await sub->shrink();
            ++me.shrinks;
            co_await check_group(*small, me, first);
            co_await small->close();
            co_await sub->close();
        }
        co_await world->close();
    });
    CHECK_FALSE(res.ranks[1].ok());
    for (int r : {0, 2, 3}) {
        CAPTURE(r);
        CAPTURE(res.ranks[static_cast<std::size_t>(r)].describe());
        CHECK(res.ranks[static_cast<std::size_t>(r)].ok());
    }
    check_survivors(b, all_but(4, {1, 2}), 1);
    ::munmap(&b, sizeof(board));
}

namespace {

int open_fds() {
    int n = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
        while (::readdir(d) != nullptr) ++n;
        ::closedir(d);
    }
    return n;
}

// Shared mappings (permissions "rw-s"): the rings and arenas of groups; the allocator's own
// (and a sanitizer's) are private and come and go.
int shared_mappings() {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    int n = 0;
    while (std::getline(maps, line)) {
        auto space = line.find(' ');
        if (space != std::string::npos && space + 4 < line.size() && line[space + 4] == 's') ++n;
    }
    return n;
}

// What a rank of a run of cycles (shrinks, grows) holds at cycle 10 and at the last.
struct held_counts {
    std::atomic<int> fds_at_10{0}, fds_at_end{0}, maps_at_10{0}, maps_at_end{0};
    std::atomic<long> keys_at_10{0}, keys_at_end{0};
    std::atomic<int> sums_right{0};
};

// At cycles 10 and `cycles`, counts the descriptors, shared mappings and `g`'s store keys this
// rank holds into `mine`, once every rank of `g` is past its close of the last group.
cc::task<> count_held(cc::process_group& g, held_counts& mine, int i, int cycles) {
    if (i != 10 && i != cycles) co_return;
    co_await g.barrier();
    long keys = co_await g.store().num_keys();
    (i == 10 ? mine.fds_at_10 : mine.fds_at_end) = open_fds();
    (i == 10 ? mine.maps_at_10 : mine.maps_at_end) = shared_mappings();
    (i == 10 ? mine.keys_at_10 : mine.keys_at_end) = keys;
    co_await g.barrier();
}

}  // namespace

TEST_CASE("100 shrinks in a row leave no descriptor, mapping or store key behind") {
    board& b = *new_board();
    constexpr int n = 4;
    // Under a sanitizer 40 (what a leak per shrink shows just as well, in a third of the time).
    constexpr int cycles = corocoll_test::sanitized ? 40 : 100;
    void* m = ::mmap(nullptr, sizeof(held_counts) * n, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    auto* c = new (m) held_counts[n];
    auto res = run_job(n, "60", [&b, c](std::shared_ptr<cc::process_group> pg) -> cc::task<> {
        rank_record& me = b.ranks[pg->rank()];
        const int first = pg->rank();
        for (int i = 1; i <= cycles; ++i) {
            auto next = co_await pg->shrink();
            co_await pg->close();
            pg = std::move(next);
            ++me.shrinks;
            co_await count_held(*pg, c[first], i, cycles);
        }
        co_await check_group(*pg, me, first);
        co_await pg->close();
    });
    check_survivors(b, all_but(n, {}), cycles);
    for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        CHECK(res.ranks[static_cast<std::size_t>(r)].ok());
        CHECK(c[r].fds_at_end == c[r].fds_at_10);
        CHECK(c[r].maps_at_end == c[r].maps_at_10);
        // What stays per shrink: its "came" and "members" keys (a late rank must learn that
        // it was left out), nothing per rank.
        CHECK(c[r].keys_at_end - c[r].keys_at_10 == 2 * (cycles - 10));
    }
    ::munmap(m, sizeof(held_counts) * n);
    ::munmap(&b, sizeof(board));
}

TEST_CASE("100 grows in a row leave no descriptor, mapping or store key behind") {
    // 3 ranks grow to 4 with the same process, which joins again each time; everyone closes
    // the grown group after one all_reduce, and the 3 ranks' own group goes on.
    constexpr int n = 3;
    constexpr int cycles = corocoll_test::sanitized ? 40 : 100;
    void* m = ::mmap(nullptr, sizeof(held_counts) * (n + 1), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    auto* c = new (m) held_counts[n + 1];
    // One cycle on the grown group `g`: the count at cycles 10 and `cycles`, then a check.
    auto cycle = [c](cc::process_group& g, int i) -> cc::task<> {
        held_counts& mine = c[g.rank()];
        co_await count_held(g, mine, i, cycles);
        std::vector<std::int64_t> v{g.rank() + 1};
        co_await g.all_reduce(v);
        if (v[0] == 10) ++mine.sums_right;
        co_await g.close();
    };
    cc::spawn_options o;
    o.stop_others_on_failure = false;
    o.timeout = 150s;
    auto res = cc::spawn_processes(
        n + 1,
        [&]() -> int {
            ::setenv("COROCOLL_STALL_S", "60", 1);
            const int rank = std::atoi(std::getenv("RANK"));
            cc::io::reactor r;
            cc::init_options io;
            io.timeout = 60s;
            try {
                r.run([&]() -> cc::task<> {
                    if (rank == n) {
                        for (int i = 1; i <= cycles; ++i)
                            co_await cycle(*co_await cc::join_process_group(r, io), i);
                        co_return;
                    }
                    ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
                    auto pg = co_await cc::init_process_group(r, io);
                    for (int i = 1; i <= cycles; ++i) co_await cycle(*co_await pg->grow(n + 1), i);
                    co_await pg->close();
                }());
            } catch (const std::exception& e) {
                std::fprintf(stderr, "rank %d failed: %s\n", rank, e.what());
                return 1;
            }
            return 0;
        },
        o);
    for (int r = 0; r <= n; ++r) {
        CAPTURE(r);
        CAPTURE(res.ranks[static_cast<std::size_t>(r)].describe());
        CHECK(res.ranks[static_cast<std::size_t>(r)].ok());
        CHECK(c[r].sums_right == cycles);
        CHECK(c[r].fds_at_end == c[r].fds_at_10);
        CHECK(c[r].maps_at_end == c[r].maps_at_10);
        // Nothing stays per grow: the joiners' names and tickets go once read, the set-up's
        // keys as every set-up's.
        CHECK(c[r].keys_at_end == c[r].keys_at_10);
    }
    ::munmap(m, sizeof(held_counts) * (n + 1));
}
