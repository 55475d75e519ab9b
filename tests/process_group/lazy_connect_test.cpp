// Connections on first use (engine_options::connect, COROCOLL_CONNECT=lazy): which pairs of
// ranks are connected after set-up and after each kind of traffic, that two ranks dialling each
// other at once end with one connection and lose nothing, and that a rank's death is named on
// every survivor when only some pairs are connected.

#include "../support/port.hpp"
#include "../support/process_board.hpp"
#include "../support/ranks.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <latch>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

using namespace corocoll_test;
namespace coll = cc::collectives;

namespace {

void expect(bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error("check failed: " + what);
}

// The peers this rank has a connection to, as the group reports it.
std::set<int> connected(cc::process_group& pg) {
    std::set<int> s;
    for (int p = 0; p < pg.size(); ++p) {
        if (p != pg.rank() && *pg.channel_to(p) != '\0') s.insert(p);
    }
    return s;
}

std::string spell(const std::set<int>& s) {
    std::string out = "{";
    for (int p : s) out += (out.size() > 1 ? ", " : "") + std::to_string(p);
    return out + "}";
}

void expect_peers(cc::process_group& pg, const std::set<int>& want, const std::string& when) {
    auto got = connected(pg);
    expect(got == want, "rank " + std::to_string(pg.rank()) + " " + when + ": connected to " +
                            spell(got) + ", expected " + spell(want));
}

std::set<int> ring_of(int r, int n) { return {(r + 1) % n, (r + n - 1) % n}; }

// Runs `body` on `n` thread ranks whose group connects on first use over TCP, and checks that
// every rank finished.
void on_lazy_tcp(int n, const std::function<cc::task<>(cc::process_group&)>& body) {
    thread_ranks_options o;
    o.limits.connect = cc::transport::connect_mode::lazy;
    o.limits.transport = cc::transport::transport_choice::tcp;
    check_every_rank_ok(run_threads(n, body, o));
}

// 4 ranks whose set-up connected the ring 0-1-2-3-0: ranks 0-2 and 1-3 each send `count`
// messages to the other at once (both dial), and each receives the other's in order; one
// connection per pair after.
cc::task<> cross_first_uses(cc::process_group& pg, int count) {
    int across = (pg.rank() + 2) % 4;
    expect(connected(pg).count(across) == 0, "across pair connected at set-up");
    std::vector<std::vector<int>> outs;
    std::vector<cc::task<>> sends;
    for (int i = 0; i < count; ++i) outs.push_back({pg.rank() * 1000 + i});
    for (int i = 0; i < count; ++i) sends.push_back(pg.send(outs[i], across, 7));
    auto receive = [&]() -> cc::task<> {
        for (int i = 0; i < count; ++i) {
            std::vector<int> in{-1};
            co_await pg.recv(in, across, 7);
            expect(in[0] == across * 1000 + i, "message " + std::to_string(i) + " from rank " +
                                                   std::to_string(across) + " in order");
        }
    };
    co_await cc::when_all(cc::when_all(std::move(sends)), receive());
    expect(connected(pg).size() == 3, "one connection per pair");
}

}  // namespace

TEST_CASE(
    "16 ranks on first use: set-up connects the ring, a ring all_reduce adds nothing, a "
    "binomial broadcast its tree, an all_to_all the rest") {
    // Each in a group of its own, checked when the call returns: nothing that a later call of
    // another rank would dial (a receive dials too) may come between.
    const int n = 16;
    SUBCASE("ring all_reduce") {
        on_lazy_tcp(n, [](cc::process_group& pg) -> cc::task<> {
            int r = pg.rank(), n = pg.size();
            expect_peers(pg, ring_of(r, n), "after set-up");
            pg.set_algorithm(coll::collective_kind::all_reduce, coll::algorithm::ring);
            std::vector<float> v(4096, 1.0f + static_cast<float>(r));
            co_await pg.all_reduce(v);
            expect(v[0] == static_cast<float>(n * (n + 1) / 2) && v[4095] == v[0],
                   "ring all_reduce result");
            expect_peers(pg, ring_of(r, n), "after a ring all_reduce");
        });
    }
    SUBCASE("binomial broadcast") {
        on_lazy_tcp(n, [](cc::process_group& pg) -> cc::task<> {
            int r = pg.rank(), n = pg.size();
            pg.set_algorithm(coll::collective_kind::broadcast, coll::algorithm::binomial);
            std::vector<int> b(64, r == 0 ? 42 : -1);
            co_await pg.broadcast(b, 0);
            expect(b[0] == 42 && b[63] == 42, "binomial broadcast result");
            // The tree from root 0: rank v's parent is v with its lowest set bit cleared.
            auto want = ring_of(r, n);
            if (r != 0) want.insert(r & (r - 1));
            for (int c = 1; c < n; ++c) {
                if ((c & (c - 1)) == r) want.insert(c);
            }
            expect_peers(pg, want, "after a binomial broadcast");
        });
    }
    SUBCASE("all_to_all") {
        on_lazy_tcp(n, [](cc::process_group& pg) -> cc::task<> {
            int r = pg.rank(), n = pg.size();
            std::vector<int> out(static_cast<std::size_t>(n)), in(static_cast<std::size_t>(n));
            for (int p = 0; p < n; ++p) out[static_cast<std::size_t>(p)] = r * 100 + p;
            co_await pg.all_to_all_single(in, out);
            for (int p = 0; p < n; ++p) {
                expect(in[static_cast<std::size_t>(p)] == p * 100 + r, "all_to_all block");
            }
            expect(connected(pg).size() == static_cast<std::size_t>(n - 1),
                   "after an all_to_all: connected to " + spell(connected(pg)));
        });
    }
}

