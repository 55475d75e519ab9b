#pragma once

// The arena of a group whose ranks all share one host: one segment that every rank of the
// group maps (a memfd that the lowest rank creates and hands to the others over their pairs'
// unix sockets at set-up; see shm/setup.hpp), where the shared-memory collectives
// (collectives/*_shm.hpp) put their data and meet.
//
// The ranks move through numbered steps together. Each rank has a few steps' worth of lines of
// its own in the arena (P = `arena_steps_for(ranks)` of them, used in turn: step s uses s's
// place modulo P), each with a counter, `arrived`, that only it stores: the last step of that
// place it reached. A step is a barrier: a rank writes what it brings to the step (its call,
// and up to `shm_arena::line_bytes` of data: the first 32 in the line with the counter),
// stores the step's number (release), and goes on once every rank's counter shows it
// (acquire). What a rank's lines carry for step s is written between every rank passing step
// s - P (arriving at s - P + 1) and this rank arriving at s, and read between passing s and
// arriving at s + 1. The two data sets are used by parity: what step s puts there is written
// after every rank arrived at s - 1, and read before arriving at s + 1. A rank that waited for
// everyone at each step (`arrive`) keeps both rules without a second barrier.
//
// A rank's step line also carries the metadata of the collective it runs (written with the
// first step of each call), so that ranks compare their calls as they meet, as they do on
// every frame; and a few bytes of data, so that a small all_reduce moves one line per peer. Every
// collective of the group, whatever its algorithm, also announces itself in the rank's line
// (`announce`): a rank that waits at a step for a rank in another collective of the same
// number (a broadcast that went by the tree, say) finds the mismatch there at once.
//
// A rank may go past a step without waiting there (a broadcast's root, which only writes;
// `arrive_and_go`), or wait there for one rank only (the others, which read only the root's
// data). Before it next writes its lines it waits for every rank at the step after the last
// one that used the place it writes (`settle_lines`: a root of small broadcasts runs up to
// P - 1 calls ahead of its readers, its writes no longer waiting for each reader's
// look; when it must wait, it waits until they are half as far behind, so that it looks at
// their lines once every few calls, not at each), and before it next writes a data set or
// offers a buffer, for every rank at every step it went past (`settle`). A rank remembers the
// last step it saw each rank reach (`seen_at`): a wait for a step that rank is known to have
// reached reads nothing of that rank's, whose line it may be writing.
//
// Of two ranks that both go on at a step with their calls to compare (two that each believe
// they are the root), at least one sees the other: each stores the step in its own `went_on`
// line and then looks at the others' (sequentially consistent), before it writes its step
// line (`will_go_on`). Stored in the step line after the data, that order would make the store
// wait, at each call, for the line to come back from the reader who looked at it last.
//
// Waiting belongs to the reactor: a step that is not complete watches a `poll_entry` (busy
// polling, yielding where ranks outnumber processors; then, where the kernel has io_uring
// futex waits, a sleep until the first rank not yet there arrives: the waiter raises that
// rank's `sleepers` word and waits on its `wakes` word, and the rank's next arrival (or
// announced call), seeing `sleepers`, wakes every such waiter with one FUTEX_WAKE; elsewhere,
// pauses between looks).
// It ends when the step is complete or the group fails (a peer's channel ended: the engine
// knows). It counts as a wait
// for the engine's stall checks and status answers, and its deadline asks the ranks who to
// blame, as a receive's does. The segment is a memfd: nothing is named in /dev/shm, and it is
// gone once every rank has unmapped it or died.

#include <corocoll/core/copy.hpp>
#include <corocoll/core/error.hpp>
#include <corocoll/core/prefetch.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/io/futex.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/transport/engine.hpp>
#include <corocoll/transport/frame.hpp>
#include <corocoll/version.hpp>

#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <climits>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// The calls whose single copies (shm_arena::single_copy) start at a size of their own: a
/// broadcast copies the root's buffer, all_gather every rank's block, gather the others'
/// blocks at the root, scatter each rank's block from the root, all_to_all each rank's block
/// from every other, all_reduce every rank's buffer (its sizes are of the whole buffer).
enum class single_copy_use : std::uint8_t {
    broadcast,
    all_gather,
    gather,
    scatter,
    all_to_all,
    all_reduce
};
inline constexpr std::size_t single_copy_uses = 6;
/// The call's name, as its collective is named ("all_to_all").
constexpr const char* single_copy_use_name(single_copy_use u) noexcept {
    constexpr const char* names[] = {"broadcast", "all_gather", "gather",
                                     "scatter",   "all_to_all", "all_reduce"};
    static_assert(std::size(names) == single_copy_uses);
    return names[static_cast<std::size_t>(u)];
}

