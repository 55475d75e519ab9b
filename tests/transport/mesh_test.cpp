// Mesh set-up against strangers: connections that say nothing or the wrong thing do not hold
// set-up up, and with a job token both ends prove that they know it without sending it. The
// "strangers" here are raw sockets driven by the test.

#include "../support/ranks.hpp"

#include <corocoll/corocoll.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <system_error>
#include <vector>

using namespace corocoll_test;
namespace tr = cc::transport;

namespace {

const std::string token = "tok-5f1c2a9e-the-job-secret";

std::chrono::steady_clock::time_point after(std::chrono::milliseconds d) {
    return cc::io::deadline_after(d);
}

// Reads what comes until the peer closes or `deadline`; the bytes read.
cc::task<std::string> read_until_closed(cc::io::socket& s,
                                        std::chrono::steady_clock::time_point deadline) {
    std::string got;
    std::array<std::byte, 4096> buf{};
    for (;;) {
        std::size_t n = 0;
        try {
            n = co_await s.recv_some(buf, deadline);
        } catch (const std::system_error&) {
            co_return got;  // reset, or the deadline
        }
        if (n == 0) co_return got;
        got.append(reinterpret_cast<const char*>(buf.data()), n);
    }
}

bool contains(const std::string& bytes, const std::string& what) {
    return bytes.find(what) != std::string::npos;
}

// A hello as a stranger would make it: for rank `src` of group "default", world size 2.
tr::frame_header stranger_hello(std::uint32_t src, std::uint32_t dst, bool with_token,
                                std::uint64_t group = tr::hash64("default")) {
    tr::frame_header h;
    h.kind = tr::frame_kind::hello;
    h.src = src;
    h.dst = dst;
    h.count = 2;
    h.seq = group;
    h.tag = with_token ? 1 : 0;
    h.length = corocoll::detail::nonce_bytes;
    h.seal();
    return h;
}

tr::mesh_options mesh_with(const std::string& job_token, std::chrono::milliseconds deadline) {
    tr::mesh_options o;
    o.deadline = after(deadline);
    o.job_token = job_token;
    return o;
}

}  // namespace

TEST_CASE("strangers on a rank's port (silent, junk, another group) do not hold set-up up") {
    cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0));
    std::vector<std::string> stray_saw(3);
    auto errors = run_ranks(2, [&](int rank, cc::io::reactor& r) -> cc::task<> {
        auto store = co_await cc::rendezvous::tcp_store::connect(r, server.local_endpoint(), 10s);
        auto o = mesh_with("", 10s);
        // Longer than the deadline: only handling connections side by side lets set-up end.
        o.hello_timeout = 60s;
        if (rank == 0) {
            auto socks = co_await tr::connect_mesh(r, *store, 0, 2, o);
            if (!socks[1].is_open()) throw std::runtime_error("rank 1 is not connected");
            co_return;
        }
        // Rank 1 first opens three strays to rank 0's port, which rank 0 accepts before it.
        std::vector<std::string> key{"mesh/addr/0"};
        co_await store->wait(key, 10s);
        auto where = cc::io::endpoint::parse(co_await store->get("mesh/addr/0"));
        std::vector<cc::io::socket> strays;
        strays.reserve(3);
        for (int i = 0; i < 3; ++i) strays.push_back(co_await cc::io::socket::connect(r, where));
        std::string junk(200, 'x');
        co_await strays[1].send(std::as_bytes(std::span(junk.data(), junk.size())), after(5s));
        auto other = stranger_hello(1, 0, false, tr::hash64("another group"));
        co_await strays[2].send(std::as_bytes(std::span(&other, 1)), after(5s));
        auto socks = co_await tr::connect_mesh(r, *store, 1, 2, o);
        if (!socks[0].is_open()) throw std::runtime_error("rank 0 is not connected");
        // Every stray was dropped: each sees its connection end, long before hello_timeout.
        for (int i = 0; i < 3; ++i) {
            stray_saw[static_cast<std::size_t>(i)] =
                co_await read_until_closed(strays[static_cast<std::size_t>(i)], after(5s));
        }
    });
    check_every_rank_ok(errors);
    // The junk and the other group's hello got no answer at all.
    CHECK(stray_saw[1].empty());
    CHECK(stray_saw[2].empty());
}

TEST_CASE("at the deadline, a rank names the higher ranks that never connected") {
    cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0));
    std::string error;
    cc::io::reactor r;
    try {
        r.run([&]() -> cc::task<> {
            auto store = co_await cc::rendezvous::tcp_store::connect(r, server.local_endpoint());
            co_await tr::connect_mesh(r, *store, 0, 3, mesh_with("", 500ms));
        }());
    } catch (const std::system_error& e) {
        error = e.what();
    }
    CHECK(contains(error, "rank 0 waited for 2 higher rank(s) to connect, rank(s) 1, 2 never did"));
}

