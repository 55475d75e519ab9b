#pragma once

// Diagnostics on stderr, in NCCL_DEBUG's manner (COROCOLL_DEBUG, COROCOLL_DEBUG_SUBSYS).

#include <corocoll/version.hpp>

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

COROCOLL_BEGIN_NAMESPACE

/// Diagnostics in NCCL_DEBUG's manner: `COROCOLL_DEBUG=WARN|INFO|TRACE` turns on logs on
/// stderr that say which rank did what; `COROCOLL_DEBUG_SUBSYS=INIT,STORE,P2P,...` (default:
/// all) narrows them. Errors never depend on it: exceptions carry the whole story.
enum class log_level { none = 0, warn = 1, info = 2, trace = 3 };

/// One log line as corocoll hands it to a `log_sink`. The views live for the call only.
struct log_record {
    log_level level;             ///< warn, info or trace
    std::string_view subsystem;  ///< "INIT", "STORE", "P2P", ...
    int rank;                    ///< the logging thread's rank, -1 before a group exists
    std::string_view message;    ///< the text alone, without prefix or newline
    std::string_view line;  ///< what stderr would get: "corocoll[pid 7 rank 1] INFO INIT: ...\n"
};

/// Where log lines go instead of stderr: called on the thread that logs, one line at a time
/// (calls never overlap), with the `context` given to `set_log_sink`. It must not throw, nor
/// log through corocoll.
using log_sink = void (*)(const log_record& record, void* context) noexcept;

namespace detail {

/// A COROCOLL_DEBUG value: NONE (or empty), WARN, INFO or TRACE, in any case; null otherwise.
COROCOLL_DECL std::optional<log_level> parse_log_level(std::string_view s);

struct log_config {
    log_level level = log_level::none;
    std::string subsystems;  // comma-separated, upper case; empty = all

    static const log_config& get();

    bool enabled(log_level l, std::string_view subsystem) const;
};

/// The rank that log lines of this thread name (-1 before a group exists); ranks run as
/// threads in tests, so it is per thread.
COROCOLL_DECL int& log_rank() noexcept;

// set_log_level's level, -1 while COROCOLL_DEBUG decides.
COROCOLL_DECL std::atomic<int>& log_level_set() noexcept;

struct log_sink_state {
    std::mutex mutex;  // held while a line is handed over: calls never overlap
    log_sink sink = nullptr;
    void* context = nullptr;

    static log_sink_state& get() noexcept;
};

COROCOLL_DECL bool log_enabled(log_level l, std::string_view subsystem);

template <class... Args>
void log_write(log_level l, std::string_view subsystem, const Args&... args) {
    std::ostringstream line;
    static constexpr const char* names[] = {"", "WARN", "INFO", "TRACE"};
    line << "corocoll[pid " << ::getpid();
    if (log_rank() >= 0) line << " rank " << log_rank();
    line << "] " << names[static_cast<int>(l)] << ' ' << subsystem << ": ";
    const auto prefix = static_cast<std::size_t>(line.tellp());
    (line << ... << args);
    line << '\n';
    std::string s = line.str();
    auto& state = log_sink_state::get();
    {
        std::lock_guard lock(state.mutex);
        if (state.sink != nullptr) {
            std::string_view text(s);
            state.sink(
                {l, subsystem, log_rank(), text.substr(prefix, text.size() - prefix - 1), text},
                state.context);
            return;
        }
    }
    // One write per line, so lines of different processes do not interleave mid-line.
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, s.data(), s.size());
}

}  // namespace detail

/// Routes corocoll's log lines to `sink` (with `context`) instead of stderr, so that an
/// application's own logger gets them; null goes back to stderr. Which lines are logged is
/// still decided by COROCOLL_DEBUG and COROCOLL_DEBUG_SUBSYS, or by `set_log_level`. From any
/// thread; a line being handed over finishes first. Costs a mutex per logged line.
COROCOLL_DECL void set_log_sink(log_sink sink, void* context = nullptr);

/// Sets the level of the logs from code, over COROCOLL_DEBUG (whose subsystems still apply);
/// `log_level::none` turns them off. From any thread; one atomic store.
inline void set_log_level(log_level level) noexcept {
    detail::log_level_set().store(static_cast<int>(level), std::memory_order_relaxed);
}

/// The level in force: `set_log_level`'s, else COROCOLL_DEBUG's.
COROCOLL_DECL log_level get_log_level() noexcept;

COROCOLL_END_NAMESPACE

/// Logs `args...` (streamed) at `level` (WARN, INFO, TRACE) for `subsystem` when enabled.
#define COROCOLL_LOG(level, subsystem, ...)                                                      \
    do {                                                                                         \
        if (::corocoll::detail::log_enabled(::corocoll::log_level::level, subsystem)) {          \
            ::corocoll::detail::log_write(::corocoll::log_level::level, subsystem, __VA_ARGS__); \
        }                                                                                        \
    } while (false)

#if COROCOLL_DEFINE_BODIES
#include <corocoll/core/impl/log.ipp>
#endif