/// Whether a call whose offered buffer has `bytes` bytes lies in its use's single-copy sizes,
/// from `from` (0: never) up to, not including, `below` (0: no bound). The arena's own check
/// (shm_arena::single_copy) and collectives::select both ask this, so they cannot disagree.
constexpr bool in_single_copy_sizes(std::size_t bytes, std::size_t from,
                                    std::size_t below) noexcept {
    return from > 0 && bytes >= from && (below == 0 || bytes < below);
}

namespace detail {

/// "CCARENA1": the first word of an arena.
inline constexpr std::uint64_t arena_magic = 0x31414e4552414343ull;

// The start of an arena; the ranks' lines follow at 128, the data sets at `data_offset`.
struct arena_header {
    std::uint64_t magic = arena_magic;
    std::uint64_t probe = 0;  // the creator's nonce: proves that a rank maps this memory
    std::uint64_t ranks = 0;
    std::uint64_t set_bytes = 0;  // bytes of each of the two data sets
    // The creator's sizes from which each use copies straight from the ranks' buffers (see
    // shm_arena::single_copy; by single_copy_use, 0: never): one set for the group.
    std::uint64_t single_copy_from[single_copy_uses] = {};
    // ... and below which, in KiB (0: no bound; see shm_arena::single_copy): 32 bits, so that
    // the header keeps to the 128 bytes before the ranks' lines.
    std::uint32_t single_copy_below_kib[single_copy_uses] = {};
    // The creator's L2 in bytes (machine_cache_sizes; 0: not known), from which every rank
    // derives the group's size thresholds alike (collectives::thresholds::for_l2).
    std::uint64_t l2_bytes = 0;
};

// Steps whose lines a rank keeps at once (see the top of this file) in an arena of `ranks`
// ranks: step s uses place s % that count. A power of two, the same on every rank. More
// places let a rank that goes on without waiting (a root of broadcasts, scatters; a sender of
// gathers) run further ahead of its readers and wait for them less often; each place is 4 KiB
// of every rank's memory, so large groups keep few. 3 to 8 ranks keep 128: where ranks
// outnumber processors, a reader runs only when another gives its processor up, and reads
// the calls the root wrote meanwhile, so the processors change hands once in P / 2 calls
// (4 ranks on 2 processors: broadcasts of 4 B took 0.95 µs with 32 places, 0.46 with 128).
// 2 ranks keep 32, as each rank mostly has a processor of its own, where 128 made gathers of
// 64 B-1 KiB 15-20% slower (more pages in turn). (docs/performance.md, "Deeper arena steps
// for small groups" and "Deeper still where ranks outnumber processors".)
constexpr std::uint64_t arena_steps_for(int ranks) noexcept {
    return ranks <= 2 ? 32 : ranks <= 8 ? 128 : 8;
}
// Whether an arena of `ranks` ranks keeps a deep queue of step places (32 or more, up to 8
// ranks), where a loop of small rooted calls runs far ahead of its readers (`select` sends
// small broadcasts through the arena there, by the tree where the queue is short).
constexpr bool arena_queue_is_deep(int ranks) noexcept { return arena_steps_for(ranks) >= 32; }
// shm_arena::place takes s modulo the count with a mask, and an even count keeps each rank's
// `arena_line` 128-byte aligned after its places. At least 4: an arrival asks for the place two
// steps on (`shm_arena::prepare_place`), which with 2 would be the place just published.
static_assert(std::has_single_bit(arena_steps_for(1)) && std::has_single_bit(arena_steps_for(3)) &&
              std::has_single_bit(arena_steps_for(9)) && arena_steps_for(9) >= 4);

// A call as a step place records it (`collective_meta` in 24 bytes instead of 32): the call's
// number in the group keeps its low 32 bits, which `expand` completes from the reader's own
// call (the two are the same call, or ranks whose counts differ by far less than 2^32).
struct step_call {
    std::uint8_t collective = 0, redop = 0, dtype = 0, algorithm = 0;
    std::uint32_t root = 0;
    std::uint64_t count = 0;
    std::uint32_t seq_low = 0;
    std::uint32_t history = 0;

