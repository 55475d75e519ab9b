// The bodies of the non-template functions declared in <corocoll/core/auth.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/auth.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL auth_nonce auth_random_nonce() {
    auth_nonce n{};
    std::size_t got = 0;
    while (got < n.size()) {
        ssize_t r = ::getrandom(n.data() + got, n.size() - got, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            corocoll::detail::throw_errno(errno, "corocoll: init: getrandom");
        }
        got += static_cast<std::size_t>(r);
    }
    return n;
}

COROCOLL_DECL bool same_proof(const auth_proof& a, const auth_proof& b) noexcept {
    unsigned char diff = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff |= static_cast<unsigned char>(a[i] ^ b[i]);
    }
    return diff == 0;
}

}  // namespace detail

COROCOLL_END_NAMESPACE