TEST_CASE("two ranks that dial each other at once keep one connection and lose no message") {
    // 4 ranks: set-up connects the ring 0-1-2-3-0; pairs 0-2 and 1-3 open when both ends send
    // to each other at the same moment, again and again in fresh groups.
    for (int round = 0; round < 12; ++round) {
        CAPTURE(round);
        on_lazy_tcp(4, [](cc::process_group& pg) -> cc::task<> {
            co_await cross_first_uses(pg, 50);
            co_await pg.barrier();
        });
    }
}

namespace {

struct death_board {
    std::atomic<int> failed_rank[4] = {};
    std::atomic<int> failed[4] = {};
    char text[4][1500] = {};
};

}  // namespace

TEST_CASE("a rank that dies on first use is named on every survivor, connected to it or not") {
    // Rank 2 ends right after set-up without closing its group. Rank 0, which is not its ring
    // neighbour, receives from it (which dials it); ranks 1 and 3, its neighbours, wait for rank
    // 0. They see the death and tell the others around the ring. Over TCP, and on one host
    // (where the ring's pairs share memory and rank 0's dial would have handed a segment over).
    const char* transport = "tcp";
    SUBCASE("tcp") {}
    SUBCASE("shm") { transport = "shm"; }
    CAPTURE(transport);
    auto* b = new_shared_board<death_board>();
    for (auto& f : b->failed_rank) f = -2;
    process_job j;
    j.ranks = 4;
    j.stall_s = "0";  // no status rounds: the connections alone must tell
    j.timeout = std::chrono::seconds(60);
    j.before = [transport] {
        ::setenv("COROCOLL_CONNECT", "lazy", 1);
        ::setenv("COROCOLL_TRANSPORT", transport, 1);
    };
    auto res = run_process_job(j, [b](std::shared_ptr<cc::process_group> pg) -> cc::task<> {
        int r = pg->rank();
        if (r == 2) ::_exit(0);
        std::vector<int> v(1);
        try {
            co_await pg->recv(v, r == 0 ? 2 : 0);
            note(b->text[r], "the receive completed");
        } catch (const std::system_error& e) {
            note(b->text[r], e.what());
            b->failed[r] = 1;
        }
        // Rank 0's dial finds nobody: that fails its receive, as a goodbye would; the group
        // fails once the death reaches it around the ring.
        auto f = co_await pg->when_failed();
        b->failed_rank[r] = f.failed_ranks.size() == 1 ? f.failed_ranks[0] : -1;
        co_await pg->close();
    });
    for (int r : {0, 1, 3}) {
        CAPTURE(r);
        CAPTURE(std::string(b->text[r]));
        CHECK(b->failed[r].load() == 1);
        CHECK(b->failed_rank[r].load() == 2);
        CHECK(std::string(b->text[r]).find("rank 2") != std::string::npos);
        CHECK(res.ranks[static_cast<std::size_t>(r)].ok());
    }
    ::munmap(b, sizeof(death_board));
}

