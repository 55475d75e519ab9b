// The bodies of the non-template functions declared in <corocoll/transport/channel.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/channel.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

COROCOLL_DECL bool channel::worth_holding(std::uint64_t bytes) noexcept {
    (void)bytes;
    return false;
}

}  // namespace transport

namespace transport {
namespace detail {

COROCOLL_DECL std::size_t iov_bytes(std::span<const iovec> iov) noexcept {
    std::size_t n = 0;
    for (const iovec& v : iov) n += v.iov_len;
    return n;
}

COROCOLL_DECL std::span<iovec> iov_after(std::span<const iovec> iov, std::size_t n,
                                         std::span<iovec> rest) noexcept {
    std::size_t used = 0;
    for (const iovec& v : iov) {
        if (n >= v.iov_len) {
            n -= v.iov_len;
            continue;
        }
        rest[used++] = {static_cast<char*>(v.iov_base) + n, v.iov_len - n};
        n = 0;
    }
    return rest.first(used);
}

}  // namespace detail
}  // namespace transport

COROCOLL_END_NAMESPACE
