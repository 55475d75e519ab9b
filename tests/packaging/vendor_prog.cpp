// A program outside the tree that vendors corocoll's include/ folder: it must build with
// nothing but `g++ -std=c++20 -I include vendor_prog.cpp -luring`. It uses task, when_all and
// a loopback send/recv on the reactor, and exits non-zero if the bytes differ.

#include <corocoll/corocoll.hpp>

#include <chrono>
#include <cstdio>
#include <string_view>
#include <vector>

namespace cc = corocoll;
using namespace std::chrono_literals;

cc::task<int> roundtrip(cc::io::reactor& r) {
    auto listener = cc::io::acceptor::listen(r, cc::io::endpoint::loopback(0));
    auto [server, client] = co_await cc::when_all(
        listener.accept(cc::io::deadline_after(5s)),
        cc::io::socket::connect(r, listener.local_endpoint(), cc::io::deadline_after(5s)));
    constexpr std::string_view text = "hello from a vendored corocoll";
    std::vector<std::byte> out(text.size()), in(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<std::byte>(text[i]);
    co_await cc::when_all(client.send(out), server.recv(in));
    co_return in == out ? 0 : 1;
}

int main() {
    cc::io::reactor r;
    int rc = r.run(roundtrip(r));
    std::puts(rc == 0 ? "vendored corocoll: loopback send/recv ok" : "vendored corocoll: MISMATCH");
    return rc;
}
