// Fuzz target for the store server as a whole: an input is what one client sends. It goes to
// a running tcp_store_server over a loopback connection, in pieces (the first byte seeds
// their sizes), and the client then shuts down its sending side and reads until the server
// closes. What must hold whatever the bytes are:
//
// - the server closes every connection once its client has stopped sending (a parked WAIT
//   whose client left, a request cut short, a refusal), within a bound;
// - afterwards it holds no connection, no parked WAIT and no buffered byte, and every few
//   thousand inputs the process has as many sockets, rings and eventfds open as before the
//   first;
// - the sanitizers see no error in its thread.
//
// The server keeps its keys from one input to the next, as a real one would, and is replaced
// every 4096 inputs so that they stay few. Every 65,536 inputs it prints a line with the
// inputs run, the server's peak of buffered bytes, the process's resident memory and
// descriptors. Same drivers and flags as store_protocol_fuzz (README.md).

#include <corocoll/rendezvous/tcp_store.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

namespace cc = corocoll;
namespace rdv = corocoll::rendezvous;
using namespace std::chrono_literals;

namespace {

void check(bool ok, const char* what) {
    if (ok) return;
    std::fprintf(stderr, "store_server_fuzz: %s\n", what);
    __builtin_trap();
}

// Sockets, rings and eventfds open in this process: what the server and the client make. Not
// every descriptor: libFuzzer opens pipes and /dev/null as it goes (for its symbolizer).
std::size_t open_fds() {
    std::size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
        std::error_code ec;
        std::string target = std::filesystem::read_symlink(e.path(), ec).string();
        if (target.rfind("socket:", 0) == 0 || target.rfind("anon_inode:", 0) == 0) ++n;
    }
    return n;
}

std::uint64_t rss_kib() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
    }
    return 0;
}

rdv::tcp_store_server_options fuzz_options() {
    rdv::tcp_store_server_options o;
    o.max_value_bytes = 1024;
    o.max_buffered_bytes = 64 << 10;
    o.request_timeout = 2s;
    return o;
}

// Waits up to 5 s for `done`.
template <class F>
bool eventually(F&& done) {
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!done()) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(50us);
    }
    return true;
}

struct fuzz_state {
    std::unique_ptr<rdv::tcp_store_server> server;
    std::uint64_t inputs = 0;
    std::uint64_t peak_buffered = 0;
    std::size_t baseline_fds = 0;

    void renew() {
        if (server) peak_buffered = std::max(peak_buffered, server->stats().peak_buffered_bytes);
        server.reset();
        server =
            std::make_unique<rdv::tcp_store_server>(cc::io::endpoint::loopback(0), fuzz_options());
    }
};

fuzz_state& state() {
    static fuzz_state s = [] {
        fuzz_state f;
        f.renew();
        f.baseline_fds = open_fds();
        return f;
    }();
    return s;
}

int connect_to(std::uint16_t port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    check(fd >= 0, "socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    check(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0, "connect");
    return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    fuzz_state& s = state();
    int fd = connect_to(s.server->port());
    // Send in pieces; the server may close early (a refusal), and sending then fails.
    std::uint32_t lcg = data[0];
    unsigned cut = 1 + data[0] % 64;
    for (std::size_t at = 1; at < size;) {
        lcg = lcg * 1664525u + 1013904223u;
        std::size_t n = std::min<std::size_t>(size - at, 1 + (lcg >> 16) % cut);
        ssize_t sent = ::send(fd, data + at, n, MSG_NOSIGNAL);
        if (sent <= 0) break;
        at += static_cast<std::size_t>(sent);
    }
    ::shutdown(fd, SHUT_WR);
    // Read replies until the server closes.
    bool closed = false;
    for (;;) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 5000) <= 0) break;
        char buf[4096];
        ssize_t got = ::recv(fd, buf, sizeof(buf), 0);
        if (got <= 0) {
            closed = true;
            break;
        }
    }
    ::close(fd);
    check(closed, "the server kept a connection whose client stopped sending");
    auto& server = *s.server;
    check(eventually([&] { return server.stats().open_connections == 0; }),
          "a connection stayed open");
    auto st = server.stats();
    check(st.parked_waits == 0, "a WAIT stayed parked");
    check(st.buffered_bytes == 0, "bytes stayed buffered");
    check(st.peak_buffered_bytes <= fuzz_options().max_buffered_bytes, "over the byte budget");
    ++s.inputs;
    if (s.inputs % 4096 == 0) {
        s.renew();
        if (!eventually([&] { return open_fds() == s.baseline_fds; })) {
            for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
                std::error_code ec;
                std::fprintf(stderr, "  fd %s -> %s\n", e.path().filename().c_str(),
                             std::filesystem::read_symlink(e.path(), ec).c_str());
            }
            check(false, "descriptors did not return to the baseline");
        }
    }
    if (s.inputs % 65536 == 0) {
        std::printf(
            "store_server_fuzz: %llu inputs, server peak buffered %llu bytes, "
            "rss %llu KiB, fds %zu (baseline %zu)\n",
            static_cast<unsigned long long>(s.inputs),
            static_cast<unsigned long long>(s.peak_buffered),
            static_cast<unsigned long long>(rss_kib()), open_fds(), s.baseline_fds);
        std::fflush(stdout);
    }
    return 0;
}