    static step_call of(const collective_meta& m) noexcept {
        return {m.collective,
                m.redop,
                m.dtype,
                m.algorithm,
                m.root,
                m.count,
                static_cast<std::uint32_t>(m.seq),
                m.history};
    }
    // The call with its number completed from `near`'s: the nearest number with these low
    // bits.
    collective_meta expand(const collective_meta& near) const noexcept {
        const auto gap = static_cast<std::int32_t>(seq_low - static_cast<std::uint32_t>(near.seq));
        const std::uint64_t seq = near.seq + static_cast<std::uint64_t>(std::int64_t{gap});
        return {collective, redop, dtype, algorithm, root, count, seq, history};
    }
};
static_assert(sizeof(step_call) == 24 && std::is_trivially_copyable_v<step_call>);

// What one rank brings to one step (see `arena_line`): its first cache line holds the counter,
// the call and 32 bytes of data, so that a peer that sees the rank arrive has its call and its
// small data in the same transfer; 64 more lines hold up to 4,064 bytes more.
struct alignas(64) arena_step_line {
    // The last step of this place the rank reached: it reached step s once its place for s
    // (shm_arena::place) shows `arrived >= s`. Only the owner stores it (release, after what
    // the step carries); the others load it (acquire) before they read the rest of the lines.
    std::atomic<std::uint64_t> arrived{0};
    step_call call;  // the call declared with this place's step
    // 16-byte aligned (offset 32), as the widest element type needs.
    alignas(16) std::byte small[32 + 4064];
};
static_assert(sizeof(arena_step_line) == 4160 && offsetof(arena_step_line, small) == 32);

// One rank's lines: one place per step (`arena_steps_for(ranks)` of them, used in turn; see
// shm_arena::place), then this: the collective it runs now, whatever its algorithm, and what
// others need to copy from its memory.
struct alignas(128) arena_line {
    // A sequence lock around `current` (a collective_meta, word by word): odd while its owner
    // writes it. Atomic words with release stores and acquire loads, not fences: TSan does
    // not take fences (g++ -Werror=tsan refuses them).
    alignas(128) std::atomic<std::uint64_t> version{0};
    std::atomic<std::uint64_t> current[4] = {};
    // The owner's process (written once, before the group is ready): where the others copy
    // its offered buffers from (shm_arena::offer).
    std::int64_t pid = 0;
    // The last step at which the owner left a call with an error while its offered buffer may
    // still have been read (shm_arena::withdraw).
    std::atomic<std::uint64_t> withdrawn{0};
    // The word that a rank sleeping until the owner comes waits on (a futex): the owner raises
    // it before each wake (at an arrival or an announced call that finds `sleepers`), so a
    // wait that reaches the kernel after the wake sees the change and does not sleep.
    std::atomic<std::uint32_t> wakes{0};
    // Nonzero once another rank sleeps, or is about to, until the owner's next arrival or
    // call, which clears it and wakes every waiter on `wakes`.
    std::atomic<std::uint32_t> sleepers{0};
    // The last step at which the owner goes on (or went on) without waiting, with its call to
    // compare (shm_arena::will_go_on, arrive_and_go): in a line of its own, which only ranks
    // that go on read, so that its sequentially consistent store finds the line in the owner's
    // cache; stored before the owner writes its step line, which a reader usually holds.
    alignas(64) std::atomic<std::uint64_t> went_on{0};
};
static_assert(sizeof(collective_meta) == 4 * sizeof(std::uint64_t) &&
              std::is_trivially_copyable_v<collective_meta>);
static_assert(sizeof(arena_line) == 128 && sizeof(arena_step_line) % 128 == 64);
static_assert(sizeof(arena_header) <= 128);

}  // namespace detail

/// A process's view of its group's arena (see the top of this file). Owns the mapping. Only
/// the reactor's thread uses it; its collectives run one at a time.
class shm_arena {
public:
    /// Bytes of data a rank's step carries in the line with its counter (`small`): a peer
    /// that sees the rank arrive has them in the same transfer.
    static constexpr std::size_t small_bytes = 32;
    /// Bytes of data a rank's step carries in all (`small`: its lines, which a rank that went
    /// past steps without waiting may write again sooner than the data sets; `settle_lines`).
    static constexpr std::size_t line_bytes = sizeof(detail::arena_step_line::small);
    /// The most cache lines of a later step place that an arrival asks for writing
    /// (`prepare_place`): the counter's line (with 32 bytes of data) and 15 more, 992 bytes.
    /// From about 1 KiB the copy into the lines has stores enough in flight to wait for many
    /// lines at once, and asking for more made no difference (docs/performance.md, "Lines
    /// asked for before they are written").
    static constexpr std::size_t prepared_lines = 16;
    /// The cache lines of a step place that an arrival asks for writing where this rank wrote
    /// `bytes` of data into its lines (`own_small`): the counter's line, which holds the call
    /// and the first `small_bytes`, then one for each 64 bytes more, at most `prepared_lines`.
    static constexpr std::size_t lines_prepared_for(std::size_t bytes) noexcept {
        const std::size_t more = bytes > small_bytes ? (bytes - small_bytes + 63) / 64 : 0;
        return 1 + std::min(more, prepared_lines - 1);
    }

