// The bodies of the non-template functions declared in <corocoll/process_group/spawn.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/process_group/spawn.hpp>

COROCOLL_BEGIN_NAMESPACE

COROCOLL_DECL std::string rank_exit::describe() const {
    std::string s = "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ") ";
    if (signal != 0) {
        s += "was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
    } else {
        s += "exited with code " + std::to_string(exit_code);
    }
    if (stopped_by_us) s += " after being stopped because another rank failed";
    return s;
}

namespace detail {

COROCOLL_DECL int report(const spawn_result& r) {
    if (r.ok()) return 0;
    const auto& first = r.ranks[static_cast<std::size_t>(r.first_failure)];
    std::fprintf(stderr, "corocoll: spawn: failed first: %s\n", first.describe().c_str());
    for (const auto& e : r.ranks) {
        if (!e.ok() && e.rank != r.first_failure) {
            std::fprintf(stderr, "corocoll: spawn: %s\n", e.describe().c_str());
        }
    }
    return 1;
}

}  // namespace detail

COROCOLL_DECL bool launched_by_launcher() {
    for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
        if (std::getenv(v) != nullptr) return true;
    }
    return false;
}

COROCOLL_END_NAMESPACE
