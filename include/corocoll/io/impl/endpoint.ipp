// The bodies of the non-template functions declared in <corocoll/io/endpoint.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/io/endpoint.hpp>

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
        if (is_localhost_name(host)) return loopback(port);
        throw std::runtime_error("corocoll: cannot resolve host '" + host +
                                 "': " + gai_strerror(rc));
    }
    endpoint e(found->ai_addr, found->ai_addrlen);
    freeaddrinfo(found);
    return e;
}

COROCOLL_DECL bool endpoint::is_localhost_name(std::string_view host) noexcept {
    if (!host.empty() && host.back() == '.') host.remove_suffix(1);
    constexpr std::string_view name = "localhost";
    if (host.size() < name.size()) return false;
    std::string_view tail = host.substr(host.size() - name.size());
    for (std::size_t i = 0; i < name.size(); ++i) {
        if (std::tolower(static_cast<unsigned char>(tail[i])) != name[i]) return false;
    }
    return host.size() == name.size() || host[host.size() - name.size() - 1] == '.';
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
