#include "../support/io.hpp"
#include "../support/port.hpp"

#include <doctest/doctest.h>

#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <span>
#include <stop_token>
#include <thread>

using namespace corocoll_test;

namespace {

// Sends `out` from one socket and receives it on the other, concurrently (a large buffer
// would otherwise fill the socket buffers before anyone reads).
cc::task<std::vector<std::byte>> transfer(cc::io::socket& from, cc::io::socket& to,
                                          const std::vector<std::byte>& out) {
    std::vector<std::byte> in(out.size());
    co_await cc::when_all(from.send(out), to.recv(in));
    co_return in;
}

}  // namespace

TEST_CASE("loopback transfers of 0 B to 64 MiB arrive whole and in order") {
    cc::io::reactor r;
    auto conn = r.run(connected_pair(r));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    auto& a = conn.first;
    auto& b = conn.second;
    const std::size_t sizes[] = {0,    1,     2,     7,     4095,          4096,
                                 4097, 65535, 65536, 65537, (1 << 20) + 3, 64u << 20};
    unsigned seed = 0;
    for (std::size_t size : sizes) {
        CAPTURE(size);
        auto out = pattern(size, ++seed);
        auto in = r.run(transfer(a, b, out));
        CHECK(in == out);
        auto back = r.run(transfer(b, a, out));
        CHECK(back == out);
    }
    CHECK(r.in_flight() == 0);
}

TEST_CASE("accept_ready takes the connections already queued, then says none, never waiting") {
    cc::io::reactor r;
    auto listener = cc::io::acceptor::listen(r, cc::io::endpoint::loopback(0));
    CHECK_FALSE(listener.accept_ready().has_value());  // nothing queued: no wait either
    std::vector<cc::io::socket> clients;
    auto connect_three = [&]() -> cc::task<> {
        for (int i = 0; i < 3; ++i) {
            clients.push_back(co_await cc::io::socket::connect(r, listener.local_endpoint()));
        }
    };
    r.run(connect_three());
    auto first =
        r.run([&]() -> cc::task<cc::io::socket> { co_return co_await listener.accept(); }());
    std::vector<cc::io::socket> more;
    while (auto s = listener.accept_ready()) more.push_back(std::move(*s));
    REQUIRE(more.size() == 2);
    // Each is a working connection, to the client that made it.
    for (std::size_t i = 0; i < more.size(); ++i) {
        CHECK(more[i].peer() == clients[i + 1].local_endpoint());
        std::vector<std::byte> out = pattern(100, static_cast<unsigned>(i));
        CHECK(r.run(transfer(clients[i + 1], more[i], out)) == out);
    }
    CHECK(first.peer() == clients[0].local_endpoint());
}

TEST_CASE("several messages in a row on one connection keep their boundaries") {
    cc::io::reactor r;
    auto conn = r.run(connected_pair(r));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    auto& a = conn.first;
    auto& b = conn.second;
    auto body = [&]() -> cc::task<> {
        std::vector<std::vector<std::byte>> msgs;
        for (unsigned i = 0; i < 20; ++i) msgs.push_back(pattern(i * 97 + 1, i));
        auto sender = [&]() -> cc::task<> {
            for (auto& m : msgs) co_await a.send(m);
        };
        auto receiver = [&]() -> cc::task<> {
            for (auto& m : msgs) {
                std::vector<std::byte> in(m.size());
                co_await b.recv(in);
                CHECK(in == m);
            }
        };
        co_await cc::when_all(sender(), receiver());
    };
    r.run(body());
}

