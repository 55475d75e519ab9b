#pragma once

// What mesh set-up and the store need to prove knowledge of the job token without sending it: fresh
// nonces and HMAC-SHA256. The HMAC comes from OpenSSL's libcrypto, which the build must provide:
// Meson defines COROCOLL_WITH_OPENSSL and links libcrypto when it finds it (a vendoring
// project defines the macro and links -lcrypto itself). Without it, a job token is refused
// with an error that says so (see docs/security.md); set-up without a token needs neither.

#include <corocoll/core/error.hpp>
#include <corocoll/version.hpp>

#include <sys/random.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#if defined(COROCOLL_WITH_OPENSSL)
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#endif

COROCOLL_BEGIN_NAMESPACE

namespace detail {

inline constexpr std::size_t nonce_bytes = 32;
inline constexpr std::size_t proof_bytes = 32;  // HMAC-SHA256
using auth_nonce = std::array<std::byte, nonce_bytes>;
using auth_proof = std::array<std::byte, proof_bytes>;

/// True when this build can authenticate with a job token (libcrypto is there).
inline constexpr bool token_auth_available() noexcept {
#if defined(COROCOLL_WITH_OPENSSL)
    return true;
#else
    return false;
#endif
}

/// Why a job token is refused where `token_auth_available()` is false (set-up's error text).
inline constexpr const char* no_token_auth =
    "COROCOLL_JOB_TOKEN is set, but this build of corocoll has no libcrypto for HMAC-SHA256 "
    "(build with OpenSSL's libcrypto, which Meson finds, or define COROCOLL_WITH_OPENSSL and "
    "link -lcrypto); unset the token to run without authentication";

/// 32 bytes from the kernel's CSPRNG (getrandom), never reused.
COROCOLL_DECL auth_nonce auth_random_nonce();

/// HMAC-SHA256 of `message` under `key`.
inline auth_proof hmac_sha256([[maybe_unused]] std::string_view key,
                              [[maybe_unused]] std::string_view message) {
    auth_proof out{};
#if defined(COROCOLL_WITH_OPENSSL)
    unsigned int length = 0;
    if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
             reinterpret_cast<const unsigned char*>(message.data()), message.size(),
             reinterpret_cast<unsigned char*>(out.data()), &length) == nullptr ||
        length != out.size()) {
        throw std::runtime_error("corocoll: init: HMAC-SHA256 failed in libcrypto");
    }
#else
    throw std::logic_error("corocoll: init: HMAC-SHA256 needs libcrypto (COROCOLL_WITH_OPENSSL)");
#endif
    return out;
}

/// Compares two proofs in time that does not depend on where they differ.
COROCOLL_DECL bool same_proof(const auth_proof& a, const auth_proof& b) noexcept;

}  // namespace detail

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/core/impl/auth.ipp>
#endif