TEST_CASE(
    "the rank that serves the store keeps it up until the ranks it never connected to are done "
    "with it") {
    // As mpirun and torchrun without an agent store start a job: MASTER_ADDR and MASTER_PORT,
    // and rank 0 serves the store. On first use, rank 0 has no connection to rank 2, so its
    // close cannot hear rank 2 leave as it hears its ring neighbours. Rank 0 closes at once
    // and its process ends; rank 2 uses the store a moment later (as init's own last steps
    // may, on a loaded machine) and must find it up.
    corocoll_test::reserved_port store_port;
    auto* b = new_shared_board<death_board>();
    process_job j;
    j.ranks = 4;
    j.before = [&store_port] {
        ::setenv("COROCOLL_CONNECT", "lazy", 1);
        ::unsetenv("TORCHELASTIC_USE_AGENT_STORE");
        ::setenv("MASTER_PORT", std::to_string(store_port.port()).c_str(), 1);
    };
    auto res = run_process_job(j, [b](std::shared_ptr<cc::process_group> pg) -> cc::task<> {
        int r = pg->rank();
        if (r == 2) {
            expect(connected(*pg).count(0) == 0, "rank 2 connected to rank 0 at set-up");
            co_await pg->reactor().sleep_for(300ms);
            try {
                co_await pg->store().set("late/2", "still here");
                std::string got = co_await pg->store().get("late/2");
                note(b->text[r], got.c_str());
            } catch (const std::system_error& e) {
                note(b->text[r], e.what());
                b->failed[r] = 1;
            }
        }
        co_await pg->close();
    });
    CAPTURE(std::string(b->text[2]));
    CHECK(b->failed[2].load() == 0);
    CHECK(std::string(b->text[2]) == "still here");
    for (int r = 0; r < 4; ++r) {
        CAPTURE(r);
        CHECK(res.ranks[static_cast<std::size_t>(r)].ok());
    }
    ::munmap(b, sizeof(death_board));
}

TEST_CASE(
    "a rank that failed the group and closed it before a first use is reported by the failure, "
    "not as unreachable") {
    // Rank 3 revokes the group and closes it; then rank 1, not its ring neighbour, sends to it.
    // The dial finds nobody listening, while the revoke is still on its way around the ring:
    // ranks 0 and 2 hold their reactors still until rank 1 sends, and a moment longer. Rank 1
    // must report the revoke, not that rank 3 cannot be reached.
    cc::transport::transport_choice transport = cc::transport::transport_choice::tcp;
    SUBCASE("tcp") {}
    SUBCASE("shm") { transport = cc::transport::transport_choice::shm; }
    std::latch started(1), closed(1), sending(1);
    thread_ranks_options o;
    o.limits.connect = cc::transport::connect_mode::lazy;
    o.limits.transport = transport;
    auto res = run_threads(
        4,
        [&](cc::process_group& pg) -> cc::task<> {
            int r = pg.rank();
            if (r == 3) {
                started.wait();
                pg.revoke("rank 3 gives up");
                co_await pg.close();
                closed.count_down();
            } else if (r == 1) {
                expect_peers(pg, ring_of(1, 4), "after set-up");
                started.count_down();
                closed.wait();
                sending.count_down();
                std::vector<int> v{1};
                co_await pg.send(v, 3);
            } else {
                sending.wait();  // blocks this thread: its reactor reads nothing meanwhile
                std::this_thread::sleep_for(50ms);
                co_await pg.when_failed();
            }
        },
        o);
    std::string e1 = what(res[1]);
    CAPTURE(e1);
    CHECK(e1.find("rank 3 revoked process group 'default'") != std::string::npos);
    CHECK(e1.find("rank 3 gives up") != std::string::npos);
    CHECK(e1.find("cannot be reached") == std::string::npos);
    for (int r : {0, 2, 3}) CHECK(what(res[static_cast<std::size_t>(r)]) == "");
}

TEST_CASE("COROCOLL_CONNECT takes eager or lazy and refuses anything else, naming itself") {
    // Unset or empty: connections on first use, the default.
    const char* was = std::getenv("COROCOLL_CONNECT");
    std::string saved = was != nullptr ? was : "";
    ::unsetenv("COROCOLL_CONNECT");
    CHECK(cc::transport::connect_from_env() == cc::transport::connect_mode::lazy);
    if (was != nullptr) ::setenv("COROCOLL_CONNECT", saved.c_str(), 1);
    CHECK(cc::transport::parse_connect("") == cc::transport::connect_mode::lazy);
    CHECK(cc::transport::parse_connect("eager") == cc::transport::connect_mode::eager);
    CHECK(cc::transport::parse_connect("lazy") == cc::transport::connect_mode::lazy);
    try {
        cc::transport::parse_connect("sometimes");
        FAIL("accepted 'sometimes'");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("COROCOLL_CONNECT='sometimes'") != std::string::npos);
    }
}

