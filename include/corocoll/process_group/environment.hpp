#pragma once

// The COROCOLL_* variables that change how a group behaves, read and checked together before
// set-up starts anything, so that a misspelt value is one clear error on every rank at once
// rather than a failure (or an abort) halfway through set-up.

#include <corocoll/collectives/select.hpp>
#include <corocoll/core/auth.hpp>
#include <corocoll/core/cache_sizes.hpp>
#include <corocoll/core/log.hpp>
#include <corocoll/rendezvous/launch_env.hpp>
#include <corocoll/transport/channel.hpp>
#include <corocoll/transport/engine.hpp>
#include <corocoll/transport/options.hpp>
#include <corocoll/version.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

COROCOLL_BEGIN_NAMESPACE

/// What the environment asks of process groups. Every field is what its variable says, or the
/// default when the variable is unset.
struct environment_settings {
    /// COROCOLL_ALGORITHM: algorithms forced per collective (see `algorithm_choice::parse_spec`).
    collectives::algorithm_choice algorithms;
    /// COROCOLL_TRANSPORT: auto, tcp or shm.
    transport::transport_choice transport = transport::transport_choice::automatic;
    /// COROCOLL_DEBUG: NONE, WARN, INFO or TRACE (any case).
    log_level debug = log_level::none;
    /// COROCOLL_TIMEOUT, in seconds (a positive number, fractions allowed): the default of
    /// `init_options::timeout`. Unset: none (the default stays 30 minutes).
    std::optional<std::chrono::milliseconds> timeout;
    /// COROCOLL_BUSY_POLL_US: microseconds of busy polling (see `reactor_options::busy_poll`).
    std::optional<std::chrono::microseconds> busy_poll;
    /// COROCOLL_STALL_S, in seconds (0: off): see `transport::engine_options::stall`.
    std::optional<std::chrono::milliseconds> stall;
    /// COROCOLL_CACHE_L2, in bytes (a size such as 512K): the L2 that `machine_cache_sizes`
    /// reports instead of sysfs's, from which size thresholds follow. 0: unset.
    std::size_t cache_l2 = 0;
};

namespace detail {

// A non-negative decimal number with at most 9 digits before and 6 after the point, scaled
// by `scale` (1000 for seconds to milliseconds); null for anything else.
COROCOLL_DECL std::optional<std::int64_t> parse_decimal(std::string_view s, std::int64_t scale);

inline std::string env_error(const char* name, const char* value, const std::string& why) {
    return std::string("corocoll: ") + name + "='" + value + "' " + why;
}

COROCOLL_DECL std::chrono::milliseconds parse_timeout(const char* v);

}  // namespace detail

/// Reads and checks every COROCOLL_* variable that shapes a group: COROCOLL_ALGORITHM,
/// COROCOLL_TRANSPORT, COROCOLL_DEBUG, COROCOLL_TIMEOUT, COROCOLL_BUSY_POLL_US,
/// COROCOLL_STALL_S and COROCOLL_CACHE_L2. A value
/// that is not understood throws `std::invalid_argument` naming the variable, the value and
/// what it may be. `init_process_group` calls it before it reaches the store; costs a few
/// `getenv` calls.
COROCOLL_DECL environment_settings
read_environment(const rendezvous::env_lookup& env = rendezvous::process_env());

namespace detail {

/// `init_options::timeout`'s default: COROCOLL_TIMEOUT when it is set and valid, else c10d's
/// 30 minutes (an invalid value is refused by `read_environment` when set-up starts).
COROCOLL_DECL std::chrono::milliseconds default_timeout();

}  // namespace detail

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/process_group/impl/environment.ipp>
#endif
