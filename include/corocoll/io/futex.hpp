#pragma once

// Futex waits in the ring and futex wakes, for words that several processes map (a shared
// segment): a reactor that has nothing to do sleeps in io_uring_enter with an
// IORING_OP_FUTEX_WAIT in flight, and the process that has news for it wakes it with one
// futex(2) FUTEX_WAKE. io_uring has the opcode since Linux 6.7; liburing 2.3 (Debian 12)
// predates it, so the SQE is filled here by hand, and whether the running kernel has it is
// probed once per process (`futex_wait_supported`).

#include <corocoll/version.hpp>

#include <liburing.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

COROCOLL_BEGIN_NAMESPACE

namespace io {

/// IORING_OP_FUTEX_WAIT (Linux 6.7), which liburing 2.3's headers do not name.
inline constexpr std::uint8_t op_futex_wait = 51;

/// True when this kernel's io_uring has IORING_OP_FUTEX_WAIT (probed once per process with
/// IORING_REGISTER_PROBE on a small ring of its own; false where the probe fails).
COROCOLL_DECL bool futex_wait_supported() noexcept;

/// Wakes up to `n` waiters on `word` in any process that maps it (futex(2) FUTEX_WAKE, not
/// private): one system call. Returns how many were woken, or -1 (errno set).
COROCOLL_DECL int futex_wake(std::atomic<std::uint32_t>& word, int n) noexcept;

namespace detail {

/// Fills `sqe` with a wait on the shared 32-bit `word` while it holds `expected` (futex2 flags
/// FUTEX2_SIZE_U32, not private; any bitset). The CQE's result is 0 once woken, -EAGAIN when
/// `word` no longer held `expected` at submission, -ECANCELED when cancelled.
COROCOLL_DECL void prep_futex_wait(io_uring_sqe* sqe, const std::atomic<std::uint32_t>& word,
                                   std::uint32_t expected) noexcept;

}  // namespace detail

}  // namespace io

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/io/impl/futex.ipp>
#endif
