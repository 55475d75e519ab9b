// Collectives that go wrong: calls that do not match across ranks end in an error on every
// rank, naming what differs and where; bad arguments are refused before anything is sent;
// several collectives in flight, on one group and on several, complete correctly and in
// issue order; object collectives; monitored_barrier names the ranks that did not come.

#include "../support/ranks.hpp"

#include <doctest/doctest.h>

#include <map>
#include <utility>

using namespace corocoll_test;
namespace coll = corocoll::collectives;

namespace {

// Runs `body` on `n` ranks and returns every rank's error text ("" for none).
std::vector<std::string> errors_of(int n, const std::function<cc::task<>(cc::process_group&)>& body,
                                   std::chrono::milliseconds timeout = 20s) {
    thread_ranks_options o;
    o.timeout = timeout;
    std::vector<std::string> out;
    for (auto& e : run_threads(n, body, o)) out.push_back(what(e));
    return out;
}

// A rank whose part of a mismatched collective was only to send may finish it before a
// receiver finds the mismatch; the group has failed by then, so its next call reports it.
// Mismatch bodies therefore end with a barrier.
void check_every_rank_failed_with(const std::vector<std::string>& errors,
                                  const std::vector<std::string>& words) {
    for (std::size_t r = 0; r < errors.size(); ++r) {
        CAPTURE(r);
        CAPTURE(errors[r]);
        CHECK(errors[r] != "");
        for (const auto& w : words) CHECK(errors[r].find(w) != std::string::npos);
    }
}

}  // namespace

TEST_CASE("a rank calling another collective makes every rank fail, naming both calls") {
    auto t0 = std::chrono::steady_clock::now();
    auto errors = errors_of(4, [](cc::process_group& pg) -> cc::task<> {
        std::vector<float> t(100, 1.0f);
        if (pg.rank() == 2) {
            co_await pg.broadcast(t, 1);
        } else {
            co_await pg.all_reduce(t);
        }
        co_await pg.barrier();  // see check_every_rank_failed_with
    });
    check_every_rank_failed_with(errors, {"does not match", "all_reduce(sum, float32 x 100",
                                          "broadcast(root 1, float32 x 100"});
    CHECK(std::chrono::steady_clock::now() - t0 < 10s);  // an error, not the 20 s timeout
}

TEST_CASE(
    "a collective called without co_await fails the group on every rank, naming the call "
    "and the rank, instead of being skipped") {
    auto errors = errors_of(3, [](cc::process_group& pg) -> cc::task<> {
        std::vector<std::int64_t> t{pg.rank()};
        if (pg.rank() == 1) {
            // What `pg.all_reduce(t);` does when the nodiscard warning is ignored: the call is
            // dropped unawaited.
            static_cast<void>(pg.all_reduce(t));
        } else {
            co_await pg.all_reduce(t);
        }
        co_await pg.barrier();  // rank 1 learns it here at the latest
    });
    // Ranks 0 and 2 are inside the all_reduce that rank 1 never ran; none waits for a deadline.
    check_every_rank_failed_with(errors, {"rank 1 called all_reduce on group 'default' but never "
                                          "awaited it (a forgotten co_await?)"});
    for (const auto& e : errors) CHECK(e.find("timed out") == std::string::npos);
}

TEST_CASE("a collective kept as a task or started later runs; only a dropped one fails") {
    auto errors = errors_of(2, [](cc::process_group& pg) -> cc::task<> {
        std::vector<int> a{1}, b{2};
        cc::task<> kept = pg.all_reduce(a);  // handed over: runs when awaited
        auto later = pg.all_reduce(b);       // a collective_call, awaited below
        co_await std::move(kept);
        co_await std::move(later);
        if (a[0] != 2 || b[0] != 4) throw std::runtime_error("wrong sums");
    });
    for (const auto& e : errors) CHECK(e == "");
}

