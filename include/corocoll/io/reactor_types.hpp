#pragma once

// The small types a reactor is configured and driven with: its options, the features its
// ring got, what its loop counted, and the intrusive timer and poll entries it watches.

#include <corocoll/version.hpp>

#include <liburing.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

COROCOLL_BEGIN_NAMESPACE

namespace io {

/// How a reactor sets up its ring.
struct reactor_options {
    /// Submission-queue entries (the kernel rounds up to a power of two). Operations beyond
    /// what fits wait in the reactor's backlog; none is lost.
    unsigned sq_entries = 256;
    /// Completion-queue entries; 0 lets the kernel choose (twice `sq_entries`). Completions
    /// beyond it are kept by the kernel (IORING_FEAT_NODROP), not lost.
    unsigned cq_entries = 0;
    /// Poll the completion queue in a loop instead of sleeping in the kernel while idle.
    /// Trades a core for latency; off by default.
    bool spin = false;
    /// While operations are in flight, poll the completion queue for up to this long before
    /// sleeping in the kernel: a reply that comes within it is picked up without the cost of
    /// waking a sleeping thread (tens of microseconds on a loaded machine). An idle reactor
    /// (nothing in flight) never polls. 0 turns it off. The default is 50 µs, or the
    /// environment's COROCOLL_BUSY_POLL_US.
    std::chrono::microseconds busy_poll = default_busy_poll();

