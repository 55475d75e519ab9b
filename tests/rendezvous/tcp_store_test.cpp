// The store server against hostile and careless clients: raw bytes on loopback sockets, and
// corocoll's own client beside them. Every wait here is bounded by a count of tries, and the
// checks look at what the server did (its counters, the process's descriptors and memory),
// never at how long it took.

#include <corocoll/corocoll.hpp>
#include <corocoll/rendezvous/tcp_store.hpp>

#include <doctest/doctest.h>

#include "../support/io.hpp"
#include "../support/sanitized.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace cc = corocoll;
namespace rdv = corocoll::rendezvous;
using namespace std::chrono_literals;

namespace {

using corocoll_test::expect_system_error;

// Polls `done` every millisecond, at most `tries` times; true once it holds.
template <class F>
bool eventually(F&& done, int tries = 20000) {
    for (int i = 0; i < tries; ++i) {
        if (done()) return true;
        std::this_thread::sleep_for(1ms);
    }
    return done();
}

std::size_t open_fds() {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
    return n;
}

// The descriptor limit that leaves exactly `n` descriptors free for new ones (the lowest free
// numbers are taken first).
rlim_t limit_with_free_slots(int n) {
    int fd = 0;
    for (int free = 0; free < n; ++fd) {
        if (::fcntl(fd, F_GETFD) < 0) ++free;
    }
    return static_cast<rlim_t>(fd);
}

// Resident set size of this process in bytes.
std::uint64_t rss_bytes() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
    }
    return 0;
}

// A blocking loopback client that speaks raw bytes, as a hostile or broken one would.
class raw_client {
public:
    explicit raw_client(std::uint16_t port) {
        fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd_ >= 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(port);
        REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    }
    raw_client(const raw_client&) = delete;
    raw_client& operator=(const raw_client&) = delete;
    raw_client(raw_client&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    raw_client& operator=(raw_client&& o) noexcept {
        if (this != &o) {
            close();
            fd_ = std::exchange(o.fd_, -1);
        }
        return *this;
    }
    ~raw_client() { close(); }

    // Sends all of `bytes`; false if the server closed the connection first.
    bool send(const std::string& bytes) {
        std::size_t done = 0;
        while (done < bytes.size()) {
            ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
            if (n <= 0) return false;
            done += static_cast<std::size_t>(n);
        }
        return true;
    }
    // Reads until `n` bytes arrived or the server closed; what arrived.
    std::string recv(std::size_t n, int timeout_ms = 10000) {
        std::string out;
        while (out.size() < n) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, timeout_ms) <= 0) break;
            char buf[4096];
            ssize_t got = ::recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
            if (got <= 0) break;
            out.append(buf, static_cast<std::size_t>(got));
        }
        return out;
    }
    // True when the server closed the connection within the poll bound (bytes before the end
    // are read and dropped).
    bool closed_by_server(int timeout_ms = 10000) {
        for (;;) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, timeout_ms) <= 0) return false;
            char buf[4096];
            ssize_t got = ::recv(fd_, buf, sizeof(buf), 0);
            if (got <= 0) return true;
        }
    }
    void close() {
        if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    }

private:
    int fd_ = -1;
};

// Wire-format requests, as torch's client writes them.
struct request {
    std::string bytes;
    request& u8(std::uint8_t v) {
        bytes.push_back(static_cast<char>(v));
        return *this;
    }
    request& u64(std::uint64_t v) {
        bytes.append(reinterpret_cast<const char*>(&v), sizeof(v));
        return *this;
    }
    request& u32(std::uint32_t v) {
        bytes.append(reinterpret_cast<const char*>(&v), sizeof(v));
        return *this;
    }
    request& str(const std::string& s) {
        u64(s.size());
        bytes += s;
        return *this;
    }
};

std::string wait_request(const std::vector<std::string>& keys) {
    request r;
    r.u8(5).u64(keys.size());
    for (const auto& k : keys) r.str(k);
    return r.bytes;
}

}  // namespace

TEST_CASE("tcp store server: stopping with a WAIT parked under two missing keys ends it once") {
    raw_client client = [] {
        rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
        raw_client c(server.port());
        REQUIRE(c.send(wait_request({"/a", "/b", "/c"})));
        REQUIRE(eventually([&] { return server.stats().parked_waits == 1; }));
        return c;
    }();  // the server stops here with the WAIT parked under three keys
    CHECK(client.closed_by_server());
}