TEST_CASE("vectored send and receive move every buffer and leave the iovec arrays as they were") {
    cc::io::reactor r;
    auto conn = r.run(connected_pair(r));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    auto& a = conn.first;
    auto& b = conn.second;
    auto header = pattern(16, 1), payload = pattern((4u << 20) + 5, 2), trailer = pattern(7, 3);
    std::vector<std::byte> empty;
    iovec out[] = {{header.data(), header.size()},
                   {empty.data(), 0},
                   {payload.data(), payload.size()},
                   {trailer.data(), trailer.size()}};
    std::vector<std::byte> h(16), p(payload.size()), t(7);
    iovec in[] = {{h.data(), h.size()}, {p.data(), p.size()}, {t.data(), t.size()}};
    iovec out_copy[4], in_copy[3];
    std::copy(std::begin(out), std::end(out), out_copy);
    std::copy(std::begin(in), std::end(in), in_copy);

    auto [sent, received] = r.run(cc::when_all(a.send_vec(out), b.recv_vec(in)));
    CHECK(sent == 16 + payload.size() + 7);
    CHECK(received == sent);
    CHECK(h == header);
    CHECK(p == payload);
    CHECK(t == trailer);
    for (int i = 0; i < 4; ++i) {
        CHECK(out[i].iov_base == out_copy[i].iov_base);
        CHECK(out[i].iov_len == out_copy[i].iov_len);
    }
    for (int i = 0; i < 3; ++i) {
        CHECK(in[i].iov_base == in_copy[i].iov_base);
        CHECK(in[i].iov_len == in_copy[i].iov_len);
    }
}

TEST_CASE("recv_some returns what is there and 0 at end of stream") {
    cc::io::reactor r;
    auto conn = r.run(connected_pair(r));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    auto& a = conn.first;
    auto& b = conn.second;
    auto msg = pattern(10, 4);
    r.run(a.send(msg));
    std::vector<std::byte> in(100);
    std::size_t n = r.run(b.recv_some(in));
    CHECK(n == 10);
    CHECK(std::equal(msg.begin(), msg.end(), in.begin()));
    a.shutdown(SHUT_WR);
    CHECK(r.run(b.recv_some(in)) == 0);
}

TEST_CASE("a peer that closes mid-transfer makes recv fail with connection_closed") {
    cc::io::reactor r;
    auto conn = r.run(connected_pair(r));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    auto& a = conn.first;
    auto& b = conn.second;
    auto part = pattern(1000, 5);
    r.run(a.send(part));
    a.close();
    std::vector<std::byte> in(1 << 20);
    auto e = expect_system_error([&] { r.run(b.recv(in, cc::io::deadline_after(10s))); });
    CHECK(e.code() == cc::errc::connection_closed);
    std::string what = e.what();
    CHECK(what.find("recv from 127.0.0.1:") != std::string::npos);
    CHECK(what.find("after 1000 of 1048576 bytes") != std::string::npos);
    CHECK(std::equal(part.begin(), part.end(), in.begin()));
}

TEST_CASE("a peer that closes while a large send is in flight makes send fail, not hang") {
    cc::io::reactor r;
    auto conn = r.run(connected_pair(r));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    auto& a = conn.first;
    auto& b = conn.second;
    auto big = pattern(64u << 20, 6);
    auto body = [&]() -> cc::task<> {
        auto closer = [&]() -> cc::task<> {
            std::vector<std::byte> some(1 << 16);
            co_await b.recv(some);
            b.close();
        };
        auto sender = [&]() -> cc::task<> { co_await a.send(big, cc::io::deadline_after(20s)); };
        co_await cc::when_all(sender(), closer());
    };
    auto e = expect_system_error([&] { r.run(body()); });
    CHECK((e.code() == std::errc::connection_reset || e.code() == std::errc::broken_pipe));
    CHECK(std::string(e.what()).find("send to 127.0.0.1:") != std::string::npos);
}

// How late the deadline fires is the machine's to decide: timing_test (suite "timing") looks.
TEST_CASE("a per-op deadline fires, never early, with timed_out and names the peer") {
    cc::io::reactor r;
    auto conn = r.run(connected_pair(r));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    auto& a = conn.first;
    auto& b = conn.second;
    std::vector<std::byte> in(16);
    auto t0 = std::chrono::steady_clock::now();
    auto e = expect_system_error([&] { r.run(b.recv(in, cc::io::deadline_after(50ms))); });
    double ms = elapsed_ms(t0);
    CHECK(e.code() == std::errc::timed_out);
    CHECK(ms >= 49.0);
    CHECK(std::string(e.what()).find(b.peer().to_string()) != std::string::npos);
    // The connection still works after the timed-out receive.
    auto msg = pattern(16, 7);
    r.run(a.send(msg));
    r.run(b.recv(in));
    CHECK(in == msg);
}