    /// `busy_poll`'s default: COROCOLL_BUSY_POLL_US when set and valid, else 50 µs.
    static std::chrono::microseconds default_busy_poll() noexcept;
    /// Poll at full speed even when this host's reactors outnumber its processors
    /// (`reactor::crowded`), and for the whole of `busy_poll` (no `yield_after`). Off: there
    /// the reactor yields its processor (sched_yield) between polls, since plain polling takes
    /// the cores that other ranks need. On when the environment sets COROCOLL_BUSY_POLL_US.
    bool busy_poll_when_crowded = std::getenv("COROCOLL_BUSY_POLL_US") != nullptr;
    /// Also yield between polls while this host runs more tasks than it has processors
    /// (`reactor::host_busy`: other programs' as well as ours), unless `busy_poll_when_crowded`.
    /// Polling plainly there takes the processor from the peer that would answer.
    bool yield_when_host_busy = true;
    /// A wait that has busy polled this long yields the processor (sched_yield) between its
    /// further polls. Where the peer that would answer shares this processor (the scheduler
    /// sometimes leaves two ranks of a freshly started job on one), polling plainly holds it
    /// off until `busy_poll` runs out and this rank sleeps: every message then costs a sleep
    /// and a wake-up. Yielding hands the processor over at once, and a rank whose yields keep
    /// handing it over moves itself to another processor (`reactor_stats::moves`). Where the peer
    /// has a processor of its own, a sched_yield with nothing else to run returns at once. 0: yield
    /// from the first poll; `busy_poll` or more: never (but where crowded or busy, above, and
    /// while the thread's last yield handed the processor over: then a wait yields from its
    /// first poll, its peer likely sharing the processor). Not with `busy_poll_when_crowded`.
    std::chrono::microseconds yield_after{10};
    /// The timer slack (prctl PR_SET_TIMERSLACK) of the thread that makes the reactor, for as
    /// long as the reactor lives (the thread's own value comes back when it goes, if the same
    /// thread destroys it); 0 leaves the thread's slack alone. While a shared-memory wait
    /// outlasts `busy_poll`, the loop pauses for a few microseconds at a time; with Linux's
    /// default slack of 50 µs each pause could last 50 µs more.
    std::chrono::nanoseconds timer_slack = std::chrono::microseconds(1);
    /// IORING_SETUP_* flags the reactor may try (it still drops those the kernel rejects).
    /// Narrow it to run on the set-up an older kernel would give: 0 means a plain ring.
    unsigned allowed_setup_flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                                   IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL |
                                   IORING_SETUP_TASKRUN_FLAG;
};

/// The ring set-up flags a reactor asked for and the kernel accepted.
struct reactor_features {
    bool single_issuer = false;  ///< IORING_SETUP_SINGLE_ISSUER (Linux 6.0)
    bool defer_taskrun = false;  ///< IORING_SETUP_DEFER_TASKRUN (Linux 6.1)
    bool coop_taskrun = false;   ///< IORING_SETUP_COOP_TASKRUN (Linux 5.19)
    bool submit_all = false;     ///< IORING_SETUP_SUBMIT_ALL (Linux 5.18)
    bool futex_wait = false;     ///< IORING_OP_FUTEX_WAIT (Linux 6.7; see io/futex.hpp)
    /// IORING_SETUP_TASKRUN_FLAG (Linux 5.19), with DEFER_TASKRUN or COOP_TASKRUN: the kernel
    /// raises IORING_SQ_TASKRUN while it holds completions for us, so a loop that polls
    /// watched entries enters it only then (`reactor_stats::enters`).
    bool taskrun_flag = false;
};

/// What a reactor's loop has done since the reactor was made, for tests and diagnostics: busy
/// polling shows as polls and yields, sleeping as kernel waits. Each count is a plain
/// increment (no atomic, no system call) on the reactor's thread; read them there.
struct reactor_stats {
    /// Turns of the loop (`run_until`): each runs posted work, reaps and maybe waits once.
    std::uint64_t turns = 0;
    /// Looks at the completion queue that did not sleep: each step of busy polling, each turn
    /// of a spinning reactor, each busy turn while a `poll_entry` is watched.
    std::uint64_t polls = 0;
    /// sched_yield calls between polls: where this host is `reactor::crowded` or busy, and in
    /// waits that outlast `reactor_options::yield_after`.
    std::uint64_t yields = 0;
    /// io_uring_enter calls that may sleep until a completion or a time: waits with nothing to
    /// poll for, after busy polling, and the pauses while entries are watched.
    std::uint64_t kernel_waits = 0;
    /// io_uring_enter calls made while busy polling, without sleeping: to submit, or to run
    /// the completions the kernel holds back for a deferred or cooperative task-run ring
    /// (their CQEs appear only then). At every step of a plain busy poll; while entries are
    /// watched, only when there is something to submit or the kernel says it holds
    /// completions (IORING_SQ_TASKRUN, where the ring has IORING_SETUP_TASKRUN_FLAG), else
    /// every 10 µs.
    std::uint64_t enters = 0;
    /// Sleeps that every watched entry allowed (`poll_entry::prepare_sleep`); counted in
    /// `kernel_waits` too.
    std::uint64_t watched_sleeps = 0;
    /// Of those, sleeps with an IORING_OP_FUTEX_WAIT in flight for a watched entry (a shared
    /// memory channel's): the peer ends them with one FUTEX_WAKE.
    std::uint64_t futex_sleeps = 0;
    /// Barriers on the peers' processors (io/membarrier.hpp) that shared-memory channels ran
    /// before the watched sleeps they agreed to, so that their peers publish to them without
    /// a fence: one per channel that waits, so a sleep with three channels watched counts
    /// three.
    std::uint64_t fenced_sleeps = 0;
    /// Times the loop moved its thread off a processor it found shared with the peer it
    /// waited for (see `reactor_options::yield_after`).
    std::uint64_t moves = 0;
    /// Completed reads of the eventfd that `post` from another thread writes to: how often
    /// other threads woke the loop (posts that come before the loop reads it count once).
    std::uint64_t wakeups = 0;
};

/// A deadline the reactor watches without a kernel operation, for code that must act when a
/// wait runs too long (the engine's posted receives). `reactor::arm` it, `reactor::disarm` it
/// once it is no longer needed; when the steady clock reaches `when` first, the loop calls
/// `fire` on the reactor's thread (the entry is disarmed by then). Intrusive: it lives in the
/// caller's memory, which must outlast its armed time; arming costs no allocation in steady
/// state and no system call.
struct timer_entry {
    /// When the timer fires.
    std::chrono::steady_clock::time_point when{};
    /// Called on the reactor's thread when `when` has passed; the entry is disarmed by then.
    void (*fire)(timer_entry&) noexcept = nullptr;
    /// Position in the reactor's heap; `not_armed` when not armed.
    std::size_t slot = not_armed;
    /// The `slot` of an entry that is not in the heap.
    static constexpr std::size_t not_armed = static_cast<std::size_t>(-1);
    /// True between arming and firing or disarming.
    bool armed() const noexcept { return slot != not_armed; }
};

/// A completion that no file descriptor signals (a CUDA event, a flag another library sets),
/// which the loop therefore asks about on every turn: `reactor::watch` it and the loop calls
/// `poll` on its thread at each turn until it is unwatched. `poll` returns true when it made
/// progress (its wait is over). It may resume the coroutine that waited, which may then watch
/// or unwatch entries, this one included (the loop's walk over the entries allows that); it
/// must not destroy an entry other than its own. Intrusive, like `timer_entry`: watching
/// allocates nothing.
///
/// While an entry is watched the loop never sleeps in the kernel for long: it polls without
/// sleeping for `reactor_options::busy_poll` after the last progress (yielding the processor
/// between turns where this host is crowded), then sleeps between turns for 1/32 of the time
/// since the last progress, at most 500 µs, so that a long wait costs little processor time
/// and finishes at most ~3% late.
///
/// An entry whose waits can end a kernel sleep (a peer that writes to a descriptor or wakes a
/// futex the ring waits on) sets `prepare_sleep`: after the busy polling, the loop asks every
/// watched entry whether it may sleep; when all say yes it sleeps in the kernel without the
/// pauses, as if nothing were watched, and calls `end_sleep` on each once it wakes. An entry
/// that says no (its wait is over meanwhile) counts as progress; entries asked before it get
/// `end_sleep` at once.
struct poll_entry {
    /// Looks once whether the wait is over; true when it made progress.
    bool (*poll)(poll_entry&) noexcept = nullptr;
    /// True: whatever this entry waits for will complete a ring operation, so the loop may
    /// sleep. Null: the entry needs the pauses.
    bool (*prepare_sleep)(poll_entry&) noexcept = nullptr;
    /// After a sleep that `prepare_sleep` allowed (or when another entry refused it).
    void (*end_sleep)(poll_entry&) noexcept = nullptr;
    /// The reactor's list of watched entries; set while `watched`.
    poll_entry* prev = nullptr;
    /// The reactor's list of watched entries; set while `watched`.
    poll_entry* next = nullptr;
    /// True while the reactor polls this entry.
    bool watched = false;
};

}  // namespace io

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/io/impl/reactor_types.ipp>
#endif
