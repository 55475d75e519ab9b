#pragma once

#include <corocoll/version.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

COROCOLL_BEGIN_NAMESPACE

namespace io {

/// An IPv4 or IPv6 address and port: what a socket binds to, connects to, or reports as its
/// peer. A plain value (a `sockaddr_storage` and its length); copying it allocates nothing.
class endpoint {
public:
    endpoint() noexcept = default;

    /// From a socket address as the kernel reports it.
    endpoint(const sockaddr* addr, socklen_t len);

    /// Parses a numeric address and a port: `"127.0.0.1", 80`, `"::1", 0`. No name lookup.
    static endpoint from_numeric(std::string_view host, std::uint16_t port);

    /// Parses `"host:port"`, `"[v6]:port"`; the host must be numeric.
    static endpoint parse(std::string_view text);

    /// Looks `host` up (a name or a numeric address) and returns its first address for TCP.
    /// Blocks in getaddrinfo: meant for start-up, not for a hot path.
    static endpoint resolve(const std::string& host, std::uint16_t port);

    /// The IPv4 loopback address with `port` (0: let the kernel pick one at bind).
    static endpoint loopback(std::uint16_t port = 0) { return from_numeric("127.0.0.1", port); }

    /// AF_INET or AF_INET6; AF_UNSPEC when empty.
    int family() const noexcept { return storage_.ss_family; }
    /// True for a default-constructed endpoint.
    bool empty() const noexcept { return len_ == 0; }

    /// The port, in host byte order.
    std::uint16_t port() const noexcept;

    /// The address without the port: `127.0.0.1`, `::1`.
    std::string host() const;

    /// `127.0.0.1:80` or `[::1]:80`, as errors and logs print it.
    std::string to_string() const;

    /// The address for connect(2), bind(2) and sendto(2).
    const sockaddr* data() const noexcept { return reinterpret_cast<const sockaddr*>(&storage_); }
    /// The address for accept(2) and getsockname(2) to fill in; `resize` afterwards.
    sockaddr* data() noexcept { return reinterpret_cast<sockaddr*>(&storage_); }
    /// Bytes of the address in `data()`.
    socklen_t size() const noexcept { return len_; }
    /// Bytes `data()` can hold (a `sockaddr_storage`).
    static constexpr socklen_t capacity() noexcept { return sizeof(sockaddr_storage); }
    /// Sets the length the kernel reported after filling `data()`.
    void resize(socklen_t len) noexcept { len_ = len; }

    /// The same address bytes: family, address and port (IPv6: flow info and scope too).
    friend bool operator==(const endpoint& a, const endpoint& b) noexcept {
        return a.len_ == b.len_ && std::memcmp(&a.storage_, &b.storage_, a.len_) == 0;
    }

private:
    static std::uint16_t parse_port(std::string_view digits, std::string_view whole);

    sockaddr_storage storage_{};
    socklen_t len_ = 0;
};

}  // namespace io

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace io {

COROCOLL_DECL endpoint::endpoint(const sockaddr* addr, socklen_t len) {
    if (len > sizeof(storage_)) throw std::invalid_argument("corocoll: socket address too long");
    std::memcpy(&storage_, addr, len);
    len_ = len;
}

COROCOLL_DECL endpoint endpoint::from_numeric(std::string_view host, std::uint16_t port) {
    endpoint e;
    std::string h(host);
    if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
    auto* v4 = reinterpret_cast<sockaddr_in*>(&e.storage_);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&e.storage_);
    if (inet_pton(AF_INET, h.c_str(), &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(port);
        e.len_ = sizeof(sockaddr_in);
    } else if (inet_pton(AF_INET6, h.c_str(), &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(port);
        e.len_ = sizeof(sockaddr_in6);
    } else {
        throw std::invalid_argument("corocoll: not a numeric IPv4 or IPv6 address: '" + h + "'");
    }
    return e;
}

COROCOLL_DECL endpoint endpoint::parse(std::string_view text) {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos || colon + 1 == text.size()) {
        throw std::invalid_argument("corocoll: expected host:port, got '" + std::string(text) +
                                    "'");
    }
    return from_numeric(text.substr(0, colon), parse_port(text.substr(colon + 1), text));
}

COROCOLL_DECL endpoint endpoint::resolve(const std::string& host, std::uint16_t port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    std::string service = std::to_string(port);
    if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
        throw std::runtime_error("corocoll: cannot resolve host '" + host +
                                 "': " + gai_strerror(rc));
    }
    endpoint e(found->ai_addr, found->ai_addrlen);
    freeaddrinfo(found);
    return e;
}

COROCOLL_DECL std::uint16_t endpoint::port() const noexcept {
    if (family() == AF_INET)
        return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
    if (family() == AF_INET6)
        return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
    return 0;
}

COROCOLL_DECL std::string endpoint::host() const {
    char buf[INET6_ADDRSTRLEN] = {};
    if (family() == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr, buf,
                  sizeof(buf));
    } else if (family() == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr, buf,
                  sizeof(buf));
    } else {
        return "(no address)";
    }
    return buf;
}

COROCOLL_DECL std::string endpoint::to_string() const {
    if (family() != AF_INET6 && family() != AF_INET) return "(no address)";
    // Appended piece by piece: g++ 12 at -O3 warns falsely (-Wrestrict) about
    // `"[" + std::string&&` once this is inlined.
    std::string s;
    if (family() == AF_INET6) s += '[';
    s += host();
    s += family() == AF_INET6 ? "]:" : ":";
    s += std::to_string(port());
    return s;
}

COROCOLL_DECL std::uint16_t endpoint::parse_port(std::string_view digits, std::string_view whole) {
    unsigned long value = 0;
    for (char c : digits) {
        if (c < '0' || c > '9' || value > 65535) {
            throw std::invalid_argument("corocoll: bad port in '" + std::string(whole) + "'");
        }
        value = value * 10 + static_cast<unsigned long>(c - '0');
    }
    if (value > 65535) {
        throw std::invalid_argument("corocoll: port out of range in '" + std::string(whole) + "'");
    }
    return static_cast<std::uint16_t>(value);
}

}  // namespace io

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
