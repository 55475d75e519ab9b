#pragma once

// The channel to a peer on the same host: two single-producer/single-consumer byte rings in
// a shared segment (one per direction), and a kept unix socket between the two ranks that
// carries nothing but wake-ups and, by its end, the news that the peer is gone.
//
// The segment's layout and records are in segment.hpp.
//
//
// Waiting belongs to the reactor: a receive or send that cannot go on watches a
// `poll_entry`, which the loop polls at every turn. When the loop has polled without progress
// for its busy-poll time it may sleep: the entry then raises its side's `asleep` flag, and a
// peer that writes to or frees room in a ring looks at that flag after its own store (a
// full fence on both sides, so one of them sees the other) and, only if it is raised, makes
// one system call to wake it. Where membarrier(2) allows, the writer's side has no fence: the
// sleeper, between raising its flag and its last look, has the kernel run a barrier on the
// writer's processor instead (io/membarrier.hpp), and the writer goes on while the lines of
// its message are still on their way. Where the kernel has io_uring's FUTEX_WAIT (Linux 6.7), the
// sleeper keeps a futex wait on its `asleep` word in flight in its ring and the peer's call
// is a FUTEX_WAKE; elsewhere (or with `engine_options::shm_futex_wait` off) the call sends one
// byte on the socket, which completes the receive the sleeper's ring keeps in flight on it.
//
// The socket's end is the peer's end: a rank killed by SIGKILL closes it, its pending
// receive completes with 0, and the stream ends after what the rings already hold, exactly
// like a TCP connection's.

#include <corocoll/core/error.hpp>
#include <corocoll/core/event_loop.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/io/membarrier.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/transport/channel.hpp>
#include <corocoll/transport/frame.hpp>
#include <corocoll/transport/shm/segment.hpp>
#include <corocoll/version.hpp>

#include <liburing.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iterator>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <utility>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// A channel through a shared segment (see the top of this file). Owns the mapping and the
/// socket; `side` 0 is the rank that created the segment. Only the reactor's thread uses it.
class shm_channel final : public channel {
public:
    /// Takes over `mapping` (`map_bytes` long, already initialised by the creator) and the
    /// connected unix socket `fd`, and starts watching the socket for the peer's end.
    /// Payloads of at least `single_copy_bytes` go as single copies where the peer may read
    /// this process's memory (0: never). With `futex_wait`, a sleep waits on an io_uring futex
    /// wait where the reactor's kernel has it (else on the socket). With
    /// `publish_without_fence`, this side runs a barrier on the peer's processor before it
    /// sleeps, and publishes without a fence once the peer does the same (where membarrier(2)
    /// allows: engine_options::shm_publish_without_fence).
    shm_channel(io::reactor& r, int side, void* mapping, std::size_t map_bytes, int fd,
                std::size_t single_copy_bytes = 0, bool futex_wait = true,
                bool publish_without_fence = true);
    COROCOLL_DECL ~shm_channel() override;

    const char* kind() const noexcept override { return "shm"; }
    bool keeps_framing() const noexcept override { return true; }
    std::string address() const override { return "shm"; }

    COROCOLL_DECL std::size_t try_recv(std::span<std::byte> out,
                                       bool /*may_call_kernel*/) noexcept override;

    bool worth_holding(std::uint64_t bytes) noexcept override { return bytes >= hold_bytes; }
    /// Payloads from this size on are held for their receive (`worth_holding`): buffering an
    /// early message costs a copy and an allocation that holding it saves. A stream of 1-2 KiB
    /// messages that runs ahead of its receives (a 2-rank scatter of 2-4 KiB, a broadcast of
    /// 1-2 KiB) went 10-35% faster held than buffered near (docs/performance.md, "Early messages
    /// held from 1 KiB"); below it, a message fits a small record and its copy costs little.
    static constexpr std::size_t hold_bytes = std::size_t{1} << 10;

    COROCOLL_DECL bool await_readable(std::coroutine_handle<> h) noexcept override;
    COROCOLL_DECL void kick_reader() noexcept override;

    COROCOLL_DECL task<std::size_t> recv_some(std::span<std::byte> out, io::op_options o) override;

    COROCOLL_DECL task<> recv(std::span<std::byte> out, io::op_options o) override;

    COROCOLL_DECL std::size_t try_send(std::span<iovec> iov) noexcept override;

    COROCOLL_DECL task<> send(std::span<iovec> iov, io::op_options o) override;

    COROCOLL_DECL void send_now(std::span<iovec> iov) noexcept override;

    COROCOLL_DECL void leave_last_words(std::span<iovec> iov) noexcept override;
    COROCOLL_DECL std::string last_words() const override;

    COROCOLL_DECL void shutdown() noexcept override;

    COROCOLL_DECL task<> close() override;

    /// False after `close`.
    bool is_open() const noexcept override { return fd_ >= 0; }