TEST_CASE("a listener at a forged address gets nothing that depends on the token") {
    if (!corocoll::detail::token_auth_available()) return;  // a build without libcrypto
    cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0));
    cc::io::reactor r;
    auto store = r.run(cc::rendezvous::tcp_store::connect(r, server.local_endpoint()));
    // The stranger writes its own address where rank 0's belongs.
    auto fake = cc::io::acceptor::listen(r, cc::io::endpoint::loopback(0));
    r.run(store->set("mesh/addr/0", fake.local_endpoint().to_string()));
    std::string received, error;
    auto stranger = [&]() -> cc::task<> {
        auto s = co_await fake.accept(cc::io::op_options(after(10s)));
        tr::frame_header h;
        co_await s.recv(std::as_writable_bytes(std::span(&h, 1)), after(10s));
        received.append(reinterpret_cast<const char*>(&h), sizeof(h));
        // It answers as rank 0 would, with a proof it cannot make: random bytes.
        auto reply = stranger_hello(0, 1, true);
        reply.length = corocoll::detail::nonce_bytes + corocoll::detail::proof_bytes;
        reply.seal();
        std::array<std::byte, 64> made_up{};
        made_up.fill(std::byte{0x5a});
        co_await s.send(std::as_bytes(std::span(&reply, 1)), after(10s));
        co_await s.send(made_up, after(10s));
        received += co_await read_until_closed(s, after(10s));
    };
    auto rank_1 = [&]() -> cc::task<> {
        try {
            co_await tr::connect_mesh(r, *store, 1, 2, mesh_with(token, 10s));
        } catch (const std::system_error& e) {
            error = e.what();
            CHECK(e.code() == std::errc::permission_denied);
        }
    };
    r.run(cc::when_all(stranger(), rank_1()));
    CHECK(contains(error, "rank 1 connecting to rank 0 at " + fake.local_endpoint().to_string()));
    CHECK(contains(error, "did not prove it knows this job's token"));
    // It got the hello and a nonce, and no proof: nothing else was sent.
    CHECK(received.size() == sizeof(tr::frame_header) + corocoll::detail::nonce_bytes);
    CHECK_FALSE(contains(received, token));
}

TEST_CASE("a stranger without the token is refused, and the real rank still gets in") {
    if (!corocoll::detail::token_auth_available()) return;
    cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0));
    std::string answer_with_token, answer_without;
    auto errors = run_ranks(2, [&](int rank, cc::io::reactor& r) -> cc::task<> {
        auto store = co_await cc::rendezvous::tcp_store::connect(r, server.local_endpoint(), 10s);
        if (rank == 0) {
            auto socks = co_await tr::connect_mesh(r, *store, 0, 2, mesh_with(token, 20s));
            if (!socks[1].is_open()) throw std::runtime_error("rank 1 is not connected");
            co_return;
        }
        std::vector<std::string> key{"mesh/addr/0"};
        co_await store->wait(key, 10s);
        auto where = cc::io::endpoint::parse(co_await store->get("mesh/addr/0"));
        // A stranger that claims to be rank 1 and knows the protocol but not the token...
        auto s = co_await cc::io::socket::connect(r, where);
        auto h = stranger_hello(1, 0, true);
        std::array<std::byte, 32> nonce{};
        co_await s.send(std::as_bytes(std::span(&h, 1)), after(5s));
        co_await s.send(nonce, after(5s));
        std::array<std::byte, 32 + 32 + sizeof(h)> reply{};
        co_await s.recv(reply, after(5s));
        answer_with_token.assign(reinterpret_cast<const char*>(reply.data()), reply.size());
        std::array<std::byte, 32> guess{};
        co_await s.send(guess, after(5s));
        answer_with_token += co_await read_until_closed(s, after(5s));  // dropped
        // ...and one that does not use a token at all.
        auto plain = co_await cc::io::socket::connect(r, where);
        auto p = stranger_hello(1, 0, false);
        co_await plain.send(std::as_bytes(std::span(&p, 1)), after(5s));
        co_await plain.send(nonce, after(5s));
        answer_without = co_await read_until_closed(plain, after(5s));
        // The real rank 1.
        auto socks = co_await tr::connect_mesh(r, *store, 1, 2, mesh_with(token, 20s));
        if (!socks[0].is_open()) throw std::runtime_error("rank 0 is not connected");
    });
    check_every_rank_ok(errors);
    // The first stranger got rank 0's hello, nonce and proof (which only prove rank 0 knows
    // the token, over the stranger's nonce), then the end; the second got nothing.
    CHECK(answer_with_token.size() == sizeof(tr::frame_header) + 64);
    CHECK_FALSE(contains(answer_with_token, token));
    CHECK(answer_without.empty());
}