TEST_CASE("tcp store server: a WAIT woken by its keys is answered once, and the next request too") {
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    raw_client waiter(server.port());
    REQUIRE(waiter.send(wait_request({"/a", "/b", "/a"})));
    REQUIRE(eventually([&] { return server.stats().parked_waits == 1; }));
    cc::io::reactor r;
    auto s = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
    r.run(s->set("a", "1"));
    CHECK(server.stats().parked_waits == 1);
    r.run(s->set("b", "2"));
    CHECK(waiter.recv(1) == std::string(1, '\0'));  // STOP_WAITING
    REQUIRE(eventually([&] { return server.stats().parked_waits == 0; }));
    // CHECK /a: READY (0).
    REQUIRE(waiter.send(request().u8(4).u64(1).str("/a").bytes));
    CHECK(waiter.recv(1) == std::string(1, '\0'));
}

TEST_CASE("tcp store server: WAITs whose clients went away are dropped with their descriptors") {
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    cc::io::reactor r;
    auto s = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
    r.run(s->set("present", "1"));
    REQUIRE(eventually([&] { return server.stats().open_connections == 1; }));
    const std::size_t baseline = open_fds();
    constexpr int abandoned = 50;
    {
        std::vector<raw_client> clients;
        for (int i = 0; i < abandoned; ++i) {
            clients.emplace_back(server.port());
            REQUIRE(clients.back().send(
                wait_request({"/present", "/never/" + std::to_string(i), "/never"})));
        }
        REQUIRE(eventually([&] { return server.stats().parked_waits == abandoned; }));
        CHECK(open_fds() >= baseline + 2 * abandoned);  // ours and the server's ends
    }                                                   // the clients go away without an answer
    CHECK(eventually([&] { return server.stats().parked_waits == 0; }));
    CHECK(eventually([&] { return server.stats().open_connections == 1; }));
    CHECK(eventually([&] { return open_fds() == baseline; }));
    // The store still serves, and a key that an abandoned WAIT wanted wakes nobody stale.
    r.run(s->set("never", "now"));
    CHECK(r.run(s->get("never")) == "now");
    CHECK(server.stats().open_connections == 1);
}

TEST_CASE("tcp store server: a SET announcing 1 GiB allocates nothing and is refused") {
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    const std::uint64_t rss_before = rss_bytes();
    std::vector<raw_client> hostile;
    for (int i = 0; i < 4; ++i) {
        hostile.emplace_back(server.port());
        // 18 bytes of SET header: the key "/k" and a value of 1 GiB, of which nothing follows.
        REQUIRE(hostile.back().send(request().u8(0).str("/k").u64(std::uint64_t{1} << 30).bytes));
    }
    for (auto& h : hostile) CHECK(h.closed_by_server());
    CHECK(rss_bytes() < rss_before + (std::uint64_t{64} << 20));
    // Our client hears why, with the key.
    cc::io::reactor r;
    auto s = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
    std::string big(rdv::tcp_store_server_options{}.max_value_bytes + 1, 'x');
    auto e = expect_system_error([&] { r.run(s->set("big", big)); });
    CHECK(e.code() == cc::errc::message_too_large);
    std::string what = e.what();
    CHECK(what.find("set 'big'") != std::string::npos);
    CHECK(what.find("limit") != std::string::npos);
    // The connection is re-made for the next request, and the value was not stored.
    CHECK_FALSE(r.run(s->check(std::vector<std::string>{"big"})));
    r.run(s->set("small", "ok"));
    CHECK(r.run(s->get("small")) == "ok");
}

TEST_CASE("tcp store server: a half-sent request or an idle connection is dropped at its bound") {
    rdv::tcp_store_server_options o;
    o.request_timeout = 200ms;
    o.idle_timeout = 300ms;
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0), o);
    raw_client half(server.port());
    // A SET whose value should have 10 bytes; 3 come.
    REQUIRE(half.send(request().u8(0).str("/k").u64(10).bytes + "abc"));
    raw_client idle(server.port());
    // A whole request, then nothing: dropped after the idle bound, not the request bound.
    REQUIRE(idle.send(request().u8(6).bytes));  // GETNUMKEYS
    CHECK(idle.recv(8).size() == 8);
    CHECK(half.closed_by_server());
    CHECK(idle.closed_by_server());
    CHECK(server.stats().timed_out == 2);
    CHECK(eventually([&] { return server.stats().open_connections == 0; }));
}

