// The engine's receive operation: posted now and awaited later, withdrawn when dropped,
// matched in posting order across named and any-source receives, and costing no coroutine
// frame of its own. Two engines on one reactor, joined by a loopback connection.

#include "../support/io.hpp"
#include "../support/pattern.hpp"

#include <corocoll/corocoll.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

using namespace corocoll_test;
using namespace std::chrono_literals;

namespace {

// Ranks 0 and 1 of a group of two, on one reactor.
struct engine_pair {
    cc::io::reactor& r;
    std::optional<cc::transport::engine> e0, e1;

    explicit engine_pair(cc::io::reactor& reactor, cc::transport::engine_options o = {})
        : r(reactor) {
        auto [a, b] = r.run(connected_pair(r));
        std::vector<cc::io::socket> to_1(2), to_0(2);
        to_1[1] = std::move(a);
        to_0[0] = std::move(b);
        e0.emplace(r, 0, 2, std::move(to_1), o);
        e1.emplace(r, 1, 2, std::move(to_0), o);
    }
    ~engine_pair() { r.run(cc::when_all(e0->close(), e1->close())); }
};

auto soon() { return cc::io::deadline_after(30s); }

}  // namespace

TEST_CASE("a receive started before its message is sent gets it, and yields sender and length") {
    cc::io::reactor r;
    engine_pair ep(r);
    auto out = pattern(100000, 3);  // larger than the staging buffer: read into place
    std::vector<std::byte> in(out.size() + 5);
    auto op = ep.e1->recv(in, 0, 7, soon());
    op.start();
    CHECK_FALSE(op.is_completed());
    r.run(ep.e0->send(out, 1, 7, soon()));
    auto got = r.run([&]() -> cc::task<cc::transport::recv_result> { co_return co_await op; }());
    CHECK(got.source == 0);
    CHECK(got.length == out.size());
    CHECK(std::equal(out.begin(), out.end(), in.begin()));
}

TEST_CASE("a peer's staging buffer grows to fit a frame of up to 64 KiB, keeping what is staged") {
    cc::transport::detail::peer ps;
    std::span<std::byte> room = ps.staging_room();
    REQUIRE(room.size() == cc::transport::detail::peer::staging_bytes);
    auto bytes = pattern(100, 5);
    std::copy(bytes.begin(), bytes.end(), room.begin());
    ps.staged_end = 100;
    ps.staged_begin = 10;
    ps.fit_staging(16 << 10);  // fits already
    CHECK(ps.staging_size == std::size_t{16} << 10);
    ps.fit_staging((16 << 10) + 1);
    CHECK(ps.staging_size == std::size_t{32} << 10);
    CHECK(ps.staged_begin == 0);
    CHECK(ps.staged_end == 90);
    std::vector<std::byte> held(90);
    CHECK(ps.take_staged(held).empty());
    CHECK(std::equal(held.begin(), held.end(), bytes.begin() + 10));
    CHECK(ps.staging_room().size() == std::size_t{32} << 10);
    ps.fit_staging((64 << 10) + 1);  // would not fit the most either: its payload goes past
    CHECK(ps.staging_size == std::size_t{32} << 10);
    ps.fit_staging(40 << 10);
    CHECK(ps.staging_size == std::size_t{64} << 10);
    CHECK(ps.staging_room().size() == std::size_t{64} << 10);
}

TEST_CASE("frames that outgrow the staging buffer arrive whole, before and after it grows") {
    cc::io::reactor r;
    engine_pair ep(r);
    // Sent back to back before any receive: the first 20 KiB frame grows the reader's buffer
    // while the frames behind it may already be staged; then a 60 KiB one, then small ones.
    std::vector<std::vector<std::byte>> out;
    for (std::size_t n : {20000, 20000, 61000, 100, 30000}) out.push_back(pattern(n, n % 7));
    r.run([&]() -> cc::task<> {
        for (std::size_t i = 0; i < out.size(); ++i) {
            co_await ep.e0->send(out[i], 1, static_cast<int>(i), soon());
        }
    }());
    for (std::size_t i = 0; i < out.size(); ++i) {
        CAPTURE(i);
        std::vector<std::byte> in(out[i].size());
        auto got = r.run([&]() -> cc::task<cc::transport::recv_result> {
            co_return co_await ep.e1->recv(in, 0, static_cast<int>(i), soon());
        }());
        CHECK(got.length == out[i].size());
        CHECK(in == out[i]);
    }
}

