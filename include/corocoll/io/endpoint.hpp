#pragma once

// IPv4 and IPv6 addresses and ports: parsing, printing, and what sockets bind and connect to.

#include <corocoll/version.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cctype>
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
    /// Blocks in getaddrinfo: meant for start-up, not for a hot path. A localhost name that
    /// the system cannot resolve (a root without /etc/hosts: a minimal container or chroot) is
    /// the IPv4 loopback address, as RFC 6761 asks of resolvers.
    static endpoint resolve(const std::string& host, std::uint16_t port);

    /// "localhost", or a name under it ("a.localhost"), in any case, with or without the
    /// final dot: the names RFC 6761 reserves for the loopback address.
    static bool is_localhost_name(std::string_view host) noexcept;

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

#if COROCOLL_DEFINE_BODIES
#include <corocoll/io/impl/endpoint.ipp>
#endif
