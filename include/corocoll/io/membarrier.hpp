#pragma once

// A memory barrier run on other processes' processors, for a protocol where one side stores
// and then looks often (and must be cheap) and the other side stores and then looks rarely
// (and may pay): the frequent side keeps its store and look in program order with no fence
// (a compiler barrier), and the rare side, between its store and its look, has the kernel run a
// full barrier on every processor that runs a thread of a registered process (membarrier(2),
// MEMBARRIER_CMD_GLOBAL_EXPEDITED, Linux 4.16). Either the frequent side's look comes after
// that barrier, and sees the rare side's store, or its store came before it, and the barrier
// made it visible to the rare side's look. A shared-memory channel's writer publishes that way,
// and a side about to sleep is the rare one (transport/shm/channel.hpp).

#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace io {

/// Whether this process takes part in `barrier_on_processes`: registers it
/// (MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) on the first call, one system call, and keeps
/// the answer; false where the kernel lacks the command or forbids it (a seccomp filter, an
/// old kernel). A thread of a process that is not registered is not reached by the barrier.
COROCOLL_DECL bool membarrier_registered() noexcept;

/// Runs a full memory barrier on every processor that runs a thread of a registered process,
/// and returns once they have (MEMBARRIER_CMD_GLOBAL_EXPEDITED): one system call and an
/// interrupt to each such processor, a few microseconds. False where the call failed (nothing
/// is then promised).
COROCOLL_DECL bool barrier_on_processes() noexcept;

}  // namespace io

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/io/impl/membarrier.ipp>
#endif