    /// How this side sleeps: "futex" (an io_uring futex wait, woken by FUTEX_WAKE) or
    /// "socket" (a receive on the pair's socket, woken by a byte).
    const char* sleeps_on() const noexcept { return use_futex_ ? "futex" : "socket"; }

    /// Whether this side publishes without a fence: it and the peer both run a barrier on the
    /// other's processor before they sleep. Known once the peer's side has started (false
    /// until then: every publish is a full fence).
    bool publishes_without_fence() noexcept {
        if (!no_fence_ && fences_before_sleep_) {
            no_fence_ = seg_->fences_before_sleep[1 - side_].load(std::memory_order_acquire) != 0;
        }
        return no_fence_;
    }

private:
    // ---- the rings ----

    std::size_t room() noexcept;

    void copy_in(const void* from, std::size_t n) noexcept;

    void copy_out(void* to, std::size_t n) noexcept;

    // Starts a record of `kind` at the tail (on a line), its stamp left for `seal_record`.
    std::uint64_t begin_record(detail::shm_record::kind_t kind, std::uint64_t length) noexcept;
    // Ends the record that `begin_record` started at `start`: the tail moves to the next line,
    // and the stamp makes the record the reader's (not yet published: see `publish`).
    void seal_record(std::uint64_t start) noexcept;
    // What the stamp of a record at stream position `at` is.
    std::uint64_t stamp_for(std::uint64_t at) const noexcept { return at ^ nonce_; }
    // Whether a record is stamped at the reader's head.
    bool record_here() noexcept;

    // Writes what fits of `n` bytes as one inline record (not yet published); returns how many.
    std::size_t put_inline(const std::byte* from, std::size_t n) noexcept;

    static constexpr std::size_t small_record_bytes = 1024;
    static_assert(small_record_bytes == detail::shm_compact_most + sizeof(frame_header));

    // A larger payload goes in records of at most this many bytes, each published as soon as
    // it is written, and the reader frees room after as many: so the writer copies one piece
    // in while the reader copies the one before out. (With the whole ring as one record, a
    // 1 MiB message was copied in, then out, one after the other.)
    static constexpr std::size_t stream_piece_bytes = std::size_t{64} << 10;

    // Writes all of `iov` (`total` bytes) as one inline record (a compact one for a small
    // point-to-point frame), or nothing when it does not fit now.
    bool put_gathered(std::span<iovec> iov, std::size_t total) noexcept;

    // Writes a single-copy record for `v` and publishes it; false when there is no room yet.
    bool put_remote(const iovec& v) noexcept;

    void publish() noexcept;

    // Stores `value` in a counter the peer reads (our ring's tail, or the head of theirs), then
    // wakes the peer if it sleeps: with a full fence between the two, or, where both sides
    // fence before they sleep, with only the compiler's order (see `wake_peer_if_asleep`).
    void store_then_wake(std::atomic<std::uint64_t>& counter, std::uint64_t value) noexcept;

    // Makes what the reader has consumed room for the writer (stores the head, wakes the peer
    // if it sleeps).
    void free_room() noexcept;

    // Starts the next record if one is here; false when none is.
    bool next_record() noexcept;

    void end_record() noexcept;

    // Copies up to `n` bytes of the current single copy out of the writer's memory.
    std::size_t copy_remote(std::byte* to, std::size_t n) noexcept;

    void throw_copy_error() const;

    // Whether `bytes` go as a single copy. The peer's probe may end after the channel has
    // started (it says so through the segment): until then everything goes inline.
    bool single_copy(std::size_t bytes) noexcept;

    bool readable() noexcept;
    // `readable` for a side about to sleep: through the tail, whose store and this load are
    // sequentially consistent (see `wake_peer_if_asleep`).
    bool readable_by_tail() noexcept;

    bool copy_finished() noexcept {
        return seg_->copied[side_].value.load(std::memory_order_seq_cst) >= copies_sent_;
    }

    // A writer waits for room, or for its single copy to be finished.
    bool writer_ready() noexcept { return awaiting_copy_ ? copy_finished() : room() > 64; }

    // Waits until the peer has copied the payload of the last single copy out of our memory.
    task<> single_copy_done(io::op_options o);

    // After a store the peer may wait for. That store and this look at the flag are
    // sequentially consistent, as are the sleeper's raising of the flag and its last look at
    // the rings: one of the two sides sees the other's store. (Fences would say the same, but
    // TSan does not model them; on x86 a seq_cst store costs what a fence does, and waits for
    // every line the message was written to.) Where both sides fence before they sleep, the
    // store is a plain release and only the compiler keeps this look after it: the sleeper's
    // barrier on our processor, between its flag and its look, stands for the fence.
    void wake_peer_if_asleep() noexcept;

    // ---- waiting ----

