// A helper for the torch interop test (torch_interop_test.py):
//   store_tool serve            serves a tcp_store_server on 127.0.0.1:0, prints "PORT <n>",
//                               and runs until its standard input closes;
//   store_tool client <port>    runs a fixed script of operations against the store at
//                               127.0.0.1:<port>, checking what the torch side put there, and
//                               exits non-zero naming the first thing that differs.

#include <corocoll/corocoll.hpp>
#include <corocoll/rendezvous/tcp_store.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace cc = corocoll;
namespace rdv = corocoll::rendezvous;
using namespace std::chrono_literals;

namespace {

void expect(bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error("store_tool client: " + what);
}

cc::task<> client_script(cc::io::reactor& r, std::uint16_t port) {
    auto s = co_await rdv::tcp_store::connect(r, cc::io::endpoint::loopback(port), 10s);
    // The torch side set these before starting us.
    expect(co_await s->get("from_torch") == "hello-cpp", "get from_torch");
    expect(co_await s->add("counter", 7) == 12, "add 7 to torch's 5");
    std::vector<std::string> present{"from_torch", "counter", "to_delete"};
    expect(co_await s->check(present), "check torch's keys");
    // One round trip to corocoll's server; a WAIT and a GET per key to torch's.
    auto values = co_await s->multi_get(present);
    expect(values.size() == 3 && values[0] == "hello-cpp" && values[1] == "12",
           "multi_get of torch's keys");
    expect(co_await s->delete_key("to_delete"), "delete_key to_delete");
    expect(!co_await s->delete_key("to_delete"), "second delete_key");
    co_await s->set("from_cpp", "hello-torch");
    co_await s->set("binary", std::string("\0\x01\x02\xff", 4));
    expect(co_await s->compare_set("cas", "", "x") == "x", "compare_set on a new key");
    expect(co_await s->compare_set("cas", "y", "z") == "x", "compare_set that does not match");
    expect(co_await s->num_keys() >= 5, "num_keys");
    // The torch side blocks in get("late") until this arrives.
    co_await r.sleep_for(200ms);
    co_await s->set("late", "finally");
    // And we block until the torch side is done checking.
    std::vector<std::string> done{"torch_done"};
    co_await s->wait(done, 20s);
}

}  // namespace

int main(int argc, char** argv) try {
    if (argc >= 2 && std::string(argv[1]) == "serve") {
        rdv::tcp_store_server server(cc::io::endpoint::loopback(0));
        std::printf("PORT %u\n", server.port());
        std::fflush(stdout);
        char buf[64];
        while (::read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
        }
        return 0;
    }
    if (argc >= 3 && std::string(argv[1]) == "client") {
        cc::io::reactor r;
        r.run(client_script(r, static_cast<std::uint16_t>(std::atoi(argv[2]))));
        std::puts("store_tool client: all checks passed");
        return 0;
    }
    std::fprintf(stderr, "usage: store_tool serve | store_tool client <port>\n");
    return 2;
} catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
}