TEST_CASE("ranks with different job tokens refuse each other, each saying why") {
    if (!corocoll::detail::token_auth_available()) return;
    cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0));
    auto errors = run_ranks(2, [&](int rank, cc::io::reactor& r) -> cc::task<> {
        auto store = co_await cc::rendezvous::tcp_store::connect(r, server.local_endpoint(), 5s);
        co_await tr::connect_mesh(r, *store, rank, 2,
                                  mesh_with(rank == 0 ? "secret-a" : "secret-b", 2s));
    });
    CHECK(contains(what(errors[1]), "did not prove it knows this job's token"));
    CHECK(contains(what(errors[0]), "rank(s) 1 never did"));
    CHECK(contains(what(errors[0]), "did not prove it knows this job's token"));
}

namespace {

// Every packet on the loopback interface while it is open (an AF_PACKET socket: needs
// CAP_NET_RAW, which root has); `ok` is false where it cannot be opened.
struct loopback_capture {
    int fd = -1;
    loopback_capture() {
        fd = ::socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
        if (fd < 0) return;
        int bytes = 16 << 20;
        ::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof(bytes));
        sockaddr_ll where{};
        where.sll_family = AF_PACKET;
        where.sll_protocol = htons(ETH_P_ALL);
        where.sll_ifindex = static_cast<int>(::if_nametoindex("lo"));
        if (::bind(fd, reinterpret_cast<sockaddr*>(&where), sizeof(where)) != 0) {
            ::close(fd);
            fd = -1;
        }
    }
    ~loopback_capture() {
        if (fd >= 0) ::close(fd);
    }
    bool ok() const { return fd >= 0; }
    // Everything captured so far, packet after packet.
    std::string drain() {
        std::string all;
        std::vector<char> packet(1 << 17);
        for (;;) {
            ssize_t n = ::recv(fd, packet.data(), packet.size(), 0);
            if (n <= 0) return all;
            all.append(packet.data(), static_cast<std::size_t>(n));
        }
    }
};

}  // namespace

TEST_CASE("the job token never appears in the packets of a 3-rank set-up") {
    if (!corocoll::detail::token_auth_available()) return;
    loopback_capture capture;
    if (!capture.ok()) {
        MESSAGE("no packet capture here (needs CAP_NET_RAW): ", std::strerror(errno));
        return;
    }
    // The store asks for the token too, as the one rank 0 serves does with COROCOLL_JOB_TOKEN.
    cc::rendezvous::tcp_store_server_options served;
    served.job_token = token;
    cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0), served);
    auto errors = run_ranks(3, [&](int rank, cc::io::reactor& r) -> cc::task<> {
        auto store =
            co_await cc::rendezvous::tcp_store::connect(r, server.local_endpoint(), 10s, token);
        auto socks = co_await tr::connect_mesh(r, *store, rank, 3, mesh_with(token, 20s));
        for (int p = 0; p < 3; ++p) {
            if (p != rank && !socks[static_cast<std::size_t>(p)].is_open()) {
                throw std::runtime_error("a peer is not connected");
            }
        }
    });
    check_every_rank_ok(errors);
    std::string packets = capture.drain();
    // The capture saw the handshakes (the frames' magic, "CCOL" in the sender's byte order)...
    std::uint32_t magic = tr::frame_magic;
    CHECK(contains(packets, std::string(reinterpret_cast<const char*>(&magic), 4)));
    // ...and the store's challenges ("coroauth" answering each client's HELLO)...
    std::uint64_t store_auth = cc::rendezvous::detail::hello_auth_magic;
    CHECK(contains(packets, std::string(reinterpret_cast<const char*>(&store_auth), 8)));
    // ...and no token.
    CHECK_FALSE(contains(packets, token));
}

TEST_CASE("a lower rank that goes away before its channel verdict is named by the higher one") {
    // Found by failure_test's "a rank killed while its group makes subgroups" on TCP: the
    // highest rank failed with "recv from 127.0.0.1:43003 after 0 of 16 bytes: connection
    // closed by peer", naming neither the rank nor the step. Here rank 0 is the test's: it
    // connects and publishes its record as set-up does, then closes its sockets instead of
    // telling rank 1 whether it offers shared memory (set-up's phase 4).
    cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0));
    std::string error;
    auto errors = run_ranks(2, [&](int rank, cc::io::reactor& r) -> cc::task<> {
        auto store = co_await cc::rendezvous::tcp_store::connect(r, server.local_endpoint(), 10s);
        auto mo = mesh_with("", 10s);
        tr::engine_options eo;
        eo.transport = tr::transport_choice::tcp;
        if (rank == 0) {
            auto socks = co_await tr::connect_mesh(r, *store, 0, 2, mo);
            // Its record as set-up's phase 2 writes it: TCP, no shared memory.
            co_await store->set("mesh/shm/0", "tcp - - - -");
            socks[1].close();
            co_return;
        }
        try {
            co_await tr::connect_channels(r, *store, 1, 2, mo, eo, nullptr, nullptr, nullptr);
        } catch (const std::system_error& e) {
            error = e.what();
        }
    });
    check_every_rank_ok(errors);
    CAPTURE(error);
    CHECK(contains(error, "rank 1"));
    CHECK(contains(error, "rank 0"));
    CHECK(contains(error, "verdict"));
    CHECK(contains(error, "connection closed"));
}