TEST_CASE("tcp store server: unfinished requests share a byte budget; over it one is refused") {
    rdv::tcp_store_server_options o;
    o.max_value_bytes = 1 << 20;
    o.max_buffered_bytes = (3 << 20) / 2;  // one value and a half
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0), o);
    raw_client a(server.port()), b(server.port());
    std::string head = request().u8(0).str("/k").u64(1 << 20).bytes;
    std::string part(900 << 10, 'x');
    REQUIRE(a.send(head + part));
    REQUIRE(eventually([&] { return server.stats().buffered_bytes >= (900u << 10); }));
    b.send(head + part);
    CHECK(b.closed_by_server());
    CHECK(server.stats().requests_refused == 1);
    CHECK(server.stats().peak_buffered_bytes <= o.max_buffered_bytes);
    // The first one finishes; its value is there.
    REQUIRE(a.send(std::string((1 << 20) - part.size(), 'y')));
    cc::io::reactor r;
    auto s = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
    CHECK(r.run(s->get("k")).size() == (1u << 20));
    CHECK(eventually([&] { return server.stats().buffered_bytes < (64u << 10); }));
}

TEST_CASE("tcp store server: ADD past the int64 range is refused naming the key; nothing wraps") {
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    cc::io::reactor r;
    auto s = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
    constexpr auto max = std::numeric_limits<std::int64_t>::max();
    constexpr auto min = std::numeric_limits<std::int64_t>::min();
    CHECK(r.run(s->add("n", max)) == max);
    auto e = expect_system_error([&] { r.run(s->add("n", 1)); });
    CHECK(e.code() == std::errc::value_too_large);
    std::string what = e.what();
    CHECK(what.find("add to 'n'") != std::string::npos);
    CHECK(what.find("overflow") != std::string::npos);
    CHECK(r.run(s->get("n")) == std::to_string(max));
    CHECK(r.run(s->add("m", min)) == min);
    CHECK(expect_system_error([&] { r.run(s->add("m", -1)); }).code() ==
          std::errc::value_too_large);
    CHECK(r.run(s->add("m", max)) == -1);
    // A value that is not a number is refused too, naming the key.
    r.run(s->set("text", "abc"));
    auto t = expect_system_error([&] { r.run(s->add("text", 1)); });
    CHECK(std::string(t.what()).find("'text'") != std::string::npos);
}

TEST_CASE("tcp store server: ADD past the int64 range closes a torch client's connection") {
    // torch's client has no error replies: it loses the connection rather than read a
    // wrapped sum.
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    raw_client c(server.port());
    constexpr auto max = std::numeric_limits<std::int64_t>::max();
    REQUIRE(c.send(request().u8(3).str("/n").u64(static_cast<std::uint64_t>(max)).bytes));
    CHECK(c.recv(8).size() == 8);
    REQUIRE(c.send(request().u8(3).str("/n").u64(1).bytes));
    CHECK(c.closed_by_server());
}

TEST_CASE("tcp store server: MULTI_GET answers every key in order; a missing one is refused") {
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    cc::io::reactor r;
    auto s = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
    r.run(s->set("a", "1"));
    r.run(s->set("b", std::string("\0two", 4)));
    raw_client c(server.port());
    REQUIRE(c.send(request().u8(0xC0).u64(rdv::detail::hello_magic).bytes));
    REQUIRE(c.recv(8).size() == 8);
    // Status ok, then "/b"'s and "/a"'s values as byte vectors.
    REQUIRE(c.send(request().u8(0xC2).u64(2).str("/b").str("/a").bytes));
    std::string expected = request().u8(0).str(std::string("\0two", 4)).str("1").bytes;
    CHECK(c.recv(expected.size()) == expected);
    REQUIRE(c.send(request().u8(0xC2).u64(2).str("/a").str("/missing").bytes));
    std::string refused = c.recv(1 + 8 + 200, 5000);
    REQUIRE(refused.size() > 9);
    CHECK(refused[0] == static_cast<char>(rdv::detail::reply_status::invalid));
    CHECK(refused.find("MULTI_GET '/missing': no such key") != std::string::npos);
    CHECK(c.closed_by_server());
    CHECK(server.stats().requests_refused == 1);
}