TEST_CASE("a receive posted while its early message arrives gets all of it") {
    // Buffered at once (no hold), an 8 MiB message is read into a growing buffer until its
    // receive is posted, and from then on straight into the receive: posted before, during or
    // after its arrival, the receive gets every byte, and a message behind it follows.
    cc::transport::engine_options o;
    o.hold = std::chrono::microseconds(0);
    cc::io::reactor r;
    engine_pair ep(r, o);
    auto out = pattern(8 << 20, 11);
    auto tail = pattern(100, 12);
    for (int wait_us : {0, 200, 1000, 3000, 20000}) {
        CAPTURE(wait_us);
        std::vector<std::byte> in(out.size()), in_tail(tail.size());
        r.run(cc::when_all(
            [&]() -> cc::task<> {
                co_await ep.e0->send(out, 1, 5, soon());
                co_await ep.e0->send(tail, 1, 6, soon());
            }(),
            [&]() -> cc::task<> {
                co_await r.sleep_for(std::chrono::microseconds(wait_us));
                auto got = co_await ep.e1->recv(in, 0, 5, soon());
                CHECK(got.length == out.size());
                co_await ep.e1->recv(in_tail, 0, 6, soon());
            }()));
        CHECK(in == out);
        CHECK(in_tail == tail);
    }
}

TEST_CASE("a started receive that is dropped is withdrawn: the message goes to the next one") {
    cc::io::reactor r;
    engine_pair ep(r);
    std::vector<std::byte> first(4), second(4);
    {
        auto dropped = ep.e1->recv(first, 0, 1, soon());
        dropped.start();
    }
    auto out = pattern(4, 9);
    r.run(ep.e0->send(out, 1, 1, soon()));
    auto got = r.run([&]() -> cc::task<cc::transport::recv_result> {
        co_return co_await ep.e1->recv(second, 0, 1, soon());
    }());
    CHECK(got.length == 4);
    CHECK(second == out);
    CHECK(first == std::vector<std::byte>(4));
}

TEST_CASE("a receive dropped as the one before it completes loses its message, nothing else") {
    // Two messages in one read: the first one's receive completes once the second's header is
    // taken, and the coroutine it resumes drops the second's receive, whose message is then
    // being read into it. The reader drops the rest of that message (what it had copied from
    // its staging buffer stays) and the next message goes whole to the next receive.
    cc::io::reactor r;
    engine_pair ep(r);
    auto small = pattern(4, 1), large = pattern(200000, 2), next = pattern(300, 3);
    std::vector<std::byte> in_small(4), in_large(large.size()), in_next(next.size());
    auto first = ep.e1->recv(in_small, 0, 1, soon());
    auto* second = new auto(ep.e1->recv(in_large, 0, 2, soon()));
    first.start();
    second->start();
    bool dropped = false;
    r.run(cc::when_all(
        [&]() -> cc::task<> {
            co_await first;
            delete std::exchange(second, nullptr);  // withdrawn while its message arrives
            dropped = true;
        }(),
        [&]() -> cc::task<> {
            co_await ep.e0->send(small, 1, 1, soon());
            co_await ep.e0->send(large, 1, 2, soon());
            co_await ep.e0->send(next, 1, 3, soon());
        }()));
    REQUIRE(dropped);
    CHECK(in_small == small);
    auto got = r.run([&]() -> cc::task<cc::transport::recv_result> {
        co_return co_await ep.e1->recv(in_next, 0, 3, soon());
    }());
    CHECK(got.length == next.size());
    CHECK(in_next == next);
    // Past what the staging buffer held (at most 64 KiB), nothing reached the dropped buffer.
    CHECK(std::all_of(in_large.begin() + (64 << 10), in_large.end(),
                      [](std::byte b) { return b == std::byte{0}; }));
    CHECK_FALSE(ep.e1->failed());
}