TEST_CASE("a rooted call kept as a task runs: its task is built when it is handed over") {
    // Broadcast, reduce, gather and scatter describe their call and build its task only when
    // it is needed: here by the conversion to a task, before any of them runs. Small and
    // large (the arena's lines, and beyond them).
    for (std::size_t n : {std::size_t{2}, std::size_t{20000}}) {
        auto errors = errors_of(2, [n](cc::process_group& pg) -> cc::task<> {
            const int me = pg.rank();
            std::vector<int> b(n, me == 0 ? 7 : 0), r(n, me + 1), g(n, me + 10), out(2 * n);
            std::vector<int> s(2 * n), one(n);
            for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<int>(i);
            std::vector<cc::task<>> kept;
            kept.push_back(pg.broadcast(b, 0));
            kept.push_back(pg.reduce(r, 0));
            kept.push_back(pg.gather_into(g, out, 0));
            kept.push_back(pg.scatter_from(one, s, 0));
            for (auto& t : kept) co_await std::move(t);
            for (std::size_t i = 0; i < n; ++i) {
                if (b[i] != 7) throw std::runtime_error("broadcast: wrong element");
                if (r[i] != (me == 0 ? 3 : 2)) throw std::runtime_error("reduce: wrong element");
                if (me == 0 && (out[i] != 10 || out[n + i] != 11)) {
                    throw std::runtime_error("gather: wrong element");
                }
                if (one[i] != static_cast<int>(static_cast<std::size_t>(me) * n + i)) {
                    throw std::runtime_error("scatter: wrong element");
                }
            }
        });
        for (const auto& e : errors) CHECK(e == "");
    }
}

TEST_CASE("a rank with another size, root, type or op makes every rank fail, saying so") {
    SUBCASE("size") {
        auto errors = errors_of(3, [](cc::process_group& pg) -> cc::task<> {
            std::vector<std::int32_t> t(pg.rank() == 1 ? 5 : 4, 1);
            co_await pg.all_reduce(t);
            co_await pg.barrier();  // see check_every_rank_failed_with
        });
        check_every_rank_failed_with(errors, {"int32 x 5", "int32 x 4"});
    }
    SUBCASE("root") {
        auto errors = errors_of(4, [](cc::process_group& pg) -> cc::task<> {
            std::vector<std::int64_t> t(8, pg.rank());
            co_await pg.broadcast(t, pg.rank() == 3 ? 2 : 0);
            co_await pg.barrier();  // see check_every_rank_failed_with
        });
        check_every_rank_failed_with(errors, {"does not match"});
    }
    SUBCASE("two roots") {
        // Each of two ranks calls itself the root of a small broadcast: neither waits at its
        // step. Whichever way the two meet, one sees the other's arrival, and its call, as it
        // goes on (shm_arena::arrive_and_go), so both fail by the barrier.
        for (int round = 0; round < 20; ++round) {
            CAPTURE(round);
            auto errors = errors_of(2, [](cc::process_group& pg) -> cc::task<> {
                std::vector<std::int64_t> t(2, pg.rank());
                co_await pg.broadcast(t, pg.rank());
                co_await pg.barrier();  // see check_every_rank_failed_with
            });
            check_every_rank_failed_with(errors, {"does not match", "root 0", "root 1"});
        }
    }
    SUBCASE("type") {
        auto errors = errors_of(2, [](cc::process_group& pg) -> cc::task<> {
            if (pg.rank() == 0) {
                std::vector<float> t(16, 1.0f);
                co_await pg.all_reduce(t);
            } else {
                std::vector<std::int32_t> t(16, 1);
                co_await pg.all_reduce(t);
            }
            co_await pg.barrier();  // see check_every_rank_failed_with
        });
        check_every_rank_failed_with(errors, {"float32 x 16", "int32 x 16"});
    }
    SUBCASE("op") {
        auto errors = errors_of(3, [](cc::process_group& pg) -> cc::task<> {
            std::vector<std::int32_t> t(16, 1);
            co_await pg.all_reduce(t, pg.rank() == 0 ? cc::reduce_op::max : cc::reduce_op::sum);
            co_await pg.barrier();  // see check_every_rank_failed_with
        });
        check_every_rank_failed_with(errors, {"all_reduce(max", "all_reduce(sum"});
    }
    SUBCASE("forced algorithm") {
        auto errors = errors_of(3, [](cc::process_group& pg) -> cc::task<> {
            pg.set_algorithm(
                coll::collective_kind::all_reduce,
                pg.rank() == 1 ? coll::algorithm::ring : coll::algorithm::recursive_doubling);
            std::vector<std::int32_t> t(16, 1);
            co_await pg.all_reduce(t);
            co_await pg.barrier();  // see check_every_rank_failed_with
        });
        check_every_rank_failed_with(errors, {"ring", "recursive_doubling"});
    }
}