TEST_CASE("ranks set up one eager and one lazy refuse each other, saying so") {
    auto server = std::make_shared<cc::rendezvous::tcp_store_server>(cc::io::endpoint::loopback(0));
    auto errors = run_ranks(2, [&](int rank, cc::io::reactor& r) -> cc::task<> {
        cc::init_options init;
        init.rank = rank;
        init.world_size = 2;
        init.timeout = 4s;
        init.limits.transport = cc::transport::transport_choice::tcp;
        init.limits.connect =
            rank == 0 ? cc::transport::connect_mode::lazy : cc::transport::connect_mode::eager;
        init.store = co_await cc::rendezvous::tcp_store::connect(r, server->local_endpoint(), 4s);
        auto pg = co_await cc::init_process_group(r, init);
        co_await pg->close();
    });
    CHECK(what(errors[0]) != "");
    CHECK(what(errors[1]) != "");
    bool said = false;
    for (const auto& e : errors) {
        if (what(e).find("COROCOLL_CONNECT=lazy") != std::string::npos) said = true;
    }
    CAPTURE(what(errors[0]));
    CAPTURE(what(errors[1]));
    CHECK(said);
}

namespace {

// Runs `body` on `n` thread ranks whose group connects on first use, shared memory allowed.
void on_lazy_host(int n, const std::function<cc::task<>(cc::process_group&)>& body) {
    thread_ranks_options o;
    o.limits.connect = cc::transport::connect_mode::lazy;
    o.limits.transport = cc::transport::transport_choice::shm;
    check_every_rank_ok(run_threads(n, body, o));
}

cc::task<> receive(cc::process_group& pg, std::vector<int>& in, int from) {
    co_await pg.recv(in, from, 3);
}

void expect_kinds(cc::process_group& pg, const std::string& when) {
    for (int p : connected(pg)) {
        expect(std::string(pg.channel_to(p)) == "shm",
               "rank " + std::to_string(pg.rank()) + " " + when + ": channel to rank " +
                   std::to_string(p) + " is " + pg.channel_to(p) + ", not shm");
    }
}

}  // namespace

TEST_CASE("ranks on one host connect on first use over shared memory, with the arena") {
    const int n = 8;
    SUBCASE("set-up gives the ring its segments, messages to every rank the rest") {
        on_lazy_host(n, [](cc::process_group& pg) -> cc::task<> {
            int r = pg.rank(), n = pg.size();
            expect_peers(pg, ring_of(r, n), "after set-up");
            expect_kinds(pg, "after set-up");
            expect(pg.has_arena(), "rank " + std::to_string(r) + " has no arena");
            // Collectives go through the arena here; messages between every pair open the rest
            // (a payload larger than a ring, so that it wraps).
            const std::size_t count = (std::size_t{3} << 20) / sizeof(int);
            std::vector<std::vector<int>> outs(static_cast<std::size_t>(n)),
                ins(static_cast<std::size_t>(n));
            std::vector<cc::task<>> ops;
            for (int p = 0; p < n; ++p) {
                if (p == r) continue;
                auto& out = outs[static_cast<std::size_t>(p)];
                out.assign(count, r * 100 + p);
                out.back() = -(r * 100 + p);
                ins[static_cast<std::size_t>(p)].assign(count, -1);
                ops.push_back(pg.send(out, p, 3));
                ops.push_back(receive(pg, ins[static_cast<std::size_t>(p)], p));
            }
            co_await cc::when_all(std::move(ops));
            for (int p = 0; p < n; ++p) {
                if (p == r) continue;
                const auto& in = ins[static_cast<std::size_t>(p)];
                expect(in[0] == p * 100 + r && in[count / 2] == in[0] && in.back() == -in[0],
                       "message from rank " + std::to_string(p));
            }
            expect(connected(pg).size() == static_cast<std::size_t>(n - 1),
                   "after messages to every rank: connected to " + spell(connected(pg)));
            expect_kinds(pg, "after messages to every rank");
        });
    }
    SUBCASE("two ranks that dial each other at once share one segment and lose nothing") {
        for (int round = 0; round < 6; ++round) {
            CAPTURE(round);
            on_lazy_host(4, [](cc::process_group& pg) -> cc::task<> {
                co_await cross_first_uses(pg, 40);
                expect_kinds(pg, "after crossing first uses");
                co_await pg.barrier();
            });
        }
    }
}