TEST_CASE("a deadline renewed across short transfers still bounds the whole operation") {
    cc::io::reactor r;
    auto conn = r.run(connected_pair(r));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    auto& a = conn.first;
    auto& b = conn.second;
    // The peer trickles 100 bytes every 10 ms until the receive ends; a 1 MiB receive with a
    // 100 ms deadline must time out, having received part of it. A deadline renewed by each
    // transfer would never fire.
    auto body = [&]() -> cc::task<> {
        std::stop_source done;
        auto trickle = [&]() -> cc::task<> {
            auto bit = pattern(100, 8);
            while (!done.stop_requested()) {
                co_await a.send(bit);
                try {
                    co_await r.sleep_for(10ms, done.get_token());
                } catch (const std::system_error&) {
                }
            }
        };
        auto receive = [&]() -> cc::task<> {
            std::vector<std::byte> in(1 << 20);
            try {
                co_await b.recv(in, cc::io::deadline_after(100ms));
                FAIL("recv should have timed out");
            } catch (const std::system_error& e) {
                CHECK(e.code() == std::errc::timed_out);
            }
            done.request_stop();
        };
        co_await cc::when_all(trickle(), receive());
    };
    r.run(body());
}

TEST_CASE("a cancelled recv fails with operation_canceled and never touches its buffer after") {
    cc::io::reactor r;
    auto conn = r.run(connected_pair(r));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    auto& a = conn.first;
    auto& b = conn.second;
    std::vector<std::byte> buf(64, std::byte{0xAA});
    std::stop_source stop;
    auto body = [&]() -> cc::task<> {
        auto receiver = [&]() -> cc::task<> {
            try {
                co_await b.recv(buf, stop.get_token());
                FAIL("recv should have been cancelled");
            } catch (const std::system_error& e) {
                CHECK(e.code() == std::errc::operation_canceled);
            }
        };
        auto canceller = [&]() -> cc::task<> {
            co_await r.sleep_for(10ms);
            stop.request_stop();
        };
        co_await cc::when_all(receiver(), canceller());
    };
    r.run(body());
    // Data that arrives now goes to the next receive, not into the cancelled one's buffer.
    auto msg = pattern(64, 9);
    r.run(a.send(msg));
    std::vector<std::byte> fresh(64);
    r.run(b.recv(fresh, cc::io::deadline_after(5s)));
    CHECK(fresh == msg);
    CHECK(std::all_of(buf.begin(), buf.end(), [](std::byte x) { return x == std::byte{0xAA}; }));
    CHECK(r.in_flight() == 0);
}

TEST_CASE("a stop requested from another thread cancels an operation on the reactor") {
    cc::io::reactor r;
    auto conn = r.run(connected_pair(r));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    [[maybe_unused]] auto& a = conn.first;
    auto& b = conn.second;
    std::stop_source stop;
    std::thread other([&] {
        std::this_thread::sleep_for(20ms);
        stop.request_stop();
    });
    std::vector<std::byte> in(8);
    auto e = expect_system_error([&] { r.run(b.recv(in, stop.get_token())); });
    other.join();
    CHECK(e.code() == std::errc::operation_canceled);
}

TEST_CASE("an operation whose stop was requested before it started is never submitted") {
    cc::io::reactor r;
    auto conn = r.run(connected_pair(r));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    [[maybe_unused]] auto& a = conn.first;
    auto& b = conn.second;
    std::stop_source stop;
    stop.request_stop();
    std::vector<std::byte> in(8, std::byte{1});
    auto e = expect_system_error([&] { r.run(b.recv(in, stop.get_token())); });
    CHECK(e.code() == std::errc::operation_canceled);
    CHECK(r.in_flight() == 0);
}