TEST_CASE("bad arguments are refused before anything is sent, and the group goes on") {
    auto errors = errors_of(3, [](cc::process_group& pg) -> cc::task<> {
        std::vector<float> f(4, 1.0f);
        std::vector<std::int32_t> i(4, 1);
        int refused = 0;
        try {
            co_await pg.all_reduce(f, cc::reduce_op::bxor);
        } catch (const std::invalid_argument& e) {
            refused += std::string(e.what()).find("bxor") != std::string::npos;
        }
        try {
            co_await pg.broadcast(i, 7);
        } catch (const std::invalid_argument& e) {
            refused += std::string(e.what()).find("root 7 is outside [0, 3)") != std::string::npos;
        }
        std::vector<std::int32_t> wrong(5);
        try {
            co_await pg.all_gather_into(wrong, i);
        } catch (const std::invalid_argument& e) {
            refused += std::string(e.what()).find("12 expected") != std::string::npos;
        }
        // A list entry of the wrong size is refused before the gather, on every rank alike.
        std::vector<std::vector<std::int32_t>> outs{{0, 0, 0, 0}, {0, 0, 0}, {0, 0, 0, 0}};
        try {
            co_await pg.all_gather(outs, i);
        } catch (const std::invalid_argument& e) {
            refused += std::string(e.what()).find(
                           "all_gather: output list entry has 3 elements, "
                           "4 expected") != std::string::npos;
        }
        if (refused != 4)
            throw std::runtime_error("not every bad call was refused with its reason");
        // Nothing was sent: the group still works.
        co_await pg.all_reduce(i);
        if (i[0] != 3) throw std::runtime_error("the group broke");
    });
    for (const auto& e : errors) CHECK(e == "");
}

TEST_CASE("several collectives in flight on one group complete in issue order, correctly") {
    auto errors = errors_of(4, [](cc::process_group& pg) -> cc::task<> {
        std::vector<int> order;
        std::vector<std::vector<std::int64_t>> bufs(6,
                                                    std::vector<std::int64_t>(1000, pg.rank() + 1));
        std::vector<cc::work<>> works;
        for (int k = 0; k < 6; ++k) {
            works.push_back(cc::start([](cc::process_group& g, std::vector<std::int64_t>& b, int id,
                                         std::vector<int>& done) -> cc::task<> {
                if (id % 2 == 0) {
                    co_await g.all_reduce(b);
                } else {
                    co_await g.broadcast(b, id % g.size());
                }
                done.push_back(id);
            }(pg, bufs[k], k, order)));
        }
        for (auto& w : works) co_await w;
        if (order != std::vector<int>{0, 1, 2, 3, 4, 5})
            throw std::runtime_error("completed out of issue order");
        for (int k = 0; k < 6; ++k) {
            std::int64_t want = k % 2 == 0 ? 10 : (k % pg.size()) + 1;
            if (bufs[k][999] != want)
                throw std::runtime_error("wrong result of collective " + std::to_string(k));
        }
    });
    for (const auto& e : errors) CHECK(e == "");
}