TEST_CASE("tcp store server: speaks torch 2.x's numbering to a client that opens with VALIDATE") {
    // The exchange as torch 2.x's client writes it (TCPStore.cpp and TCPStoreBackend.hpp of
    // torch's sources): VALIDATE 0 and the magic, then PING 13 and the queries renumbered
    // from SET 1; the fields are 1.13's.
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    raw_client c(server.port());
    REQUIRE(c.send(request().u8(0).u32(0x3C85F7CE).u8(13).u32(4242).bytes));
    CHECK(c.recv(4) == request().u32(4242).bytes);  // PING: the nonce back; VALIDATE: nothing
    REQUIRE(c.send(request().u8(1).str("/k").str("v").u8(3).str("/k").bytes));  // SET, GET
    CHECK(c.recv(9) == request().str("v").bytes);
    REQUIRE(c.send(request().u8(9).str("/k").str("w").u8(3).str("/k").bytes));  // APPEND, GET
    CHECK(c.recv(10) == request().str("vw").bytes);
    REQUIRE(c.send(request().u8(4).str("/n").u64(5).bytes));  // ADD
    CHECK(c.recv(8) == request().u64(5).bytes);
    // MULTI_SET (an int64 count, then pairs), MULTI_GET: the values in the keys' order.
    REQUIRE(c.send(request().u8(11).u64(2).str("/a").str("1").str("/b").str("22").bytes));
    REQUIRE(c.send(request().u8(10).u64(2).str("/b").str("/a").bytes));
    std::string both = request().str("22").str("1").bytes;
    CHECK(c.recv(both.size()) == both);
    REQUIRE(c.send(request().u8(5).u64(1).str("/a").bytes));  // CHECK: ready
    CHECK(c.recv(1) == std::string(1, '\0'));
    REQUIRE(c.send(request().u8(5).u64(2).str("/a").str("/zz").bytes));  // CHECK: not ready
    CHECK(c.recv(1) == std::string(1, '\1'));
    REQUIRE(c.send(request().u8(7).bytes));  // GETNUMKEYS: /k /n /a /b
    CHECK(c.recv(8) == request().u64(4).bytes);
    REQUIRE(c.send(request().u8(8).str("/b").bytes));  // DELETE_KEY: 1 removed
    CHECK(c.recv(8) == request().u64(1).bytes);
    REQUIRE(c.send(request().u8(17).bytes));  // LIST_KEYS: 3, then each key
    std::string listed = c.recv(8 + 3 * 10);
    REQUIRE(listed.size() == 8 + 3 * 10);
    CHECK(listed.substr(0, 8) == request().u64(3).bytes);
    for (const char* k : {"/k", "/n", "/a"})
        CHECK(listed.find(request().str(k).bytes) != std::string::npos);
    // A WAIT its client gives up on: CANCEL_WAIT is answered WAIT_CANCELED (1), in the WAIT's
    // place, and the WAIT is gone.
    REQUIRE(c.send(request().u8(6).u64(1).str("/never").bytes));
    REQUIRE(eventually([&] { return server.stats().parked_waits == 1; }));
    REQUIRE(c.send(request().u8(12).bytes));
    CHECK(c.recv(1) == std::string(1, '\1'));
    CHECK(c.recv(1, 200).empty());
    CHECK(eventually([&] { return server.stats().parked_waits == 0; }));
    // A WAIT that another client's SET ends: STOP_WAITING (0).
    REQUIRE(c.send(request().u8(6).u64(1).str("/later").bytes));
    REQUIRE(eventually([&] { return server.stats().parked_waits == 1; }));
    {
        cc::io::reactor r;
        auto s = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
        r.run(s->set("later", "x"));
    }
    CHECK(c.recv(1) == std::string(1, '\0'));
    // A 1.13 client beside it, on its own connection: SET is 0 and GET 2 there.
    raw_client old(server.port());
    REQUIRE(old.send(request().u8(0).str("/old").str("1").u8(2).str("/old").bytes));
    CHECK(old.recv(9) == request().str("1").bytes);
    // torch 2.x's queues are not served: the connection closes, as at any unknown query.
    REQUIRE(c.send(request().u8(14).str("/q").str("x").bytes));
    CHECK(c.closed_by_server());
    CHECK(server.stats().requests_refused == 1);
}