TEST_CASE("cancel_fd cancels every operation pending on a socket") {
    cc::io::reactor r;
    auto conn = r.run(connected_pair(r));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    [[maybe_unused]] auto& a = conn.first;
    auto& b = conn.second;
    auto body = [&]() -> cc::task<int> {
        std::vector<std::byte> in(8);
        int cancelled = 0;
        auto receiver = [&]() -> cc::task<> {
            try {
                co_await b.recv(in);
            } catch (const std::system_error& e) {
                CHECK(e.code() == std::errc::operation_canceled);
                ++cancelled;
            }
        };
        auto canceller = [&]() -> cc::task<int> {
            co_await r.sleep_for(10ms);
            co_return co_await r.cancel_fd(b.native_handle());
        };
        auto [unused, n] = co_await cc::when_all(receiver(), canceller());
        CHECK(cancelled == 1);
        co_return n;
    };
    CHECK(r.run(body()) == 1);
}

TEST_CASE("connecting to a closed port fails with connection_refused naming the address") {
    cc::io::reactor r;
    reserved_port port;  // nobody listens on it, nobody else takes it
    auto where = cc::io::endpoint::loopback(port.port());
    auto e = expect_system_error([&] { r.run(cc::io::socket::connect(r, where)); });
    CHECK(e.code() == std::errc::connection_refused);
    CHECK(std::string(e.what()).find("connect to " + where.to_string()) != std::string::npos);
}

TEST_CASE("binding a port in use fails with address_in_use naming the port") {
    cc::io::reactor r;
    auto first = cc::io::acceptor::listen(r, cc::io::endpoint::loopback(0));
    auto e =
        expect_system_error([&] { (void)cc::io::acceptor::listen(r, first.local_endpoint()); });
    CHECK(e.code() == std::errc::address_in_use);
    CHECK(std::string(e.what()).find(first.local_endpoint().to_string()) != std::string::npos);
}

TEST_CASE("accept with a deadline times out when nobody connects") {
    cc::io::reactor r;
    auto l = cc::io::acceptor::listen(r, cc::io::endpoint::loopback(0));
    auto e = expect_system_error([&] { r.run(l.accept(cc::io::deadline_after(30ms))); });
    CHECK(e.code() == std::errc::timed_out);
    CHECK(std::string(e.what()).find("accept on " + l.local_endpoint().to_string()) !=
          std::string::npos);
}

TEST_CASE("1,000 concurrent socket operations on a ring with 4 SQ entries all complete") {
    cc::io::reactor r({.sq_entries = 4});
    REQUIRE(r.sq_entries() == 4);
    constexpr int pairs = 250;  // 4 operations each, every one with a linked deadline
    std::vector<std::pair<cc::io::socket, cc::io::socket>> conns;
    for (int i = 0; i < pairs; ++i) conns.push_back(r.run(connected_pair(r)));
    std::vector<std::vector<std::byte>> out, back, in, in_back;
    for (int i = 0; i < pairs; ++i) {
        out.push_back(pattern(64, 2 * i));
        back.push_back(pattern(64, 2 * i + 1));
        in.emplace_back(64);
        in_back.emplace_back(64);
    }
    std::vector<cc::task<>> ops;
    auto guard = cc::io::op_options(cc::io::deadline_after(20s));
    auto wrap = [](auto op) -> cc::task<> { co_await std::move(op); };
    for (int i = 0; i < pairs; ++i) {
        auto& [x, y] = conns[i];
        ops.push_back(wrap(x.send(out[i], guard)));
        ops.push_back(wrap(y.recv(in[i], guard)));
        ops.push_back(wrap(y.send(back[i], guard)));
        ops.push_back(wrap(x.recv(in_back[i], guard)));
    }
    REQUIRE(ops.size() == 1000);
    r.run(cc::when_all(std::move(ops)));
    for (int i = 0; i < pairs; ++i) {
        CHECK(in[i] == out[i]);
        CHECK(in_back[i] == back[i]);
    }
    CHECK(r.in_flight() == 0);
}

