// The bodies of the non-template functions declared in <corocoll/process_group/run.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/process_group/run.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL int inherited_failure_pipe() noexcept {
    const char* v = std::getenv("COROCOLL_FAILURE_FD");
    if (v == nullptr || *v == '\0') return -1;
    char* end = nullptr;
    long fd = std::strtol(v, &end, 10);
    if (*end != '\0' || fd < 3 || fd > 1'000'000) return -1;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISFIFO(st.st_mode)) return -1;
    return static_cast<int>(fd);
}

COROCOLL_DECL int& failure_pipe() noexcept {
    static int fd = inherited_failure_pipe();
    return fd;
}

COROCOLL_DECL void announce_failure(int rank) noexcept {
    static bool announced = false;
    if (failure_pipe() < 0 || announced) return;
    announced = true;
    std::int32_t r = rank;
    [[maybe_unused]] auto n = ::write(failure_pipe(), &r, sizeof(r));  // atomic: < PIPE_BUF
}

COROCOLL_DECL void print_rank_error(int rank, const char* what) {
    std::string text = what;
    std::string prefix = "corocoll: rank " + std::to_string(rank) + ":";
    if (rank >= 0 && text.rfind(prefix, 0) != 0) text = prefix + " " + text;
    std::fprintf(stderr, "%s\n", text.c_str());
    std::fflush(stderr);
}

}  // namespace detail

COROCOLL_END_NAMESPACE
