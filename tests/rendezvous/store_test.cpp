#include <corocoll/corocoll.hpp>
#include <corocoll/rendezvous/file_store.hpp>
#include <corocoll/rendezvous/prefix_store.hpp>
#include <corocoll/rendezvous/tcp_store.hpp>

#include <doctest/doctest.h>

#include "../support/io.hpp"
#include "../support/port.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace cc = corocoll;
namespace rdv = corocoll::rendezvous;
using namespace std::chrono_literals;

namespace {

using corocoll_test::elapsed_ms;
using corocoll_test::expect_system_error;
using corocoll_test::reserved_port;

// Key lists for co_await expressions: g++ 12.2 rejects a braced initializer_list temporary
// inside co_await ("array used as initializer"), so the list is built out here.
template <class... K>
std::vector<std::string> keys(K... k) {
    return std::vector<std::string>{std::string(k)...};
}

// The same semantics, checked on every kind of store.
void check_store_semantics(cc::io::reactor& r, rdv::store& a, rdv::store& b) {
    auto body = [&]() -> cc::task<> {
        co_await a.set("k", "v1");
        CHECK(co_await b.get("k") == "v1");
        co_await b.set("k", "v2");
        CHECK(co_await a.get("k") == "v2");

        std::string binary("\0\x01\xff zero", 8);
        binary += std::string(1 << 20, 'x');
        co_await a.set("bin", binary);
        CHECK(co_await b.get("bin") == binary);
        co_await a.set("empty", "");
        CHECK(co_await b.get("empty") == "");

        CHECK(co_await a.add("n", 5) == 5);
        CHECK(co_await b.add("n", -7) == -2);
        CHECK(co_await a.get("n") == "-2");
        CHECK(co_await b.add("n", 0) == -2);
        // Past the int64 range: refused naming the key, and the value stays.
        constexpr auto max = std::numeric_limits<std::int64_t>::max();
        CHECK(co_await a.add("big", max) == max);
        std::string overflow;
        try {
            co_await b.add("big", 1);
        } catch (const std::system_error& e) {
            CHECK(e.code() == std::errc::value_too_large);
            overflow = e.what();
        }
        CHECK(overflow.find("big'") != std::string::npos);  // 'big', 'p/big' in a prefix store
        CHECK(overflow.find("overflow") != std::string::npos);
        CHECK(co_await a.get("big") == std::to_string(max));
        CHECK(co_await b.delete_key("big"));

        // compare_set: absent key with empty / non-empty expected, matching, not matching.
        CHECK(co_await a.compare_set("cs", "", "first") == "first");
        CHECK(co_await b.compare_set("cs2", "nope", "x") == "nope");
        CHECK_FALSE(co_await a.check(keys("cs2")));
        CHECK(co_await b.compare_set("cs", "first", "second") == "second");
        CHECK(co_await a.compare_set("cs", "wrong", "third") == "second");
        CHECK(co_await b.get("cs") == "second");

        CHECK(co_await a.check(keys("k", "n")));
        CHECK_FALSE(co_await a.check(keys("k", "missing")));
        co_await b.wait(keys("k", "n", "cs"), 1s);

        // multi_get: every value in the order asked, a key asked twice, bytes as they are.
        auto got = co_await b.multi_get(keys("n", "cs", "bin", "n"));
        REQUIRE(got.size() == 4);
        CHECK(got[0] == "-2");
        CHECK(got[1] == "second");
        CHECK(got[2] == binary);
        CHECK(got[3] == "-2");
        CHECK((co_await a.multi_get(keys())).empty());

        std::int64_t count = co_await a.num_keys();
        CHECK(co_await b.delete_key("k"));
        CHECK_FALSE(co_await b.delete_key("k"));
        CHECK(co_await a.num_keys() == count - 1);
        CHECK_FALSE(co_await a.check(keys("k")));
    };
    r.run(body());
}

void check_get_waits_and_times_out(cc::io::reactor& r, rdv::store& a, rdv::store& b) {
    // get() blocks until another client sets the key.
    auto body = [&]() -> cc::task<> {
        auto setter = [&]() -> cc::task<> {
            co_await r.sleep_for(50ms);
            co_await a.set("late", "here");
        };
        auto getter = [&]() -> cc::task<std::string> { co_return co_await b.get("late"); };
        auto t0 = std::chrono::steady_clock::now();
        auto [unused, value] = co_await cc::when_all(setter(), getter());
        CHECK(value == "here");
        CHECK(elapsed_ms(t0) >= 45.0);
    };
    r.run(body());
    // A wait for keys nobody sets ends with timed_out naming them, on time.
    auto t0 = std::chrono::steady_clock::now();
    auto e = expect_system_error([&] { r.run(b.wait(keys("never", "late"), 100ms)); });
    CHECK(e.code() == std::errc::timed_out);
    CHECK(std::string(e.what()).find("'never'") != std::string::npos);
    CHECK(elapsed_ms(t0) >= 95.0);
    CHECK(elapsed_ms(t0) < 2000.0);
    // multi_get waits for every key too, and its timeout names the missing one.
    auto many = [&]() -> cc::task<> {
        auto setter = [&]() -> cc::task<> {
            co_await r.sleep_for(20ms);
            co_await a.set("late2", "there");
        };
        auto getter = [&]() -> cc::task<std::vector<std::string>> {
            co_return co_await b.multi_get(keys("late", "late2"), 5s);
        };
        auto [unused, values] = co_await cc::when_all(setter(), getter());
        CHECK(values == keys("here", "there"));
    };
    r.run(many());
    auto m = expect_system_error([&] { r.run(b.multi_get(keys("late", "never2"), 100ms)); });
    CHECK(m.code() == std::errc::timed_out);
    CHECK(std::string(m.what()).find("never2'") != std::string::npos);
    b.set_timeout(80ms);
    auto g = expect_system_error([&] { r.run(b.get("absent")); });
    CHECK(g.code() == std::errc::timed_out);
    CHECK(std::string(g.what()).find("'absent'") != std::string::npos);
    // The store is still usable after a timeout.
    b.set_timeout(5s);
    r.run(a.set("after", "ok"));
    CHECK(r.run(b.get("after")) == "ok");
}

}  // namespace