TEST_CASE("operations waiting in a full ring's backlog can be cancelled") {
    cc::io::reactor r({.sq_entries = 4});
    auto conn = r.run(connected_pair(r));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    [[maybe_unused]] auto& a = conn.first;
    auto& b = conn.second;
    std::stop_source stop;
    std::atomic<int> cancelled{0};
    auto body = [&]() -> cc::task<> {
        std::vector<cc::task<>> ops;
        std::vector<std::vector<std::byte>> bufs(100, std::vector<std::byte>(8));
        for (auto& buf : bufs) {
            ops.push_back([](cc::io::socket& s, std::vector<std::byte>& into, std::stop_token st,
                             std::atomic<int>& count) -> cc::task<> {
                try {
                    co_await s.recv(into, st);
                } catch (const std::system_error& e) {
                    if (e.code() == std::errc::operation_canceled) ++count;
                }
            }(b, buf, stop.get_token(), cancelled));
        }
        // Requested before the loop ever ran: some of these are in the kernel, the rest in the
        // backlog, and all must end.
        stop.request_stop();
        co_await cc::when_all(std::move(ops));
    };
    r.run(body());
    CHECK(cancelled == 100);
    CHECK(r.in_flight() == 0);
}

namespace {

// Coroutines with their arguments in the frame, for `cc::start` (a lambda's captures would
// die with the lambda while the coroutine still waits).
cc::task<> send_with(cc::io::socket& s, std::span<const std::byte> data, cc::io::op_options o) {
    co_await s.send(data, o);
}
cc::task<> recv_with(cc::io::socket& s, std::span<std::byte> data, cc::io::op_options o) {
    co_await s.recv(data, o);
}

}  // namespace

TEST_CASE("try_now transfers finish without the ring when the socket is ready, else fall back") {
    cc::io::reactor r;
    auto conn = r.run(connected_pair(r));
    // Plain references: clang 14 cannot capture structured bindings in lambdas.
    auto& a = conn.first;
    auto& b = conn.second;
    cc::io::op_options now(cc::io::deadline_after(10s));
    now.try_now = true;
    auto out = pattern(1000, 21);
    std::vector<std::byte> in(out.size());
    // Room in the send buffer: done before the loop runs at all.
    auto sent = cc::start(send_with(a, out, now));
    CHECK(sent.is_completed());
    CHECK(r.in_flight() == 0);
    // The bytes are there: the receive too.
    auto got = cc::start(recv_with(b, in, now));
    CHECK(got.is_completed());
    CHECK(in == out);
    r.run(std::move(sent));
    r.run(std::move(got));
    // Nothing there yet: the receive waits in the ring and completes when bytes come.
    auto waiting = cc::start(recv_with(b, in, now));
    CHECK_FALSE(waiting.is_completed());
    auto more = pattern(1000, 22);
    r.run(cc::when_all(a.send(more, now), std::move(waiting)));
    CHECK(in == more);
    // More than the socket buffers hold: part at once, the rest through the ring.
    auto big = pattern(32u << 20, 23);
    std::vector<std::byte> big_in(big.size());
    std::array<iovec, 2> iov{iovec{big.data(), 1000}, iovec{big.data() + 1000, big.size() - 1000}};
    r.run(cc::when_all(a.send_vec(iov, now), b.recv(big_in, now)));
    CHECK(big_in == big);
    CHECK(iov[0].iov_len == 1000);  // the caller's array is as it was
    // End of stream seen by the first attempt is connection_closed, as through the ring.
    a.close();
    auto e = expect_system_error([&] { r.run(b.recv(in, now)); });
    CHECK(e.code() == cc::errc::connection_closed);
    CHECK(r.in_flight() == 0);
}