namespace {

// What /proc/self/maps says this process maps of corocoll's shared memory: pair segments and
// arenas (memfds named "corocoll-shm" and "corocoll-arena").
struct shm_maps {
    long segments = 0;
    long segment_bytes = 0;
    long arenas = 0;
    long arena_bytes = 0;
};

shm_maps read_shm_maps() {
    shm_maps m;
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
        unsigned long lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) != 2) continue;
        auto bytes = static_cast<long>(hi - lo);
        if (line.find("/memfd:corocoll-shm") != std::string::npos) {
            ++m.segments;
            m.segment_bytes += bytes;
        } else if (line.find("/memfd:corocoll-arena") != std::string::npos) {
            ++m.arenas;
            m.arena_bytes += bytes;
        }
    }
    return m;
}

struct maps_board {
    static constexpr int most = 64;
    std::atomic<long> segments[2][most] = {};
    std::atomic<long> segment_bytes[2][most] = {};
    std::atomic<long> arenas[most] = {};
    std::atomic<long> arena_bytes[most] = {};
    std::atomic<int> kinds_ok[most] = {};
};

// `n` process ranks on this host, connecting as `connect` says: what each maps after set-up
// and after a ring all_reduce.
maps_board* map_job(int n, const char* connect) {
    auto* b = new_shared_board<maps_board>();
    process_job j;
    j.ranks = n;
    j.timeout = std::chrono::seconds(120);
    j.job_timeout = std::chrono::seconds(150);
    j.before = [connect] {
        ::setenv("COROCOLL_CONNECT", connect, 1);
        ::setenv("COROCOLL_TRANSPORT", "shm", 1);
    };
    auto res = run_process_job(
        j, then_close([b](cc::process_group& pg) -> cc::task<> {
            int r = pg.rank();
            auto m = read_shm_maps();
            b->segments[0][r] = m.segments;
            b->segment_bytes[0][r] = m.segment_bytes;
            pg.set_algorithm(coll::collective_kind::all_reduce, coll::algorithm::ring);
            std::vector<float> v(70000, 1.0f);
            co_await pg.all_reduce(v);
            expect(v[0] == static_cast<float>(pg.size()) && v.back() == v[0], "ring all_reduce");
            m = read_shm_maps();
            b->segments[1][r] = m.segments;
            b->segment_bytes[1][r] = m.segment_bytes;
            b->arenas[r] = m.arenas;
            b->arena_bytes[r] = m.arena_bytes;
            bool ok = true;
            for (int p : connected(pg)) ok = ok && std::string(pg.channel_to(p)) == "shm";
            b->kinds_ok[r] = ok ? 1 : 0;
            // Not a barrier: its dissemination rounds would dial beyond the ring while a slower
            // rank still counts.
            co_await pg.all_reduce(v);
        }));
    for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        CHECK(res.ranks[static_cast<std::size_t>(r)].ok());
    }
    return b;
}

}  // namespace

TEST_CASE("64 process ranks on first use map two pair segments each, not 63") {
    // The bound of shared memory per rank: the two ring neighbours' segments and the arena,
    // counted in /proc/self/maps. The eager mesh of 8 ranks shows the count is the pairs'.
    const long segment = static_cast<long>(cc::transport::detail::shm_segment::bytes_for(
        cc::transport::engine_options{}.shm_ring_bytes));
    SUBCASE("eager, 8 ranks: every pair") {
        auto* b = map_job(8, "eager");
        for (int r = 0; r < 8; ++r) {
            CAPTURE(r);
            CHECK(b->segments[0][r].load() == 7);
            CHECK(b->segment_bytes[0][r].load() == 7 * segment);
            CHECK(b->arenas[r].load() == 1);
        }
        ::munmap(b, sizeof(maps_board));
    }
    SUBCASE("on first use, 64 ranks: the ring") {
        const int n = 64;
        auto* b = map_job(n, "lazy");
        long arena = b->arena_bytes[0];
        for (int r = 0; r < n; ++r) {
            CAPTURE(r);
            CHECK(b->segments[0][r].load() == 2);
            CHECK(b->segments[1][r].load() == 2);
            CHECK(b->segment_bytes[1][r].load() == 2 * segment);
            CHECK(b->arenas[r].load() == 1);
            CHECK(b->arena_bytes[r].load() == arena);
            CHECK(b->kinds_ok[r].load() == 1);
        }
        MESSAGE("per rank: 2 segments of ", segment, " bytes and an arena of ", arena, " bytes");
        ::munmap(b, sizeof(maps_board));
    }
}