TEST_CASE("named and any-source receives take messages in the order they were posted") {
    cc::io::reactor r;
    engine_pair ep(r);
    std::vector<std::byte> a(8), b(8), c(8);
    // Posted in the order any, named, any: the three messages go to a, b, c in that order.
    auto ra = ep.e1->recv(a, cc::transport::any_source, 4, soon());
    auto rb = ep.e1->recv(b, 0, 4, soon());
    auto rc = ep.e1->recv(c, cc::transport::any_source, 4, soon());
    ra.start();
    rb.start();
    rc.start();
    auto m1 = pattern(8, 1), m2 = pattern(8, 2), m3 = pattern(8, 3);
    r.run([&]() -> cc::task<> {
        co_await ep.e0->send(m1, 1, 4, soon());
        co_await ep.e0->send(m2, 1, 4, soon());
        co_await ep.e0->send(m3, 1, 4, soon());
        auto x = co_await ra;
        auto y = co_await rb;
        auto z = co_await rc;
        CHECK(x.source == 0);
        CHECK(y.source == 0);
        CHECK(z.source == 0);
    }());
    CHECK(a == m1);
    CHECK(b == m2);
    CHECK(c == m3);
}

TEST_CASE("a receive of a buffered message makes no coroutine frame") {
    cc::io::reactor r;
    engine_pair ep(r);
    auto out = pattern(64, 5), marker = pattern(1, 6);
    std::vector<std::byte> in(64), mark(1);
    r.run([&]() -> cc::task<> {
        // The first message arrives before any receive wants it and is buffered; once the
        // one behind it on the same connection is in, the first is certainly here.
        co_await ep.e0->send(out, 1, 2, soon());
        co_await ep.e0->send(marker, 1, 3, soon());
        co_await ep.e1->recv(mark, 0, 3, soon());
        std::uint64_t before = cc::detail::frame_pool::frames_made();
        auto got = co_await ep.e1->recv(in, 0, 2, soon());
        CHECK(cc::detail::frame_pool::frames_made() == before);
        CHECK(got.length == 64);
    }());
    CHECK(in == out);
}

TEST_CASE("a started receive that nobody sends to ends at its deadline, naming the call") {
    cc::io::reactor r;
    engine_pair ep(r);
    std::vector<std::byte> in(4);
    auto op = ep.e1->recv(in, 0, 9, cc::io::deadline_after(50ms));
    op.start();
    auto e = expect_system_error([&] { r.run([&]() -> cc::task<> { co_await op; }()); });
    CHECK(e.code() == std::errc::timed_out);
    CHECK(std::string(e.what()).find("rank 1: recv from rank 0 (tag 9)") != std::string::npos);
}

TEST_CASE("a receive from a rank outside the group is refused when posted, or when awaited") {
    cc::io::reactor r;
    engine_pair ep(r);
    std::vector<std::byte> in(4);
    auto op = ep.e1->recv(in, 5, 0, soon());
    CHECK_THROWS_WITH_AS(op.start(), doctest::Contains("rank 5 is outside [0, 2)"),
                         std::invalid_argument);
    // Awaited, the error comes out of await_resume like every operation's.
    CHECK_THROWS_WITH_AS(r.run([&]() -> cc::task<> { co_await ep.e1->recv(in, 5, 0, soon()); }()),
                         doctest::Contains("rank 5 is outside [0, 2)"), std::invalid_argument);
}

TEST_CASE("a receive pending when a lingering close gives up fails; it does not succeed empty") {
    cc::io::reactor r;
    engine_pair ep(r);
    std::vector<std::byte> in(4);
    auto op = ep.e0->recv(in, 1, 3, soon());
    op.start();
    // Rank 1 neither sends nor closes: rank 0 stops waiting for it after 100 ms.
    r.run(ep.e0->close(cc::io::deadline_after(100ms)));
    CHECK(op.is_completed());
    auto e = expect_system_error([&] { r.run([&]() -> cc::task<> { co_await op; }()); });
    CHECK(e.code() == std::errc::operation_canceled);
    CHECK(std::string(e.what()).find("the process group was closed") != std::string::npos);
}