namespace {

// Reads exactly `n` bytes of `fd` (blocking); fewer when the peer closed first.
std::string read_exactly(int fd, std::size_t n) {
    std::string out;
    while (out.size() < n) {
        char buf[4096];
        ssize_t got = ::recv(fd, buf, std::min(sizeof(buf), n - out.size()), 0);
        if (got <= 0) break;
        out.append(buf, static_cast<std::size_t>(got));
    }
    return out;
}

std::uint64_t read_u64(int fd) {
    std::string b = read_exactly(fd, 8);
    std::uint64_t v = 0;
    if (b.size() == 8) std::memcpy(&v, b.data(), 8);
    return v;
}

std::string read_str(int fd) { return read_exactly(fd, read_u64(fd)); }

// A stand-in for torch 2.x's server, blocking, on a thread of its own, for one client: the
// connection's first query must be VALIDATE; the first connection's (corocoll's HELLO) is not,
// and the legacy server closes it (`silent` false) while the libuv server neither answers nor
// closes (`silent`). On the next it answers PING and serves SET, GET, ADD, WAIT and
// GETNUMKEYS in 2.x's numbering, and records the query bytes it got.
struct torch2_stand_in {
    explicit torch2_stand_in(bool silent) {
        listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof(a);
        REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
        REQUIRE(::listen(listener, 4) == 0);
        REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) == 0);
        port = ntohs(a.sin_port);
        serving = std::thread([this, silent] { serve(silent); });
    }
    // Waits for the thread (it ends when the client closes): what it recorded may be read after.
    void finish() {
        if (serving.joinable()) serving.join();
    }
    ~torch2_stand_in() {
        finish();
        for (int fd : {listener, first, second}) {
            if (fd >= 0) ::close(fd);
        }
    }
    void serve(bool silent) {
        first = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        first_query = read_exactly(first, 9);  // corocoll's HELLO
        if (!silent) {
            ::close(first);
            first = -1;
        }
        second = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        std::string opening = read_exactly(second, 10);  // VALIDATE, magic, PING, nonce
        std::uint32_t magic = 0;
        if (opening.size() == 10) std::memcpy(&magic, opening.data() + 1, 4);
        validated =
            opening.size() == 10 && opening[0] == 0 && magic == 0x3C85F7CE && opening[5] == 13;
        if (!validated) return;
        ::send(second, opening.data() + 6, 4, MSG_NOSIGNAL);
        std::map<std::string, std::string> data;
        for (;;) {
            std::string q = read_exactly(second, 1);
            if (q.empty()) return;
            queries.push_back(static_cast<unsigned char>(q[0]));
            std::string reply;
            switch (q[0]) {
                case 1: {  // SET
                    std::string key = read_str(second);
                    data[key] = read_str(second);
                    break;
                }
                case 3:  // GET
                    reply = request().str(data[read_str(second)]).bytes;
                    break;
                case 4: {  // ADD
                    std::string key = read_str(second);
                    std::int64_t sum = static_cast<std::int64_t>(read_u64(second)) +
                                       (data.count(key) ? std::stoll(data[key]) : 0);
                    data[key] = std::to_string(sum);
                    reply = request().u64(static_cast<std::uint64_t>(sum)).bytes;
                    break;
                }
                case 6:  // WAIT: the keys are there in this exchange
                    for (std::uint64_t n = read_u64(second); n > 0; --n) read_str(second);
                    reply = std::string(1, '\0');
                    break;
                case 7:  // GETNUMKEYS
                    reply = request().u64(data.size()).bytes;
                    break;
                default:
                    return;
            }
            if (!reply.empty()) ::send(second, reply.data(), reply.size(), MSG_NOSIGNAL);
        }
    }
    int listener = -1, first = -1, second = -1;
    std::uint16_t port = 0;
    std::string first_query;
    bool validated = false;
    std::vector<int> queries;
    std::thread serving;
};

void torch2_client_case(bool silent) {
    torch2_stand_in server(silent);
    {
        cc::io::reactor r;
        auto s = r.run(rdv::tcp_store::connect(r, cc::io::endpoint::loopback(server.port), 30s));
        r.run(s->set("k", "v"));
        CHECK(r.run(s->get("k")) == "v");
        CHECK(r.run(s->add("n", 3)) == 3);
        CHECK(r.run(s->num_keys()) == 2);
    }  // the client closes its connection: the stand-in's thread ends
    server.finish();
    CHECK(server.first_query.size() == 9);
    CHECK(static_cast<unsigned char>(server.first_query[0]) == 0xC0);
    CHECK(server.validated);
    // SET 1; get: WAIT 6, GET 3; ADD 4; GETNUMKEYS 7: torch 2.x's numbers, not 1.13's.
    CHECK(server.queries == std::vector<int>{1, 6, 3, 4, 7});
}

}  // namespace

TEST_CASE("tcp store client: speaks torch 2.x's numbering to a server that validates") {
    SUBCASE("a server that closes the connection at HELLO (torch 2.x's own)") {
        torch2_client_case(false);
    }
    SUBCASE("a server that says nothing to HELLO (torch 2.x's libuv server): after 5 s") {
        torch2_client_case(true);
    }
}

