// The bodies of the non-template functions declared in <corocoll/core/log.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/log.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL std::optional<log_level> parse_log_level(std::string_view s) {
    std::string upper(s);
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (upper.empty() || upper == "NONE") return log_level::none;
    if (upper == "WARN") return log_level::warn;
    if (upper == "INFO") return log_level::info;
    if (upper == "TRACE") return log_level::trace;
    return std::nullopt;
}

COROCOLL_DECL const log_config& log_config::get() {
    static const log_config config = [] {
        log_config c;
        // An unknown value logs nothing here; init_process_group refuses it first.
        if (const char* v = std::getenv("COROCOLL_DEBUG")) {
            c.level = parse_log_level(v).value_or(log_level::none);
        }
        if (const char* v = std::getenv("COROCOLL_DEBUG_SUBSYS")) c.subsystems = v;
        return c;
    }();
    return config;
}

COROCOLL_DECL bool log_config::enabled(log_level l, std::string_view subsystem) const {
    if (l > level) return false;
    if (subsystems.empty() || subsystems == "ALL") return true;
    std::string_view list(subsystems);
    while (!list.empty()) {
        auto comma = list.find(',');
        if (list.substr(0, comma) == subsystem) return true;
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
    }
    return false;
}

COROCOLL_DECL int& log_rank() noexcept {
    thread_local int rank = -1;
    return rank;
}

COROCOLL_DECL std::atomic<int>& log_level_set() noexcept {
    static std::atomic<int> level{-1};
    return level;
}

COROCOLL_DECL log_sink_state& log_sink_state::get() noexcept {
    static log_sink_state state;
    return state;
}

COROCOLL_DECL bool log_enabled(log_level l, std::string_view subsystem) {
    const log_config& c = log_config::get();
    int set = log_level_set().load(std::memory_order_relaxed);
    if (set >= 0 && l > static_cast<log_level>(set)) return false;
    if (set < 0 && l > c.level) return false;
    return c.enabled(log_level::none, subsystem);
}

}  // namespace detail

COROCOLL_DECL void set_log_sink(log_sink sink, void* context) {
    auto& state = detail::log_sink_state::get();
    std::lock_guard lock(state.mutex);
    state.sink = sink;
    state.context = context;
}

COROCOLL_DECL log_level get_log_level() noexcept {
    int set = detail::log_level_set().load(std::memory_order_relaxed);
    return set >= 0 ? static_cast<log_level>(set) : detail::log_config::get().level;
}

COROCOLL_END_NAMESPACE
