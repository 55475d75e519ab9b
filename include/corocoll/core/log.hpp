#pragma once

#include <corocoll/version.hpp>

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

COROCOLL_BEGIN_NAMESPACE

/// Diagnostics in NCCL_DEBUG's manner: `COROCOLL_DEBUG=WARN|INFO|TRACE` turns on logs on
/// stderr that say which rank did what; `COROCOLL_DEBUG_SUBSYS=INIT,STORE,P2P,...` (default:
/// all) narrows them. Errors never depend on it: exceptions carry the whole story.
enum class log_level { none = 0, warn = 1, info = 2, trace = 3 };

namespace detail {

/// A COROCOLL_DEBUG value: NONE (or empty), WARN, INFO or TRACE, in any case; null otherwise.
inline std::optional<log_level> parse_log_level(std::string_view s) {
    std::string upper(s);
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (upper.empty() || upper == "NONE") return log_level::none;
    if (upper == "WARN") return log_level::warn;
    if (upper == "INFO") return log_level::info;
    if (upper == "TRACE") return log_level::trace;
    return std::nullopt;
}

struct log_config {
    log_level level = log_level::none;
    std::string subsystems;  // comma-separated, upper case; empty = all

    static const log_config& get() {
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

    bool enabled(log_level l, std::string_view subsystem) const {
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
};

/// The rank that log lines of this thread name (-1 before a group exists); ranks run as
/// threads in tests, so it is per thread.
inline int& log_rank() noexcept {
    thread_local int rank = -1;
    return rank;
}

inline bool log_enabled(log_level l, std::string_view subsystem) {
    return log_config::get().enabled(l, subsystem);
}

template <class... Args>
void log_write(log_level l, std::string_view subsystem, const Args&... args) {
    std::ostringstream line;
    static constexpr const char* names[] = {"", "WARN", "INFO", "TRACE"};
    line << "corocoll[pid " << ::getpid();
    if (log_rank() >= 0) line << " rank " << log_rank();
    line << "] " << names[static_cast<int>(l)] << ' ' << subsystem << ": ";
    (line << ... << args);
    line << '\n';
    std::string s = line.str();
    // One write per line, so lines of different processes do not interleave mid-line.
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, s.data(), s.size());
}

}  // namespace detail

COROCOLL_END_NAMESPACE

/// Logs `args...` (streamed) at `level` (WARN, INFO, TRACE) for `subsystem` when enabled.
#define COROCOLL_LOG(level, subsystem, ...)                                                      \
    do {                                                                                         \
        if (::corocoll::detail::log_enabled(::corocoll::log_level::level, subsystem)) {          \
            ::corocoll::detail::log_write(::corocoll::log_level::level, subsystem, __VA_ARGS__); \
        }                                                                                        \
    } while (false)