TEST_CASE("tcp store server: 1,000 clients of one process are all connected at once and served") {
    static constexpr int n = 1000;
    // This process holds both ends of every connection; the server raises the soft limit to
    // the hard one when it starts.
    rlimit lim{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &lim) == 0);
    if (lim.rlim_max < 2 * n + 100) {
        MESSAGE("skipped: RLIMIT_NOFILE's hard limit " << lim.rlim_max << " is under "
                                                       << 2 * n + 100);
        return;
    }
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    CHECK(server.stats().descriptor_limit == lim.rlim_max);
    cc::io::reactor r;
    std::uint64_t most_open = 0;
    auto body = [&]() -> cc::task<> {
        std::vector<std::shared_ptr<rdv::tcp_store>> clients;
        for (int i = 0; i < n; ++i) {
            clients.push_back(co_await rdv::tcp_store::connect(r, server.local_endpoint(), 30s));
        }
        most_open = server.stats().open_connections;
        // Each sets its key, counts itself, and gets its own and its neighbour's values in one
        // MULTI_GET, which waits for the neighbour; then all wait for the count.
        std::vector<cc::task<>> work;
        for (int i = 0; i < n; ++i) {
            work.push_back([](rdv::tcp_store& s, int id) -> cc::task<> {
                co_await s.set("k" + std::to_string(id), std::to_string(id));
                co_await s.add("count", 1);
                // Named: g++ 12.2 rejects a braced initializer_list inside co_await.
                std::vector<std::string> mine{"k" + std::to_string(id),
                                              "k" + std::to_string((id + 1) % n)};
                auto v = co_await s.multi_get(std::move(mine), 60s);
                CHECK(v[0] == std::to_string(id));
                CHECK(v[1] == std::to_string((id + 1) % n));
                std::vector<std::string> all;
                for (int k = 0; k < n; k += 97) all.push_back("k" + std::to_string(k));
                co_await s.wait(std::move(all), 60s);
            }(*clients[static_cast<std::size_t>(i)], i));
        }
        co_await cc::when_all(std::move(work));
        CHECK(co_await clients[0]->get("count") == std::to_string(n));
    };
    r.run(body());
    CHECK(most_open == n);
    auto st = server.stats();
    CHECK(st.connections_accepted == n);
    CHECK(st.accept_failures == 0);
    CHECK(st.requests_refused == 0);
    CHECK(server.last_accept_error().empty());
}

TEST_CASE("tcp store server: at EMFILE the accept loop backs off and serves once fds free up") {
    // The server runs in a child process whose descriptor limit is lowered; this process
    // connects to it. No thread runs here while it forks. A socket pair, not pipes, links
    // them: if one side dies, the other's writes fail rather than raise SIGPIPE.
    int link[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, link) == 0);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(link[0]);
        const int parent = link[1];
        int code = 0;
        try {
            rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
            std::uint16_t port = server.port();
            // Room for two connections more than are open now.
            rlimit lim{};
            ::getrlimit(RLIMIT_NOFILE, &lim);
            lim.rlim_cur = limit_with_free_slots(2);
            if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) ::_exit(3);
            if (::send(parent, &port, sizeof(port), MSG_NOSIGNAL) != sizeof(port)) ::_exit(4);
            char go = 0;
            // 1: the parent's five clients are connected and it waited a while; report.
            if (::recv(parent, &go, 1, 0) != 1) ::_exit(5);
            auto st = server.stats();
            std::string why = server.last_accept_error();
            bool named = why.find("RLIMIT_NOFILE") != std::string::npos &&
                         why.find("2 client connections") != std::string::npos;
            std::uint64_t report[3] = {st.accept_failures, st.connections_accepted, named};
            if (::send(parent, report, sizeof(report), MSG_NOSIGNAL) != sizeof(report)) ::_exit(6);
            // 2: the parent saw its last client served; or it went away.
            ::recv(parent, &go, 1, 0);
        } catch (...) {
            code = 2;
        }
        ::_exit(code);
    }
    ::close(link[1]);
    const int child = link[0];
    // Ends and reaps the child however this test ends: it exits when its socket closes.
    struct reaper {
        int fd;
        pid_t pid;
        int status = -1;
        ~reaper() { finish(); }
        void finish() {
            if (fd < 0) return;
            ::close(std::exchange(fd, -1));
            ::waitpid(pid, &status, 0);
        }
    } reap{child, pid};
    auto tell_child = [&] {
        char go = 1;
        return ::send(child, &go, 1, MSG_NOSIGNAL) == 1;
    };
    std::uint16_t port = 0;
    REQUIRE(::recv(child, &port, sizeof(port), MSG_WAITALL) == sizeof(port));
    std::vector<raw_client> clients;
    for (int i = 0; i < 5; ++i) clients.emplace_back(port);  // in the backlog beyond the limit
    // Each asks for a reply: the two accepted ones answer, the others wait behind EMFILE.
    for (auto& c : clients) REQUIRE(c.send(request().u8(6).bytes));  // GETNUMKEYS
    CHECK(clients[0].recv(8).size() == 8);
    CHECK(clients[1].recv(8).size() == 8);
    std::this_thread::sleep_for(500ms);  // the server meets EMFILE for about this long
    REQUIRE(tell_child());
    std::uint64_t report[3] = {0, 0, 0};
    REQUIRE(::recv(child, report, sizeof(report), MSG_WAITALL) == sizeof(report));
    CHECK(report[1] == 2);
    CHECK(report[2] == 1);  // the error names RLIMIT_NOFILE and the connections held
    // A loop that retries at once fails thousands of times in half a second; one that backs
    // off, from 10 ms doubling, a handful.
    CHECK(report[0] >= 1);
    CHECK(report[0] <= 20);
    // Free the two slots and drop two waiting clients: the last one is then served.
    clients.erase(clients.begin(), clients.begin() + 4);
    CHECK(clients[0].recv(8).size() == 8);
    CHECK(tell_child());
    reap.finish();
    CHECK(WIFEXITED(reap.status));
    CHECK(WEXITSTATUS(reap.status) == 0);
}

