#pragma once

// Helpers shared by the io tests.

#include <corocoll/corocoll.hpp>

#include <sys/resource.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace test {

namespace cc = corocoll;
using namespace std::chrono_literals;

/// A connected pair of loopback sockets on reactor `r`.
inline cc::task<std::pair<cc::io::socket, cc::io::socket>> connected_pair(cc::io::reactor& r) {
    auto listener = cc::io::acceptor::listen(r, cc::io::endpoint::loopback(0));
    auto guard = cc::io::op_options(cc::io::deadline_after(10s));
    auto [accepted, connected] = co_await cc::when_all(
        listener.accept(guard), cc::io::socket::connect(r, listener.local_endpoint(), guard));
    co_return std::pair{std::move(accepted), std::move(connected)};
}

/// Bytes whose values depend on their position and on `seed`, so misplaced data shows.
inline std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
    std::vector<std::byte> v(n);
    unsigned x = seed * 2654435761u + 1;
    for (auto& b : v) {
        x = x * 1664525u + 1013904223u;
        b = static_cast<std::byte>(x >> 24);
    }
    return v;
}

inline double elapsed_ms(std::chrono::steady_clock::time_point since) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since)
        .count();
}

/// CPU time the calling thread has used, in milliseconds.
inline double thread_cpu_ms() {
    rusage u{};
    getrusage(RUSAGE_THREAD, &u);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
           (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

/// Runs `body` and returns the std::system_error it throws (fails the test if none).
template <class F>
std::system_error expect_system_error(F&& body) {
    try {
        body();
    } catch (const std::system_error& e) {
        return e;
    }
    throw std::runtime_error("expected a std::system_error, none was thrown");
}

}  // namespace test
