// The headline demo while process groups are still to come: an echo server and a client on
// one io_uring reactor, over loopback. The client sends messages of growing size, the server
// sends each one back, and the client checks every byte and prints the round-trip time.
// Exits non-zero if anything differs, so it doubles as a test.

#include <corocoll/corocoll.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

namespace cc = corocoll;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t sizes[] = {0, 1, 4096, 65536, 1 << 20, 16 << 20};

cc::task<> serve(cc::io::acceptor& listener) {
    cc::io::socket peer = co_await listener.accept(cc::io::deadline_after(10s));
    std::vector<std::byte> buf;
    for (std::size_t size : sizes) {
        buf.resize(size);
        co_await peer.recv(buf);
        co_await peer.send(buf);
    }
}

cc::task<int> client(cc::io::reactor& r, cc::io::endpoint server) {
    cc::io::socket s = co_await cc::io::socket::connect(r, server);
    std::printf("client connected to %s\n", s.peer().to_string().c_str());
    int wrong = 0;
    for (std::size_t size : sizes) {
        std::vector<std::byte> out(size), back(size);
        for (std::size_t i = 0; i < size; ++i) out[i] = static_cast<std::byte>(i * 131 + size);
        auto t0 = std::chrono::steady_clock::now();
        // Send and receive concurrently: a large message would fill the socket buffers if we
        // sent it all before starting to read the echo.
        cc::io::op_options o(cc::io::deadline_after(10s));
        co_await cc::when_all(s.send(out, o), s.recv(back, o));
        auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0);
        bool same = out == back;
        wrong += same ? 0 : 1;
        std::printf("echo %9zu bytes: %10.1f us round trip, %s\n", size, us.count(),
                    same ? "content ok" : "CONTENT DIFFERS");
    }
    co_return wrong;
}

}  // namespace

int main() try {
    cc::io::reactor r;
    auto listener = cc::io::acceptor::listen(r, cc::io::endpoint::loopback(0));
    std::printf("echo server listening on %s\n", listener.local_endpoint().to_string().c_str());
    auto [served, wrong] =
        r.run(cc::when_all(serve(listener), client(r, listener.local_endpoint())));
    (void)served;
    std::printf("%s\n", wrong == 0 ? "all echoes matched" : "MISMATCH");
    return wrong == 0 ? 0 : 1;
} catch (const std::exception& e) {
    std::fprintf(stderr, "echo: %s\n", e.what());
    return 1;
}