TEST_CASE(
    "a collective header held back by the buffer bound is checked when the collective "
    "begins: a mismatch fails the group instead of hanging the receive") {
    bool begin = false;
    SUBCASE("the receive is handed the held header") {}
    SUBCASE("the collective begins first") { begin = true; }
    cc::io::reactor r;
    cc::transport::engine_options o;
    o.unexpected_bytes_per_peer = 16;  // one buffered 16-byte message fills it
    engine_pair ep(r, o);
    auto early = pattern(16, 1), step = pattern(16, 2);
    cc::transport::collective_meta theirs{}, mine{};
    theirs.collective = mine.collective = 3;
    theirs.count = 4;
    mine.count = 5;  // the ranks disagree on the count
    theirs.seq = mine.seq = 1;
    std::vector<std::byte> in(16);
    r.run([&]() -> cc::task<> {
        co_await ep.e0->send(early, 1, 9, soon());              // buffered on rank 1
        co_await ep.e0->send_coll(step, 1, theirs, 0, soon());  // held back: the bound is full
        // Whether rank 1's reader holds the header when the collective begins, when the
        // receive is posted, or reads it later, the outcome must be the same: the mismatch,
        // named, well before the receive's deadline.
        for (int i = 0; i < 100; ++i) co_await r.schedule();
        if (begin) ep.e1->begin_collective(mine);
        std::string error;
        try {
            co_await ep.e1->recv_coll(in, 0, mine, 0, cc::io::deadline_after(20s));
        } catch (const std::system_error& x) {
            error = x.what();
        }
        CHECK(error.find("does not match across ranks") != std::string::npos);
        ep.e1->end_collective();
    }());
}

TEST_CASE("the same call after different earlier collectives is a mismatch that says so") {
    cc::io::reactor r;
    engine_pair ep(r);
    cc::transport::collective_meta extra{}, call{};
    extra.collective = 2;
    extra.seq = 1;
    call.collective = 3;
    call.count = 4;
    call.seq = 2;
    // Rank 1 ran collective #1 as `extra` without a frame of it reaching rank 0; rank 0 ran
    // another #1. Collective #2 is the same call on both, but its frames carry different
    // fingerprints.
    cc::transport::collective_meta other = extra;
    other.root = 1;
    ep.e0->begin_collective(other);
    ep.e0->end_collective();
    ep.e1->begin_collective(extra);
    ep.e1->end_collective();
    cc::transport::collective_meta on0 = call, on1 = call;
    ep.e0->begin_collective(on0);
    ep.e1->begin_collective(on1);
    CHECK(on0.history != on1.history);
    auto data = pattern(16, 1);
    std::vector<std::byte> in(16);
    std::string error;
    r.run([&]() -> cc::task<> {
        co_await ep.e0->send_coll(data, 1, on0, 0, soon());
        try {
            co_await ep.e1->recv_coll(in, 0, on1, 0, soon());
        } catch (const std::system_error& x) {
            error = x.what();
        }
    }());
    CHECK(error.find("collective #2") != std::string::npos);
    CHECK(error.find("rank 1 and rank 0 ran different collectives before it") != std::string::npos);
    ep.e0->end_collective();
    ep.e1->end_collective();
}

TEST_CASE("status answers: silent ranks are blamed first, then different calls, then the wait") {
    namespace td = cc::transport::detail;
    auto in_call = [](std::uint64_t seq, std::uint32_t root, std::vector<std::int32_t> waits) {
        td::rank_status s;
        s.in_collective = true;
        s.current.collective = 4;
        s.current.seq = seq;
        s.current.root = root;
        s.done = seq - 1;
        s.waiting_for = std::move(waits);
        return s;
    };
    std::vector<std::optional<td::rank_status>> all(3);
    all[0] = in_call(3, 0, {1});
    all[2] = in_call(3, 0, {1});
    // The encoding goes through a status frame unchanged.
    auto round_trip = td::rank_status::decode(all[0]->encode());
    REQUIRE(round_trip);
    CHECK(round_trip->current == all[0]->current);
    CHECK(round_trip->waiting_for == all[0]->waiting_for);
    CHECK_FALSE(td::rank_status::decode(all[0]->encode().substr(1)));

    auto judge = [&](td::status_reason why) {
        return td::judge_status(all, 0, why, 1, "collective #3", 1000ms, &td::describe_raw);
    };
    auto v = judge(td::status_reason::stalled);
    CHECK(v.fail);
    CHECK(v.culprit == 1);
    CHECK(v.text.find("rank 1 stopped responding") == 0);
    CHECK(v.text.find("rank 1: no answer") != std::string::npos);

    all[1] = in_call(3, 1, {});  // rank 1 believes it is the root
    v = judge(td::status_reason::stalled);
    CHECK(v.fail);
    CHECK(v.culprit == 1);
    CHECK(v.text.find("collective #3 does not match across ranks: rank 0 called") == 0);

    all[1] = td::rank_status{};  // rank 1 is behind: in no collective, #2 not done yet
    all[1]->done = 1;
    v = judge(td::status_reason::stalled);
    CHECK_FALSE(v.fail);  // slow, not wrong: reported and waited for
    CHECK(v.text.find("rank 1: in no collective, after #1") != std::string::npos);
    v = judge(td::status_reason::deadline);
    CHECK(v.fail);
    CHECK(v.culprit == 1);
    CHECK(v.text.find("rank 0 timed out waiting in collective #3 for rank 1") == 0);
    // It says the operation's timeout passed (torch's tests look for " timeout ") and who has
    // not called the collective yet: alive, answering, elsewhere.
    CHECK(v.text.find(" (the operation's timeout passed); rank 1 answered but has not called "
                      "it yet; ") != std::string::npos);

    all[1]->done = 3;  // rank 1 finished #3 (the same call) without sending to rank 0
    all[1]->recent = {all[0]->current};
    v = judge(td::status_reason::stalled);
    CHECK(v.fail);
    CHECK(v.culprit == 1);
    CHECK(v.text.find("rank 0 waits in collective #3 for rank 1, which finished it") == 0);
}