    /// Bytes of one rank's lines in an arena of `ranks` ranks: its step places, then its
    /// `arena_line` (an even count of places keeps that 128-byte aligned).
    static constexpr std::size_t rank_bytes(int ranks) noexcept {
        return places_bytes(ranks) + sizeof(detail::arena_line);
    }
    /// Bytes of one rank's step places in an arena of `ranks` ranks (its `arena_line` follows).
    static constexpr std::size_t places_bytes(int ranks) noexcept {
        return detail::arena_steps_for(ranks) * sizeof(detail::arena_step_line);
    }
    /// Where rank `r`'s lines start in an arena of `ranks` ranks (after the 128-byte header).
    static constexpr std::size_t lines_offset(int ranks, int r) noexcept {
        return 128 + rank_bytes(ranks) * static_cast<std::size_t>(r);
    }
    /// Where the data sets start in an arena of `ranks` ranks.
    static constexpr std::size_t data_offset(int ranks) noexcept {
        return (lines_offset(ranks, ranks) + 4095) & ~std::size_t{4095};
    }
    /// Bytes of an arena of `ranks` ranks whose data sets are `set_bytes` each.
    static constexpr std::size_t bytes_for(int ranks, std::size_t set_bytes) noexcept {
        return data_offset(ranks) + 2 * set_bytes;
    }

    /// Takes over `mapping` (`bytes` long, initialised by its creator) as rank `rank`'s view.
    COROCOLL_DECL shm_arena(void* mapping, std::size_t bytes, int rank);
    shm_arena(const shm_arena&) = delete;
    shm_arena& operator=(const shm_arena&) = delete;
    /// Unmaps the arena. A futex wait of this rank's still in the kernel (`close` was not
    /// awaited) is woken first and left to end on its own (its completion frees it).
    COROCOLL_DECL ~shm_arena();
    /// Ends this rank's futex wait, if one is in the ring (see `sleep_on_futex`): wakes it
    /// until its completion comes (at most about a second). The group's close awaits it.
    COROCOLL_DECL task<> close();

    /// This rank's index in the arena (its rank in the group).
    int rank() const noexcept { return rank_; }
    /// Ranks that share the arena (the group's size).
    int size() const noexcept { return size_; }
    /// Bytes of each data set.
    std::size_t set_bytes() const noexcept { return set_bytes_; }
    /// Bytes of one rank's slot of a data set (set / ranks, whole cache lines).
    std::size_t slot_bytes() const noexcept {
        return set_bytes_ / static_cast<std::size_t>(size_) / 64 * 64;
    }

    /// Whether a call of `bytes` bytes (of the buffer one rank offers) of use `u` copies
    /// straight from the ranks' own buffers (process_vm_readv: one copy, none through the
    /// arena): when every rank found at set-up that it may read every other's memory
    /// (`allow_single_copy`) and `bytes` is at least the group's `single_copy_from(u)` (rank
    /// 0's, derived from `engine_options::shm_arena_single_copy_bytes` and the group's size
    /// by `detail::single_copy_from_for`, kept in the arena, so that every rank decides alike;
    /// 0: never) and below its `single_copy_below(u)` where that is not 0
    /// (`detail::single_copy_below_for`).
    bool single_copy(single_copy_use u, std::size_t bytes) const noexcept {
        return single_copy_allowed_ &&
               in_single_copy_sizes(bytes, single_copy_from(u), single_copy_below(u));
    }
    /// Every rank may read every other's memory (found at set-up): see `single_copy`.
    void allow_single_copy() noexcept { single_copy_allowed_ = true; }
    /// Whether `allow_single_copy` was called: without it no use makes single copies.
    bool single_copy_allowed() const noexcept { return single_copy_allowed_; }
    /// The group's size from which calls of use `u` copy straight between the ranks'
    /// buffers, when allowed (0: never).
    std::size_t single_copy_from(single_copy_use u) const noexcept {
        return single_copy_from_[static_cast<std::size_t>(u)];
    }
    /// The group's size from which calls of use `u` copy through the arena again (0: none).
    std::size_t single_copy_below(single_copy_use u) const noexcept {
        return single_copy_below_[static_cast<std::size_t>(u)];
    }
    /// The L2 of rank 0's cores (bytes, 0: not known), kept in the arena so that every rank
    /// derives the same size thresholds from it.
    std::size_t l2_bytes() const noexcept { return l2_bytes_; }