TEST_CASE("a root far behind its senders checks each early frame once, not at every call") {
    // Rank 1 runs 2000 small gathers to rank 0 and then says so in a message; rank 0 reads that
    // message first, so the 2000 gathers' frames wait in its queue of early frames, then runs
    // the gathers. Each call checks the frames already there for its sequence number: reading
    // the whole queue each time examined 2000 * 2001 / 2 frames (issue 32: the root of a small
    // gather or reduce whose senders ran ahead spent 89% of its time there).
    constexpr int calls = 2000;
    std::vector<std::uint64_t> examined(2);
    // By messages (binomial): through the shared arena's lines (the default on one host) a
    // sender runs only a few calls ahead of its root.
    auto errors = errors_of(2, [&examined](cc::process_group& pg) -> cc::task<> {
        pg.set_algorithm(coll::collective_kind::gather, coll::algorithm::binomial);
        std::vector<std::int32_t> in(4, pg.rank() + 1), out(8), done(1);
        if (pg.rank() == 1) {
            for (int i = 0; i < calls; ++i) co_await pg.gather_into(in, out, 0);
            co_await pg.send(done, 0);
            co_return;
        }
        co_await pg.recv(done, 1);
        auto before = pg.engine().frames_checked_at_begin();
        for (int i = 0; i < calls; ++i) {
            co_await pg.gather_into(in, out, 0);
            if (out != std::vector<std::int32_t>{1, 1, 1, 1, 2, 2, 2, 2})
                throw std::runtime_error("wrong gather " + std::to_string(i));
        }
        examined[0] = pg.engine().frames_checked_at_begin() - before;
    });
    for (const auto& e : errors) CHECK(e == "");
    CAPTURE(examined[0]);
    // Per call: the frame of its own sequence number and the next one, which ends the look.
    CHECK(examined[0] <= 2 * calls);
    CHECK(examined[0] >= calls);
}

TEST_CASE("collectives on a subgroup and on the world group run at the same time") {
    auto errors = errors_of(4, [](cc::process_group& pg) -> cc::task<> {
        std::vector<int> evens{0, 2};
        auto sub = co_await pg.new_group(evens);
        std::vector<std::int32_t> w(1 << 16, 1), s(1 << 16, pg.rank());
        if (sub) {
            co_await cc::when_all(pg.all_reduce(w), sub->all_reduce(s));
            if (s[0] != 2) throw std::runtime_error("subgroup sum");
            if (sub->size() != 2 || sub->rank() != pg.rank() / 2)
                throw std::runtime_error("subgroup ranks");
            co_await sub->close();
        } else {
            co_await pg.all_reduce(w);
        }
        if (w[0] != 4) throw std::runtime_error("world sum");
        // split by colour: odd and even ranks, ordered by descending rank.
        auto half = co_await pg.split(pg.rank() % 2, -pg.rank());
        std::vector<std::int32_t> ranks{pg.rank()};
        std::vector<std::int32_t> all(2);
        co_await half->all_gather_into(all, ranks);
        int lo = pg.rank() % 2;
        if (all != std::vector<std::int32_t>{lo + 2, lo}) throw std::runtime_error("split order");
        co_await half->close();
    });
    for (const auto& e : errors) CHECK(e == "");
}

namespace {
struct point {
    std::string name;
    std::vector<double> xs;
    bool operator==(const point&) const = default;
};
void corocoll_serialize(cc::object_writer& w, const point& p) {
    w.write(p.name);
    w.write(p.xs);
}
void corocoll_deserialize(cc::object_reader& r, point& p) {
    r.read(p.name);
    r.read(p.xs);
}
}  // namespace