TEST_CASE("tcp store: set, get, add, compare_set, wait, check, delete_key and num_keys") {
    cc::io::reactor r;
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    CHECK(server.port() != 0);
    auto a = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
    auto b = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
    check_store_semantics(r, *a, *b);
}

TEST_CASE("tcp store: get waits for the key, and waits end in timed_out naming the keys") {
    cc::io::reactor r;
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    auto a = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
    auto b = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
    check_get_waits_and_times_out(r, *a, *b);
}

constexpr int clients = 64;
constexpr int adds = 20;

TEST_CASE("tcp store: 64 concurrent clients add, set and wait for each other") {
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    // Two threads with a reactor each, 32 clients apiece.
    auto run_half = [&](int first) {
        cc::io::reactor r;
        auto body = [&]() -> cc::task<> {
            std::vector<cc::task<>> work;
            for (int c = first; c < first + clients / 2; ++c) {
                work.push_back(
                    [](cc::io::reactor& rr, cc::io::endpoint where, int id) -> cc::task<> {
                        auto s = co_await rdv::tcp_store::connect(rr, where, 10s);
                        for (int i = 0; i < adds; ++i) co_await s->add("counter", 1);
                        co_await s->set("client/" + std::to_string(id), std::to_string(id));
                        std::vector<std::string> all;
                        for (int k = 0; k < clients; ++k)
                            all.push_back("client/" + std::to_string(k));
                        co_await s->wait(all, 10s);
                    }(r, server.local_endpoint(), c));
            }
            co_await cc::when_all(std::move(work));
        };
        r.run(body());
    };
    std::thread other(run_half, clients / 2);
    run_half(0);
    other.join();
    cc::io::reactor r;
    auto s = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
    CHECK(r.run(s->get("counter")) == std::to_string(clients * adds));
    CHECK(r.run(s->num_keys()) == clients + 1);
}