    /// Offers this rank's buffer `at` of `bytes` bytes with the next step (in its small
    /// buffer): from that step on the others may copy from it (`copy_from`), until this rank
    /// passes a later step that they all reach once done, or withdraws it.
    COROCOLL_DECL void offer(const void* at, std::size_t bytes) noexcept;
    /// Copies `to.size()` bytes at `offset` of the buffer rank `r` offered with step `s`
    /// into `to` (process_vm_readv), then makes sure that `r` did not withdraw it meanwhile;
    /// `backward`: in pieces of `sweep_piece_bytes` from the end (see `next_sweep_backward`).
    /// A failure fails the group through `e`, naming `r` and `what`, and throws it; where `r`
    /// withdrew meanwhile, with the error `r` left with (its abort notice), not `r`'s leaving.
    /// Where this machine's copies are slow at the offset between `to` and r's buffer
    /// (`detail::machine_copy_probe`; the kernel copies as memcpy does), each piece of
    /// `sweep_piece_bytes` lands first at the same place in a page of this rank's own memory
    /// and goes on 64 bytes at a time (`detail::copy_by_lines`): a second copy, of a piece that
    /// is still in the cache.
    COROCOLL_DECL void copy_from(engine& e, const collective_meta& meta, int r, std::uint64_t s,
                                 std::size_t offset, std::span<std::byte> to,
                                 bool backward = false);
    /// Bytes of the pieces in which a backward sweep goes (`copy_from`, `copy_backward`); a
    /// backward `copy_from` makes them larger to have at most 64 (one process_vm_readv), and
    /// above 2 GiB goes forward.
    static constexpr std::size_t sweep_piece_bytes = std::size_t{64} << 10;
    /// Whether this rank's single-copy call goes through its buffers from the end: every
    /// other call does, in the reverse order of the one before (its own block last instead
    /// of first, each block's pieces from the last). A call that reuses the last one's
    /// buffers, with about as many bytes as the core's cache holds, then starts on the lines
    /// the last one touched last, still cached; going forward every time, each call evicts
    /// the lines the next one needs first. Each rank decides alone: nothing to agree on.
    bool next_sweep_backward() noexcept { return backward_ = !backward_; }
    /// memcpy in pieces of `sweep_piece_bytes`, the last piece first.
    static void copy_backward(void* to, const void* from, std::size_t bytes) noexcept {
        for (std::size_t end = bytes; end > 0;) {
            const std::size_t start = end > sweep_piece_bytes ? end - sweep_piece_bytes : 0;
            copy_bytes(static_cast<std::byte*>(to) + start,
                       static_cast<const std::byte*>(from) + start, end - start);
            end = start;
        }
    }
    /// This rank waits next while others copy `bytes` from the buffers offered (`offer`):
    /// the reactor keeps busy polling for about as long as such a copy takes (at 4 GB/s, at
    /// most 1 ms) instead of pausing (see io::reactor::busy_poll_for).
    void expect_copies(engine& e, std::size_t bytes) noexcept {
        e.reactor().busy_poll_for(std::min<std::chrono::nanoseconds>(
            std::chrono::nanoseconds(bytes / 4), std::chrono::milliseconds(1)));
    }
    /// This rank leaves its call with an error: a rank still copying from what it offered
    /// (which may go away now) must not trust the copy. Call it before the error leaves.
    void withdraw() noexcept { line(rank_).withdrawn.store(step_, std::memory_order_seq_cst); }

    /// Whether a step wait that has polled for its busy-poll time sleeps in its ring until the
    /// rank it waits for arrives (an io_uring futex wait, ended by that rank's one FUTEX_WAKE),
    /// where the reactor's kernel has IORING_OP_FUTEX_WAIT (Linux 6.7, probed); otherwise, or
    /// with false, it pauses between looks, longer as the wait goes on (at most 500 µs; see
    /// io::poll_entry). Set from `engine_options::shm_futex_wait`.
    void sleep_on_futex(bool on) noexcept { futex_wanted_ = on; }

    /// Whether rank `r` is known to have reached step `s` (from the last look, else a look at
    /// its line now): a wait of this rank for `r` alone at `s` would not wait. Where this rank
    /// will then read the first `reads` bytes of r's data for the step (`small`), it asks for
    /// the lines they reach beyond the counter's first (at most `prepared_lines` in all), so
    /// that they come with the counter's and not one transfer after it.
    bool arrived(int r, std::uint64_t s, std::size_t reads = 0) noexcept {
        if (reads > small_bytes) ask_lines(r, s, lines_prepared_for(reads));
        return seen_at(r, s);
    }
    /// The step the next `arrive` publishes.
    std::uint64_t next_step() const noexcept { return step_ + 1; }

    /// The data set of step `s`.
    std::byte* set(std::uint64_t s) const noexcept {
        return data_ + static_cast<std::size_t>(s & 1) * set_bytes_;
    }
    /// Rank `r`'s small buffer for step `s` (`line_bytes`).
    std::byte* small(int r, std::uint64_t s) const noexcept { return place(r, s).small; }
    /// This rank's small buffer for its next step, into which it writes `bytes` bytes (at
    /// most `line_bytes`): as many lines of a later place are asked for writing when it
    /// arrives (`publish_arrival`), so that a loop of such calls finds its lines ready.
    std::byte* own_small(std::size_t bytes) noexcept {
        small_written_ = bytes;
        return small(rank_, next_step());
    }
    /// What rank `r` declared with step `s` (see `declare`), its call's number completed from
    /// `mine` (`step_call::expand`).
    collective_meta meta(int r, std::uint64_t s, const collective_meta& mine) const noexcept {
        return place(r, s).call.expand(mine);
    }
    /// Declares this rank's call with the next step; the ranks compare it when they meet
    /// there (`arrive` with `check`).
    void declare(const collective_meta& m) noexcept {
        place(rank_, next_step()).call = detail::step_call::of(m);
    }

