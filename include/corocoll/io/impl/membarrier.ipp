// The bodies of the non-template functions declared in <corocoll/io/membarrier.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/io/membarrier.hpp>

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

COROCOLL_BEGIN_NAMESPACE

namespace io {

COROCOLL_DECL bool membarrier_registered() noexcept {
    static const bool registered = [] {
        const long commands = ::syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
        if (commands < 0 || (commands & MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0 ||
            (commands & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0) {
            return false;
        }
        return ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
    }();
    return registered;
}

COROCOLL_DECL bool barrier_on_processes() noexcept {
    return ::syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0;
}

}  // namespace io

COROCOLL_END_NAMESPACE