TEST_CASE("object collectives carry strings, vectors and user types of any size") {
    auto errors = errors_of(5, [](cc::process_group& pg) -> cc::task<> {
        int r = pg.rank(), n = pg.size();
        point mine{"rank " + std::to_string(r),
                   std::vector<double>(static_cast<std::size_t>(r) * 1000, r)};
        std::vector<point> gathered;
        co_await pg.gather_object(mine, gathered, 1);
        if (r == 1) {
            for (int p = 0; p < n; ++p) {
                if (gathered[p].name != "rank " + std::to_string(p) ||
                    gathered[p].xs.size() != static_cast<std::size_t>(p) * 1000) {
                    throw std::runtime_error("gather_object");
                }
            }
        }
        std::vector<std::map<std::string, int>> all;
        std::map<std::string, int> facts{{"rank", r}, {"square", r * r}};
        co_await pg.all_gather_object(all, facts);
        for (int p = 0; p < n; ++p) {
            if (all[p].at("square") != p * p) throw std::runtime_error("all_gather_object");
        }
        std::vector<std::string> list{"a", "b", "c"};
        if (r != 2) list = {"", "", ""};
        co_await pg.broadcast_object_list(list, 2);
        if (list != std::vector<std::string>{"a", "b", "c"})
            throw std::runtime_error("broadcast_object_list");
        std::vector<std::vector<int>> parts;
        for (int p = 0; p < n; ++p)
            parts.push_back(std::vector<int>(static_cast<std::size_t>(p) + 1, p));
        std::vector<int> got;
        // Named, not a conditional temporary inside co_await (g++ 12 destroys those twice).
        std::vector<std::vector<int>> source;
        if (r == 3) source = parts;
        co_await pg.scatter_object_list(got, source, 3);
        if (got != std::vector<int>(static_cast<std::size_t>(r) + 1, r))
            throw std::runtime_error("scatter_object_list");
    });
    for (const auto& e : errors) CHECK(e == "");
}

TEST_CASE("monitored_barrier names every rank that did not arrive, on every rank that did") {
    auto errors = errors_of(5, [](cc::process_group& pg) -> cc::task<> {
        if (pg.rank() == 2 || pg.rank() == 4) {
            co_await pg.reactor().sleep_for(1500ms);  // too late for a 300 ms barrier
        }
        co_await pg.monitored_barrier(300ms);
    });
    for (std::size_t r = 0; r < errors.size(); ++r) {
        CAPTURE(r);
        CHECK(errors[r].find("rank(s) 2, 4 did not arrive within 300 ms") != std::string::npos);
    }
    auto fine = errors_of(
        3, [](cc::process_group& pg) -> cc::task<> { co_await pg.monitored_barrier(2s); });
    for (const auto& e : fine) CHECK(e == "");
}