    /// Says which collective this rank runs now, whatever its algorithm (every collective of
    /// a group with an arena does, as it begins): a rank that waits at a step for a rank in
    /// another collective of the same number finds the mismatch there, though no message
    /// passes between them.
    COROCOLL_DECL void announce(const collective_meta& m) noexcept;
    /// What rank `r` announced last, when it was not rewriting it at that moment.
    COROCOLL_DECL bool announced(int r, collective_meta& out) const noexcept;

    class step_wait;

    /// Publishes this rank's arrival at the next step; awaiting the result waits until every
    /// rank is there (only rank `only`, when given: then the rest of the wait is left to
    /// `settle`), within `deadline`, and throws the group's failure if it failed meanwhile (a
    /// peer gone, a deadline past, calls that differ). With `check`, the declared calls of the
    /// ranks waited for must be `meta` (see `declare`).
    COROCOLL_DECL step_wait arrive(engine& e, const collective_meta& meta,
                                   std::chrono::steady_clock::time_point deadline,
                                   bool check = false, int only = -1);

    /// Publishes this rank's arrival at the next step and goes on without waiting: a rank
    /// that only wrote for the step (a broadcast's root) may run ahead. Whatever it does next
    /// in the arena starts with `settle_lines` (its lines) or `settle` (a data set, an offer).
    /// With `check`, the calls of the ranks that also go on at this step are compared now
    /// (of two such ranks, one sees the other; see `will_go_on`); the ranks that wait for this
    /// one compare theirs with its call as they wait, and a full `settle` compares once more:
    /// a mismatch fails the group through `e`.
    COROCOLL_DECL void arrive_and_go(engine& e, const collective_meta& meta, bool check = false);
    /// Says that this rank will go past the next step without waiting, with `check` (see
    /// `arrive_and_go`), before it writes its lines for the step: the ranks that also go on
    /// there compare calls with it now. `arrive_and_go` does the same where it was not said;
    /// said first, its sequentially consistent store does not wait for the step line, which
    /// a reader of the last call's data may hold (a loop of small broadcasts: each call).
    /// A mismatch fails the group through `e`.
    COROCOLL_DECL void will_go_on(engine& e, const collective_meta& meta);

    /// Waits for every rank at the steps this rank went past without waiting for all
    /// (`arrive_and_go`, `arrive` for one rank), if any, as `arrive` would have: every write
    /// into a data set, and every `offer`, comes after it.
    COROCOLL_DECL step_wait settle(engine& e, std::chrono::steady_clock::time_point deadline);
    /// Whether `settle_lines` has nothing to wait for: every rank is known to be at the step
    /// after the last that used the place this rank writes next (or the look at the ranks'
    /// lines shows it). A caller that checks first spares building a step wait for nothing.
    COROCOLL_DECL bool lines_settled() noexcept;
    /// Waits, if needed, until this rank may write its lines for the next step (`declare`,
    /// `small`): for every rank at the step after the one that last used the same place
    /// (as many steps back as the arena has places per rank). A rank that only goes past steps does
    /// not wait at all until it is that far ahead. `meta` is the call about to begin: what a wait
    /// that runs out names, and what it compares with the calls the ranks it waits for announced.
    COROCOLL_DECL step_wait settle_lines(engine& e, const collective_meta& meta,
                                         std::chrono::steady_clock::time_point deadline);

    /// The step is complete when every rank has arrived at it; waits in the reactor.
    class step_wait : io::poll_entry {
    public:
        /// A wait of `a`'s rank at `step` (made by `arrive` and `settle`).
        step_wait(shm_arena& a, engine& e, const collective_meta& meta, std::uint64_t step,
                  std::chrono::steady_clock::time_point deadline, bool check, int only) noexcept
            : a_(a),
              e_(e),
              meta_(meta),
              step_(step),
              deadline_(deadline),
              check_(check),
              only_(only) {}
        step_wait(const step_wait&) = delete;
        step_wait& operator=(const step_wait&) = delete;
        step_wait(step_wait&&) = delete;