TEST_CASE("tcp store server: a client keeps being served while others flood it with garbage") {
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    const std::uint64_t rss_before = rss_bytes();
    std::atomic<bool> done{false};
    std::atomic<int> floods{0};
    std::thread attacker([&]() noexcept {
        std::vector<raw_client> held;
        // Ten 1 GiB announcements that stay open, and garbage on fresh connections until the
        // legitimate client is finished.
        for (int i = 0; i < 10; ++i) {
            held.emplace_back(server.port());
            held.back().send(request().u8(0).str("/big").u64(std::uint64_t{1} << 30).bytes);
        }
        std::minstd_rand rng(14);
        while (!done.load()) {
            raw_client c(server.port());
            std::string junk(1 + rng() % 4096, '\0');
            for (char& ch : junk) ch = static_cast<char>(rng());
            c.send(junk);
            floods.fetch_add(1);
        }
    });
    // Stops and joins the attacker however the test ends.
    struct stopper {
        std::atomic<bool>& done;
        std::thread& t;
        ~stopper() {
            done = true;
            t.join();
        }
    } stop{done, attacker};
    REQUIRE(eventually([&] { return floods.load() >= 10; }));
    cc::io::reactor r;
    auto s = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
    int ok = 0;
    for (int i = 0; i < 100; ++i) {
        std::string key = "legit/" + std::to_string(i);
        r.run(s->set(key, std::to_string(i)));
        if (r.run(s->get(key)) == std::to_string(i)) ++ok;
    }
    CHECK(ok == 100);
    CHECK(server.stats().peak_buffered_bytes <= (std::uint64_t{16} << 20));
    // A sanitizer's bookkeeping (ASan's quarantine keeps freed memory resident) is not the
    // server's memory.
    if (!corocoll_test::sanitized) CHECK(rss_bytes() < rss_before + (std::uint64_t{64} << 20));
}

TEST_CASE("tcp store server with a job token: only clients that prove it are served") {
    if (!cc::detail::token_auth_available()) return;  // a build without libcrypto
    rdv::tcp_store_server_options o;
    o.job_token = "store-token-8d41";
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0), o);
    cc::io::reactor r;
    auto good = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s, o.job_token));
    r.run(good->set("a", "1"));
    CHECK(r.run(good->get("a")) == "1");

    auto without = expect_system_error(
        [&] { r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s)); });
    CHECK(without.code() == std::errc::permission_denied);
    CHECK(std::string(without.what()).find("set COROCOLL_JOB_TOKEN") != std::string::npos);

    auto other = expect_system_error(
        [&] { r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s, "another-token")); });
    CHECK(other.code() == std::errc::permission_denied);
    CHECK(std::string(other.what()).find("did not prove that it knows this job's token") !=
          std::string::npos);

    // torch's way (no HELLO): the connection closes, and neither the SET nor the GET happened.
    raw_client torch_like(server.port());
    REQUIRE(torch_like.send(request().u8(0).str("/b").str("2").u8(2).str("/a").bytes));
    CHECK(torch_like.closed_by_server());
    std::vector<std::string> b{"b"};
    CHECK_FALSE(r.run(good->check(b)));
    // Refused: the wrong proof and torch's SET (the tokenless client gave up by itself).
    CHECK(server.stats().requests_refused == 2);
}