    // One receive or send waiting for the rings (or the end, a deadline, a stop): resumed
    // through the reactor's queue, never from inside the loop's poll.
    struct wait : corocoll::detail::work_item {
        shm_channel& ch;
        bool for_room;
        const io::op_options& o;
        std::coroutine_handle<> handle;
        /// The wait's deadline, armed on the reactor's timer heap.
        struct deadline_hook : io::timer_entry {
            /// The wait the deadline ends.
            wait* w = nullptr;
        } timer;
        std::error_code error;
        /// Ends the wait with `operation_canceled` when its stop token fires.
        struct on_stop {
            /// The wait to end.
            wait* w;
            /// Ends the wait.
            void operator()() const noexcept { w->ch.finish(*w, std::errc::operation_canceled); }
        };
        std::optional<std::stop_callback<on_stop>> stopping;

        wait(shm_channel& c, bool room, const io::op_options& opts) noexcept
            : ch(c), for_room(room), o(opts) {}

        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<> h);
        void await_resume();
    };

    // Ends `w`'s wait (with `error`, or none: the rings have news). Idempotent.
    void finish(wait& w, std::error_code error = {}) noexcept;
    void finish(wait& w, std::errc e) noexcept { finish(w, std::make_error_code(e)); }

    // Ends `w`'s wait (already taken from its slot) with news from the rings, resuming it now.
    void resume_now(wait* w) noexcept;

    struct entry : io::poll_entry {
        shm_channel* self = nullptr;
    };

    static bool poll_entry_fn(io::poll_entry& e) noexcept;

    static bool prepare_sleep_fn(io::poll_entry& e) noexcept;

    static void end_sleep_fn(io::poll_entry& e) noexcept;

    // The receive kept in flight on the socket: wake-up bytes, then its end.
    struct watch_op : io::detail::io_op {
        shm_channel* self = nullptr;
    };
    static void prepare_watch(io::detail::io_op* op, io_uring* ring) noexcept;
    static void complete_watch(io::detail::io_op* op, int res) noexcept;

    // The futex wait on our `asleep` word, in flight from a sleep until a FUTEX_WAKE (or a
    // sleep that another completion ended: it stays for the next one).
    static void prepare_futex(io::detail::io_op* op, io_uring* ring) noexcept;
    static void complete_futex(io::detail::io_op* op, int res) noexcept;

    // Whether an operation of ours is still in the kernel (its memory must stay).
    bool in_kernel() const noexcept { return watching_ || futex_armed_; }
    void resume_closer() noexcept {
        if (!in_kernel() && close_waiter_) std::exchange(close_waiter_, {}).resume();
    }

    struct closed_awaiter {
        shm_channel& c;
        bool await_ready() const noexcept { return !c.in_kernel(); }
        void await_suspend(std::coroutine_handle<> h) noexcept { c.close_waiter_ = h; }
        void await_resume() const noexcept {}
    };

    void release() noexcept;

    io::reactor& reactor_;
    int side_;
    detail::shm_segment* seg_;
    std::size_t map_bytes_;
    int fd_;
    std::uint64_t mask_;
    std::byte* out_;
    std::byte* in_;
    // Process-local copies: our own counters, and the last values read of the peer's.
    std::uint64_t out_tail_ = 0;
    std::uint64_t out_head_ = 0;
    std::uint64_t in_head_ = 0;
    std::uint64_t nonce_ = 1;
    // The record being read: its kind, bytes left, where the next one starts, for a compact
    // one its header rebuilt (and how much of it is still to hand out), and for a single copy
    // where the rest is in the writer's memory and its number.
    std::uint32_t in_kind_ = 0;
    std::uint64_t in_left_ = 0;
    std::uint64_t in_next_ = 0;
    frame_header expanded_{};
    std::size_t expanded_left_ = 0;
    std::uint64_t in_address_ = 0;
    std::uint64_t in_number_ = 0;
    std::error_code copy_error_;
    std::size_t single_copy_wanted_ = 0;
    bool peer_reads_us_ = false;
    int peer_pid_ = 0;
    std::uint64_t copies_sent_ = 0;
    bool awaiting_copy_ = false;
    wait* reader_ = nullptr;
    wait* writer_ = nullptr;
    // The engine's reader waiting for bytes through `await_readable` (no deadline, no stop
    // token: `kick_reader` or the channel's end resumes it), and whether it was kicked.
    std::coroutine_handle<> idle_reader_;
    bool kicked_ = false;
    entry entry_;
    watch_op watch_op_;
    char sink_[64]{};
    bool watching_ = false;
    watch_op futex_op_;
    bool use_futex_ = false;
    bool futex_armed_ = false;
    // This side runs a barrier on the peer's processor before it sleeps; both sides do (known
    // once the peer's flag was seen).
    bool fences_before_sleep_ = false;
    bool no_fence_ = false;
    bool shut_ = false;
    bool peer_ended_ = false;
    std::coroutine_handle<> close_waiter_;
};

}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/shm/impl/channel.ipp>
#include <corocoll/transport/shm/impl/channel_wait.ipp>
#endif