        bool await_ready() noexcept {
            // Ranks that run in step usually arrive within a few hundred nanoseconds of each
            // other: a few looks first spare a suspension (deadline, watch, resume). Not where
            // ranks outnumber processors: the rank looked for may be waiting for this one's.
            if (complete()) return true;
            if (io::reactor::crowded()) return false;
            for (int i = 0; i < quick_looks; ++i) {
                relax();
                if (complete()) return true;
            }
            return false;
        }
        /// How many times a step wait looks again before it suspends (see `await_ready`).
        static constexpr int quick_looks = 64;
        /// How long after a step wait goes to sleep on a fresh futex wait it looks again
        /// anyway: an arrival at that very moment can go unseen by both ranks (see
        /// `shm_arena::wake_sleepers`).
        static constexpr std::chrono::milliseconds nap{1};
        COROCOLL_DECL void await_suspend(std::coroutine_handle<> h);
        COROCOLL_DECL void await_resume();

    private:
        // A pause between looks at shared memory (x86's PAUSE, ARM's YIELD).
        static void relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#elif defined(__aarch64__)
            asm volatile("yield");
#endif
        }
        // Whether every rank has reached the step (from the first not seen yet) or the
        // group failed.
        COROCOLL_DECL bool complete() noexcept;
        COROCOLL_DECL void finish() noexcept;
        // Lists the ranks not arrived yet in the arena's `missing_` (the engine's view).
        COROCOLL_DECL void list_missing() noexcept;
        // Fails the group if a rank not arrived yet announced another collective of this
        // number (`announce`).
        COROCOLL_DECL void look_for_other_calls() noexcept;
        static bool poll_fn(io::poll_entry& e) noexcept;
        // The reactor is about to sleep: a futex wait until the first rank not there yet
        // arrives (false: the step is complete meanwhile, or no wait can be set up now).
        static bool prepare_sleep_fn(io::poll_entry& e) noexcept;
        static void on_deadline(io::timer_entry& t) noexcept;

        struct deadline_hook : io::timer_entry {
            step_wait* w = nullptr;
        };

        shm_arena& a_;
        engine& e_;
        const collective_meta& meta_;
        std::uint64_t step_;
        std::chrono::steady_clock::time_point deadline_;
        bool check_;
        int only_;
        int seen_ = 0;  // ranks below this one (in order, skipping ours) have arrived
        int listed_from_ = 0;
        std::uint32_t polls_ = 0;
        std::coroutine_handle<> handle_;
        deadline_hook timer_;
        io::timer_entry nap_;
    };

