#pragma once

// corocoll's error codes and category, and the helpers that throw `std::system_error`s whose
// text names the operation, the ranks and the reason.

#include <corocoll/version.hpp>

#include <string>
#include <system_error>
#include <utility>

COROCOLL_BEGIN_NAMESPACE

/// Error codes that corocoll reports where no `std::errc` says the same thing. They travel in
/// `std::system_error`s whose `what()` also names the operation, the peer and the reason;
/// compare `e.code()` against them (`e.code() == corocoll::errc::connection_closed`).
enum class errc {
    /// The peer closed the connection before the operation's bytes were all transferred.
    connection_closed = 1,
    /// A frame or message was larger than the configured maximum.
    message_too_large,
    /// A peer sent something this rank does not expect (wrong version, header or sequence).
    protocol_error,
};

namespace detail {

class error_category_impl final : public std::error_category {
public:
    const char* name() const noexcept override { return "corocoll"; }
    COROCOLL_DECL std::string message(int code) const override;
};

}  // namespace detail

/// The category of `corocoll::errc` codes.
COROCOLL_DECL const std::error_category& error_category() noexcept;

/// Makes `corocoll::errc` usable wherever a `std::error_code` is expected.
inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), error_category()};
}

namespace detail {

/// Throws a `std::system_error` for the errno value `err` with `what` in front of the reason.
[[noreturn]] inline void throw_errno(int err, const std::string& what) {
    throw std::system_error(err, std::system_category(), what);
}

/// The text of `e` without the ": <reason>" that `std::system_error` appends to it, for
/// wrapping an error in more context without repeating its reason.
COROCOLL_DECL std::string context_of(const std::system_error& e);

/// Throws a `std::system_error` carrying `code` with `what` in front of the reason.
[[noreturn]] inline void throw_error(std::error_code code, const std::string& what) {
    throw std::system_error(code, what);
}

}  // namespace detail

COROCOLL_END_NAMESPACE

template <>
struct std::is_error_code_enum<corocoll::errc> : std::true_type {};

#if COROCOLL_DEFINE_BODIES
#include <corocoll/core/impl/error.ipp>
#endif