TEST_CASE("tcp store: a client retries until the server comes up, within its timeout") {
    reserved_port port;  // refuses connections until the server listens on it
    auto where = cc::io::endpoint::loopback(port.port());
    std::unique_ptr<rdv::tcp_store_server> late;
    std::thread starter([&] {
        std::this_thread::sleep_for(200ms);
        late = std::make_unique<rdv::tcp_store_server>(where);
    });
    cc::io::reactor r;
    auto t0 = std::chrono::steady_clock::now();
    auto s = r.run(rdv::tcp_store::connect(r, where, 10s));
    starter.join();
    CHECK(elapsed_ms(t0) >= 150.0);
    r.run(s->set("x", "1"));
    CHECK(r.run(s->get("x")) == "1");
}

TEST_CASE("tcp store: connecting with no server fails with timed_out naming the address") {
    reserved_port port;  // nobody listens on it, nobody else takes it
    auto where = cc::io::endpoint::loopback(port.port());
    cc::io::reactor r;
    auto t0 = std::chrono::steady_clock::now();
    auto e = expect_system_error([&] { r.run(rdv::tcp_store::connect(r, where, 300ms)); });
    CHECK(e.code() == std::errc::timed_out);
    CHECK(std::string(e.what()).find(where.to_string()) != std::string::npos);
    CHECK(elapsed_ms(t0) >= 290.0);
    CHECK(elapsed_ms(t0) < 3000.0);
}

TEST_CASE("tcp store: a server on a port in use says address in use, with the port") {
    rdv::tcp_store_server first(cc::io::endpoint::loopback(0));
    auto e = expect_system_error([&] { rdv::tcp_store_server second(first.local_endpoint()); });
    CHECK(e.code() == std::errc::address_in_use);
    std::string port = ":";  // not `":" + std::string`: g++ 12 -O3 warns falsely (-Wrestrict)
    port += std::to_string(first.port());
    CHECK(std::string(e.what()).find(port) != std::string::npos);
}

TEST_CASE("tcp store: a client sending an oversized length is cut off; the others carry on") {
    cc::io::reactor r;
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    auto good = r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
    auto bad = r.run(cc::io::socket::connect(r, server.local_endpoint()));
    // SET with a key length of 2^62 bytes.
    std::vector<std::byte> req(9);
    req[0] = std::byte{0};
    std::uint64_t huge = std::uint64_t{1} << 62;
    std::memcpy(req.data() + 1, &huge, sizeof(huge));
    r.run(bad.send(req));
    std::vector<std::byte> scratch(1);
    CHECK(r.run(bad.recv_some(scratch, cc::io::deadline_after(5s))) == 0);  // closed by server
    r.run(good->set("still", "fine"));
    CHECK(r.run(good->get("still")) == "fine");
}

TEST_CASE("prefix store: keys live under prefix/ in the underlying store") {
    cc::io::reactor r;
    rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
    std::shared_ptr<rdv::store> base =
        r.run(rdv::tcp_store::connect(r, server.local_endpoint(), 5s));
    rdv::prefix_store g1("group1", base), g2("group2", base);
    auto body = [&]() -> cc::task<> {
        co_await g1.set("k", "one");
        co_await g2.set("k", "two");
        CHECK(co_await g1.get("k") == "one");
        CHECK(co_await g2.get("k") == "two");
        CHECK(co_await base->get("group1/k") == "one");
        CHECK(co_await g1.add("n", 3) == 3);
        CHECK(co_await base->get("group1/n") == "3");
        CHECK_FALSE(co_await g2.check(keys("n")));
        CHECK(co_await g1.compare_set("n", "3", "4") == "4");
        CHECK(co_await g1.delete_key("n"));
        CHECK_FALSE(co_await base->check(keys("group1/n")));
    };
    r.run(body());
    rdv::prefix_store a("p", base), b("p", base);
    check_store_semantics(r, a, b);
}

TEST_CASE("file store: two handles on one file see each other, with the same semantics") {
    auto path = std::filesystem::temp_directory_path() /
                ("corocoll-file-store-" + std::to_string(::getpid()));
    std::filesystem::remove(path);
    {
        cc::io::reactor r;
        rdv::file_store a(path.string(), 5s), b(path.string(), 5s);
        check_store_semantics(r, a, b);
        rdv::file_store c(path.string(), 5s), d(path.string(), 5s);
        check_get_waits_and_times_out(r, c, d);
    }
    std::filesystem::remove(path);
}