private:
    // A futex wait in the ring. On the heap: where the arena goes while the kernel still holds
    // it, `self` becomes null and its completion frees it.
    struct futex_op : io::detail::io_op {
        shm_arena* self = nullptr;
    };
    static void prepare_futex(io::detail::io_op* op, io_uring* ring) noexcept;
    static void complete_futex(io::detail::io_op* op, int res) noexcept;
    // Stores this rank's arrival at `step_` (release: after what the step carries), asks for
    // the lines of its place two steps on for writing (as many as this step wrote: see
    // `prepare_place`) and wakes the ranks asleep until it came. The order is fixed, not a
    // parameter: g++ 12 compiles a store whose order is only known at run time to the sequentially
    // consistent one (a locked exchange on x86, which waits for the line to come back from the
    // reader's cache).
    COROCOLL_DECL void publish_arrival() noexcept;
    // Asks for the first lines of this rank's place for step `s` for writing: its counter's
    // line and those that `small_written_` bytes of data fill, at most `prepared_lines`. The
    // place held step s - steps_, which the others read (the ranks that met there, or readers
    // that went on); without this the rank's first store to it waits for the line to come
    // back, and every store after it waits behind that one (core/prefetch.hpp). Two steps on,
    // not one: a rank that waits for this one's next arrival looks at the next place
    // meanwhile, and would take the line straight back. A reader far behind (settle_lines
    // lets it be steps_ - 1 back) may still be reading the place: the hint changes no data,
    // and costs at most a line's transfer each way.
    COROCOLL_DECL void prepare_place(std::uint64_t s) noexcept;
    // Stores `went_on` for step `s` and compares this rank's call with those of the ranks
    // that go on there too (see `will_go_on`).
    COROCOLL_DECL void compare_going_on(engine& e, const collective_meta& meta, std::uint64_t s);
    // Wakes the ranks asleep until this one comes, if any: raises `wakes`, then FUTEX_WAKE.
    COROCOLL_DECL void wake_sleepers() noexcept;
    // Whether step waits may sleep on a futex on `r`'s reactor (see `sleep_on_futex`).
    bool futex_usable(io::reactor& r) const noexcept {
        return futex_wanted_ && !futex_refused_ && r.features().futex_wait;
    }
    // Sets up a futex wait on `r`'s reactor until rank `m` reaches step `s` (see
    // `step_wait::prepare_sleep_fn`); `fresh`: a new one (not one still in the ring).
    COROCOLL_DECL bool prepare_futex_sleep(io::reactor& r, int m, std::uint64_t s,
                                           bool& fresh) noexcept;

    // Rank `r`'s lines start here (`lines_offset`, from `rank_bytes_`): its places, then its
    // `arena_line`, the last of its `rank_bytes`.
    std::byte* lines_of(int r) const noexcept {
        return base_ + 128 + static_cast<std::size_t>(r) * rank_bytes_;
    }
    detail::arena_line& line(int r) const noexcept {
        return *reinterpret_cast<detail::arena_line*>(lines_of(r) + rank_bytes_ -
                                                      sizeof(detail::arena_line));
    }
    // Rank `r`'s place for step `s`.
    detail::arena_step_line& place(int r, std::uint64_t s) const noexcept {
        return reinterpret_cast<detail::arena_step_line*>(lines_of(r))[s & (steps_ - 1)];
    }
    // Whether rank `r` has reached step `s`.
    bool reached(int r, std::uint64_t s, std::memory_order o) const noexcept {
        return place(r, s).arrived.load(o) >= s;
    }
    // Asks for the lines of rank `r`'s place for step `s` after the counter's, up to `lines`
    // in all, for reading (a hint).
    void ask_lines(int r, std::uint64_t s, std::size_t lines) const noexcept {
        const auto* p = reinterpret_cast<const char*>(&place(r, s));
        for (std::size_t i = 1; i < lines; ++i) __builtin_prefetch(p + i * 64, 0, 3);
    }
    // Whether rank `r` has reached step `s`, as a step wait asks: from the last step this rank
    // saw `r` reach, if that is as far, without a look at r's line (which r may be writing).
    // `latest`: a later step to look at first (its place, then s's): one that r has likely
    // reached shows it past a few steps to come, and the next few asks need no look at all.
    // Out of line, so that every look at a counter is one of two instructions wherever it is
    // asked from: inlined into the calls that run at once, a 2-rank gather of 16 B took
    // 0.17-0.20 µs a call instead of 0.10-0.11 in some builds (its root's looks, a place
    // apart each call, missed in full; docs/performance.md, "Lines asked for with the
    // counter's").
    [[gnu::noinline]] bool seen_at(int r, std::uint64_t s, std::uint64_t latest = 0) noexcept {
        std::uint64_t& seen = seen_steps_[static_cast<std::size_t>(r)];
        if (seen >= s) return true;
        if (latest > s) {
            seen = std::max(seen, place(r, latest).arrived.load(std::memory_order_acquire));
            if (seen >= s) return true;
        }
        seen = std::max(seen, place(r, s).arrived.load(std::memory_order_acquire));
        return seen >= s;
    }

    std::byte* base_;
    std::size_t bytes_;
    int rank_;
    int size_;
    // Places per rank (`detail::arena_steps_for(size_)`) and bytes of a rank's lines.
    std::uint64_t steps_;
    std::size_t rank_bytes_;
    std::size_t set_bytes_;
    std::byte* data_;
    std::uint64_t step_;
    // The last step this rank went past without waiting for every rank (0: none), and what
    // `settle` checks there.
    std::uint64_t pending_ = 0;
    // The last step every rank is known to have reached.
    std::uint64_t confirmed_ = 0;
    bool pending_check_ = false;
    collective_meta pending_meta_{};
    // For each rank, the last step this rank saw it reach (`seen_at`): an acquire look at
    // that rank's counter showed it, so what it wrote before is visible here.
    std::vector<std::uint64_t> seen_steps_;
    // The ranks a suspended step still waits for (what a status answer lists); sized once.
    std::vector<int> missing_;
    std::size_t single_copy_from_[single_copy_uses] = {};
    std::size_t single_copy_below_[single_copy_uses] = {};
    std::size_t l2_bytes_ = 0;
    bool single_copy_allowed_ = false;
    bool backward_ = false;
    // Where `copy_from` lands a piece first when the kernel's copy would sit at a slow offset
    // (core/copy.hpp): `sweep_piece_bytes` and two pages, made at the first such copy.
    std::unique_ptr<std::byte[]> bounce_;
    // Bytes of data this rank wrote into its lines for its next step (`own_small`).
    std::size_t small_written_ = 0;
    // This rank's `wakes`, raised by `wake_sleepers`.
    std::uint32_t wakes_ = 0;
    // The futex wait (see `sleep_on_futex`): made at the first sleep; armed while in the ring,
    // on `futex_word_` (rank `m`'s `wakes`) while it holds `futex_expected_`.
    std::unique_ptr<futex_op> futex_;
    io::reactor* futex_reactor_ = nullptr;
    std::atomic<std::uint32_t>* futex_word_ = nullptr;
    std::uint32_t futex_expected_ = 0;
    bool futex_armed_ = false;
    bool futex_wanted_ = true;
    bool futex_refused_ = false;  // the kernel refused one for this mapping
};

}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/shm/impl/arena.ipp>
#endif
