// The bodies of the non-template functions declared in <corocoll/transport/options.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/options.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

COROCOLL_DECL std::chrono::milliseconds parse_stall(const char* v) {
    if (v == nullptr || *v == '\0') return std::chrono::seconds(60);
    char* end = nullptr;
    double seconds = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(seconds >= 0) || seconds > 1e9) {
        throw std::invalid_argument(std::string("corocoll: COROCOLL_STALL_S='") + v +
                                    "' is not a number of seconds >= 0 (0 turns stall checks off)");
    }
    return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

COROCOLL_DECL transport_choice parse_transport(std::string_view v) {
    if (v.empty() || v == "auto") return transport_choice::automatic;
    if (v == "tcp") return transport_choice::tcp;
    if (v == "shm") return transport_choice::shm;
    throw std::invalid_argument("corocoll: COROCOLL_TRANSPORT='" + std::string(v) +
                                "' is not one of auto, tcp, shm");
}

COROCOLL_DECL transport_choice transport_from_env() {
    const char* text = std::getenv("COROCOLL_TRANSPORT");
    return text == nullptr ? transport_choice::automatic : parse_transport(text);
}

COROCOLL_DECL const char* to_string(transport_choice c) noexcept {
    switch (c) {
        case transport_choice::tcp:
            return "tcp";
        case transport_choice::shm:
            return "shm";
        default:
            return "auto";
    }
}

COROCOLL_DECL connect_mode parse_connect(std::string_view v) {
    if (v.empty() || v == "lazy") return connect_mode::lazy;
    if (v == "eager") return connect_mode::eager;
    throw std::invalid_argument("corocoll: COROCOLL_CONNECT='" + std::string(v) +
                                "' is not one of eager, lazy");
}

COROCOLL_DECL connect_mode connect_from_env() {
    const char* text = std::getenv("COROCOLL_CONNECT");
    return text == nullptr ? connect_mode::lazy : parse_connect(text);
}

}  // namespace transport

COROCOLL_END_NAMESPACE