namespace {

// The peak of this process's virtual memory (VmPeak in /proc/self/status), in bytes.
std::uint64_t peak_virtual_bytes() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmPeak:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
    }
    return 0;
}

// Rank 0's engine, and raw bytes from "rank 1": header `h` (sealed here), `sent` bytes of
// payload, then the end of the stream. Returns what a receive from rank 1 then says.
std::string after_sending(cc::transport::frame_header h, std::size_t sent) {
    cc::io::reactor r;
    // Not a structured binding: clang 14 does not let a lambda capture one.
    auto pair = r.run(connected_pair(r));
    cc::io::socket& b = pair.second;
    std::vector<cc::io::socket> to_1(2);
    to_1[1] = std::move(pair.first);
    cc::transport::engine e(r, 0, 2, std::move(to_1));
    h.seal();
    auto payload = pattern(sent, 4);
    std::string error;
    r.run([&]() -> cc::task<> {
        co_await b.send(std::as_bytes(std::span(&h, 1)), soon());
        co_await b.send(payload, soon());
        b.shutdown();
        std::vector<std::byte> in(16);
        try {
            co_await e.recv(in, 1, 6, soon());  // another tag: nothing matches the message
        } catch (const std::system_error& x) {
            error = x.what();
        }
        co_await e.close();
    }());
    return error;
}

// A p2p header from rank 1 that announces `announced` bytes, `sent` of them.
std::string after_announcing(std::uint64_t announced, std::size_t sent) {
    cc::transport::frame_header h;
    h.src = 1;
    h.dst = 0;
    h.tag = 5;
    h.length = announced;
    return after_sending(h, sent);
}

}  // namespace

TEST_CASE("an early message's buffer grows as its bytes arrive, not by the announced length") {
    // 1 TiB is the largest length a header may announce: allocated at once, it failed with
    // std::bad_alloc before a byte came.
    std::string error = after_announcing(std::uint64_t{1} << 40, 100000);
    CHECK(error.find("rank 1") != std::string::npos);
    CHECK(error.find("closed") != std::string::npos);
    CHECK(error.find("bad_alloc") == std::string::npos);

    // 1 GiB announced, 3 MiB sent: the buffer holds what came, not a gigabyte.
    auto before = peak_virtual_bytes();
    error = after_announcing(std::uint64_t{1} << 30, std::size_t{3} << 20);
    CHECK(error.find("closed") != std::string::npos);
    CHECK(peak_virtual_bytes() - before < (std::uint64_t{256} << 20));
}

TEST_CASE("a frame whose ranks are not its connection's fails the group, naming the frame") {
    // Rank 1's connection carries a message that says it is from rank 0, to rank 0.
    cc::transport::frame_header h;
    h.src = 0;
    h.dst = 0;
    h.tag = 5;
    h.length = 8;
    std::string error = after_sending(h, 8);
    CAPTURE(error);
    CHECK(error.find("peer rank 1") != std::string::npos);
    CHECK(error.find("unexpected frame from rank 1 to rank 0: kind 2, from rank 0 to rank 0, "
                     "8 bytes") != std::string::npos);
}
