// The bodies of the non-template functions declared in <corocoll/io/futex.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/io/futex.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace io {

COROCOLL_DECL bool futex_wait_supported() noexcept {
    static const bool supported = [] {
        io_uring ring{};
        if (io_uring_queue_init(2, &ring, 0) != 0) return false;
        bool yes = false;
        if (io_uring_probe* probe = io_uring_get_probe_ring(&ring)) {
            yes = io_uring_opcode_supported(probe, op_futex_wait) != 0;
            io_uring_free_probe(probe);
        }
        io_uring_queue_exit(&ring);
        return yes;
    }();
    return supported;
}

COROCOLL_DECL int futex_wake(std::atomic<std::uint32_t>& word, int n) noexcept {
    static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
    return static_cast<int>(::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word),
                                      FUTEX_WAKE, n, nullptr, nullptr, 0));
}

namespace detail {

COROCOLL_DECL void prep_futex_wait(io_uring_sqe* sqe, const std::atomic<std::uint32_t>& word,
                                   std::uint32_t expected) noexcept {
    // The kernel's layout for the opcode (io_uring/futex.c): fd carries the futex2 flags,
    // addr the word, off (addr2) the expected value, addr3 the bitset; the rest is zero.
    constexpr int futex2_size_u32 = 0x02;
    io_uring_prep_rw(op_futex_wait, sqe, futex2_size_u32, &word, 0, expected);
    sqe->addr3 = FUTEX_BITSET_MATCH_ANY;
}

}  // namespace detail

}  // namespace io

COROCOLL_END_NAMESPACE