TEST_CASE(
    "tcp store server with a job token: strangers hold a few hundred bytes, never the ranks' "
    "share") {
    if (!cc::detail::token_auth_available()) return;
    rdv::tcp_store_server_options o;
    o.job_token = "store-token-3e07";
    o.max_value_bytes = 4 << 20;
    o.max_buffered_bytes = 8 << 20;  // what 8 strangers buffering 1 MiB each would fill
    o.auth_timeout = 1s;
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0), o);
    // 14 strangers: a SET of a 4 MiB value without HELLO, HELLO and then such a SET, HELLO
    // and then an AUTH whose body announces 4 MiB; each sends 1 MiB of it. Two more only
    // connect and say nothing.
    std::string part(1 << 20, 'x');
    std::string hello = request().u8(0xC0).u64(rdv::detail::hello_magic).bytes;
    std::string set = request().u8(0).str("/k").u64(4 << 20).bytes;
    std::string auth = request().u8(0xC1).u64(4 << 20).bytes;
    std::vector<raw_client> strangers;
    for (int i = 0; i < 14; ++i) {
        strangers.emplace_back(server.port());
        std::string head = i % 3 == 0 ? set : hello + (i % 3 == 1 ? set : auth);
        strangers.back().send(head + part);  // refused before the end: false is fine too
    }
    strangers.emplace_back(server.port());
    strangers.emplace_back(server.port());
    // A rank with the token is served as if they were not there.
    cc::io::reactor r;
    auto good = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s, o.job_token));
    r.run(good->set("a", std::string(64 << 10, 'a')));
    CHECK(r.run(good->get("a")).size() == (64u << 10));
    // Every stranger loses its connection: the 14 refused at their first request, the two
    // silent ones at the deadline for proving the token.
    for (auto& c : strangers) CHECK(c.closed_by_server());
    CHECK(server.stats().requests_refused == 14);
    CHECK(eventually([&] { return server.stats().open_connections == 1; }));
    // The silent two, and the refused ones that said HELLO (their rest is drained until
    // then, so that they read why rather than meet a reset).
    CHECK(server.stats().timed_out == 2 + 9);
    // No stranger held more than what a HELLO and an AUTH need.
    INFO("peak buffered: " << server.stats().peak_buffered_bytes);
    CHECK(server.stats().peak_buffered_bytes <=
          16 * rdv::tcp_store_server::unproven_bytes + (256u << 10));
    CHECK(r.run(good->get("a")).size() == (64u << 10));
}

TEST_CASE("tcp store client: a server asking for the token gets a proof, never the token") {
    if (!cc::detail::token_auth_available()) return;
    // A server that asks for the token and answers AUTH with a made-up proof.
    const std::string token = "client-token-51c0";
    cc::io::reactor r;
    auto listener = cc::io::acceptor::listen(r, cc::io::endpoint::loopback(0));
    std::string received;
    auto fake_server = [&]() -> cc::task<> {
        auto s = co_await listener.accept(cc::io::op_options(cc::io::deadline_after(10s)));
        std::vector<std::byte> hello(9);
        co_await s.recv(hello, cc::io::deadline_after(10s));
        request answer;
        answer.u64(rdv::detail::hello_auth_magic);
        answer.bytes.append(32, 'n');  // the server's nonce
        co_await s.send(std::as_bytes(std::span(answer.bytes.data(), answer.bytes.size())),
                        cc::io::deadline_after(10s));
        std::vector<std::byte> auth(1 + 8 + 64);
        co_await s.recv(auth, cc::io::deadline_after(10s));
        received.assign(reinterpret_cast<const char*>(auth.data()), auth.size());
        request proof;
        proof.u8(0).str(std::string(32, 'p'));
        co_await s.send(std::as_bytes(std::span(proof.bytes.data(), proof.bytes.size())),
                        cc::io::deadline_after(10s));
    };
    std::string error;
    auto client = [&]() -> cc::task<> {
        try {
            co_await rdv::tcp_store::connect(r, listener.local_endpoint(), 5s, token);
        } catch (const std::system_error& e) {
            error = e.what();
            CHECK(e.code() == std::errc::permission_denied);
        }
    };
    r.run(cc::when_all(fake_server(), client()));
    CHECK(error.find("the server did not prove that it knows the job token") != std::string::npos);
    REQUIRE(received.size() == 73);
    CHECK(static_cast<unsigned char>(received[0]) == 0xC1);  // AUTH
    CHECK(received.find(token) == std::string::npos);
}