// A small broadcast, reduce, gather or scatter in the arena's lines runs at once when awaited,
// without starting its task, where nothing in it would wait: on a rank that writes and goes on
// (a broadcast's or scatter's root, the others of a reduce or gather) once the others are done
// with its lines (here after a barrier); on a rank that waits once those it waits for have
// arrived (here after a message each sends behind its call). The counts say which way each
// call went.
TEST_CASE("a small rooted call that would not wait runs at once, without its task") {
    constexpr int rounds = 3;
    std::vector<std::uint64_t> at_once(2);
    // Without an arena (the suite's run over TCP) every call goes by its task.
    int arenas = 0;
    auto errors = errors_of(2, [&at_once, &arenas](cc::process_group& pg) -> cc::task<> {
        if (pg.has_arena() && pg.rank() == 0) ++arenas;
        std::vector<std::int64_t> v(2), all(4), token(1);
        const std::uint64_t before = pg.calls_run_at_once();
        const int me = pg.rank();
        auto check = [](bool ok, const char* what, int round) {
            if (!ok)
                throw std::runtime_error(std::string("wrong ") + what + " in round " +
                                         std::to_string(round));
        };
        for (int round = 0; round < rounds; ++round) {
            // broadcast and scatter from 0: rank 0 writes, then tells rank 1.
            co_await pg.barrier();
            if (me == 0) {
                v = {round, round + 10};
                co_await pg.broadcast(v, 0);
                co_await pg.send(token, 1);
            } else {
                co_await pg.recv(token, 0);
                v = {-1, -1};
                co_await pg.broadcast(v, 0);
                check(v == std::vector<std::int64_t>{round, round + 10}, "broadcast", round);
            }
            co_await pg.barrier();
            all = {round, round + 1, round + 2, round + 3};
            if (me == 0) {
                co_await pg.scatter_from(v, all, 0);
                co_await pg.send(token, 1);
                check(v == std::vector<std::int64_t>{round, round + 1}, "scatter", round);
            } else {
                co_await pg.recv(token, 0);
                co_await pg.scatter_from(v, all, 0);
                check(v == std::vector<std::int64_t>{round + 2, round + 3}, "scatter", round);
            }
            // reduce and gather to 0: rank 1 writes, then tells rank 0.
            co_await pg.barrier();
            v = {me + round, 1};
            if (me == 1) {
                co_await pg.reduce(v, 0);
                co_await pg.send(token, 0);
            } else {
                co_await pg.recv(token, 1);
                co_await pg.reduce(v, 0);
                check(v == std::vector<std::int64_t>{1 + 2 * round, 2}, "reduce", round);
            }
            co_await pg.barrier();
            v = {me, round};
            if (me == 1) {
                co_await pg.gather_into(v, all, 0);
                co_await pg.send(token, 0);
            } else {
                co_await pg.recv(token, 1);
                co_await pg.gather_into(v, all, 0);
                check(all == std::vector<std::int64_t>{0, round, 1, round}, "gather", round);
            }
        }
        at_once[static_cast<std::size_t>(me)] = pg.calls_run_at_once() - before;
    });
    for (const auto& e : errors) CHECK(e == "");
    CHECK(at_once[0] == (arenas == 1 ? 4 * rounds : 0));
    CHECK(at_once[1] == (arenas == 1 ? 4 * rounds : 0));
}

TEST_CASE("a small broadcast run at once still compares the calls") {
    // Rank 1 comes to the broadcast after the root arrived (a message behind it), with another
    // count: it runs at once and finds the mismatch there; the root, gone on, learns it at its
    // barrier.
    auto errors = errors_of(2, [](cc::process_group& pg) -> cc::task<> {
        std::vector<std::int64_t> token(1);
        if (pg.rank() == 0) {
            std::vector<std::int64_t> v(2, 7);
            co_await pg.broadcast(v, 0);
            co_await pg.send(token, 1);
        } else {
            std::vector<std::int64_t> v(3);
            co_await pg.recv(token, 0);
            co_await pg.broadcast(v, 0);
        }
        co_await pg.barrier();  // see check_every_rank_failed_with
    });
    check_every_rank_failed_with(errors, {"int64 x 2", "int64 x 3"});
}

TEST_CASE("a small gather run at once on its root still compares the calls") {
    // Rank 1 gathers 2 elements to rank 0 and tells it; rank 0 comes with 3, runs at once (rank
    // 1 arrived) and finds the mismatch there; rank 1, gone on, learns it at its barrier.
    auto errors = errors_of(2, [](cc::process_group& pg) -> cc::task<> {
        std::vector<std::int64_t> token(1);
        if (pg.rank() == 1) {
            std::vector<std::int64_t> in(2, 7), out;
            co_await pg.gather_into(in, out, 0);
            co_await pg.send(token, 0);
        } else {
            std::vector<std::int64_t> in(3), out(6);
            co_await pg.recv(token, 1);
            co_await pg.gather_into(in, out, 0);
        }
        co_await pg.barrier();  // see check_every_rank_failed_with
    });
    check_every_rank_failed_with(errors, {"int64 x 2", "int64 x 3"});
}
