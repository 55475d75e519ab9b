// The bodies of the non-template functions declared in <corocoll/process_group/environment.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/process_group/environment.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL std::optional<std::int64_t> parse_decimal(std::string_view s, std::int64_t scale) {
    auto point = s.find('.');
    std::string_view whole = s.substr(0, point);
    std::string_view fraction = point == std::string_view::npos ? "" : s.substr(point + 1);
    if (whole.empty() || whole.size() > 9 || fraction.size() > 6 ||
        (point != std::string_view::npos && fraction.empty())) {
        return std::nullopt;
    }
    std::int64_t value = 0, denominator = 1;
    for (char c : whole) {
        if (c < '0' || c > '9') return std::nullopt;
        value = value * 10 + (c - '0');
    }
    for (char c : fraction) {
        if (c < '0' || c > '9') return std::nullopt;
        value = value * 10 + (c - '0');
        denominator *= 10;
    }
    return value * scale / denominator;
}

COROCOLL_DECL std::chrono::milliseconds parse_timeout(const char* v) {
    auto ms = parse_decimal(v, 1000);
    if (!ms || *ms <= 0) {
        throw std::invalid_argument(
            env_error("COROCOLL_TIMEOUT", v,
                      "is not a positive number of seconds (such as 60 or 2.5; at least 0.001)"));
    }
    return std::chrono::milliseconds(*ms);
}

}  // namespace detail

COROCOLL_DECL environment_settings read_environment(const rendezvous::env_lookup& env) {
    environment_settings out;
    if (const char* v = env("COROCOLL_ALGORITHM")) {
        out.algorithms = collectives::algorithm_choice::parse_spec(v);
    }
    if (const char* v = env("COROCOLL_TRANSPORT")) out.transport = transport::parse_transport(v);
    if (const char* v = env("COROCOLL_DEBUG")) {
        auto level = detail::parse_log_level(v);
        if (!level) {
            throw std::invalid_argument(
                detail::env_error("COROCOLL_DEBUG", v, "is not one of NONE, WARN, INFO, TRACE"));
        }
        out.debug = *level;
    }
    if (const char* v = env("COROCOLL_TIMEOUT")) out.timeout = detail::parse_timeout(v);
    if (const char* v = env("COROCOLL_BUSY_POLL_US")) {
        auto us = detail::parse_decimal(v, 1);
        if (!us || std::string_view(v).find('.') != std::string_view::npos) {
            throw std::invalid_argument(detail::env_error(
                "COROCOLL_BUSY_POLL_US", v, "is not a whole number of microseconds (0: off)"));
        }
        out.busy_poll = std::chrono::microseconds(*us);
    }
    if (const char* v = env("COROCOLL_STALL_S")) out.stall = transport::parse_stall(v);
    if (const char* v = env("COROCOLL_CACHE_L2"); v != nullptr && *v != '\0') {
        out.cache_l2 = parse_cache_size(v);
        if (out.cache_l2 == 0) {
            throw std::invalid_argument(
                detail::env_error("COROCOLL_CACHE_L2", v, corocoll::detail::cache_size_expected));
        }
    }
    // Checked here, on every rank, before the store is reached: found at the mesh, only the
    // ranks that got there said why (rank 0 then left, taking its store with it, and the
    // others reported a reset connection).
    if (const char* v = env("COROCOLL_JOB_TOKEN");
        v != nullptr && *v != '\0' && !corocoll::detail::token_auth_available()) {
        throw std::invalid_argument(corocoll::detail::no_token_auth);
    }
    return out;
}

namespace detail {

COROCOLL_DECL std::chrono::milliseconds default_timeout() {
    if (const char* v = std::getenv("COROCOLL_TIMEOUT")) {
        try {
            return parse_timeout(v);
        } catch (const std::invalid_argument&) {
        }
    }
    return std::chrono::minutes(30);
}

}  // namespace detail

COROCOLL_END_NAMESPACE
