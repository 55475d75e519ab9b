#pragma once

// The channel to a peer on the same host: two single-producer/single-consumer byte rings in
// a shared segment (one per direction), and a kept unix socket between the two ranks that
// carries nothing but wake-ups and, by its end, the news that the peer is gone.
//
// Each ring is a power-of-two array of bytes with two running counters, each on a cache line
// of its own: `tail` (bytes the producer has written; only it stores) and `head` (bytes the
// consumer has taken; only it stores). Frames go in as the bytes of the stream, header
// inline, in records that start on cache lines, so a small message is one copy in and one
// copy out, and a large one flows through the ring in pieces as the consumer frees room (a
// pipelined copy). A record's first word is its stamp, which the producer stores last: the
// consumer polls the stamp where the next record will start, not the tail, so a message that
// fits in one line reaches it in one cache line's transfer instead of three. A point-to-point
// frame that goes as one small record (up to 1 KiB with its header) and whose header is plain
// goes compact, its header's zero fields left out (24 bytes instead of 64): one line up to 24
// bytes of payload, a line less above. Each side
// keeps its own counter and the last value it read of the other's in process-local memory,
// so that the shared lines move between the caches only when there is news.
//
// Waiting belongs to the reactor: a receive or send that cannot go on watches a
// `poll_entry`, which the loop polls at every turn. When the loop has polled without progress
// for its busy-poll time it may sleep: the entry then raises its side's `asleep` flag, and a
// peer that writes to or frees room in a ring looks at that flag after its own store (a
// full fence on both sides, so one of them sees the other) and, only if it is raised, makes
// one system call to wake it. Where the kernel has io_uring's FUTEX_WAIT (Linux 6.7), the
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
#include <corocoll/io/reactor.hpp>
#include <corocoll/transport/channel.hpp>
#include <corocoll/transport/frame.hpp>
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

namespace detail {

/// "CCSHMSEG": the first word of a segment.
inline constexpr std::uint64_t shm_magic = 0x474553484d534343ull;

// The start of a shared segment; the two rings' bytes follow at `shm_segment::data_offset`.
// Lock-free atomics are address-free, so both processes may map it anywhere.
struct shm_segment {
    std::uint64_t magic = shm_magic;
    std::uint64_t probe = 0;       // the creator's nonce: proves that both map this memory
    std::uint64_t ring_bytes = 0;  // bytes of each ring (a power of two)
    struct alignas(64) flag {
        std::atomic<std::uint32_t> value{0};
    };
    // Side s's reactor may be asleep: the other side wakes it after news for it.
    flag asleep[2];
    struct alignas(64) counter {
        std::atomic<std::uint64_t> value{0};
    };
    // Ring s carries side s's bytes to the other side: its tail (written by side s) and its
    // head (written by the other), each on a line of its own.
    counter tail[2];
    counter head[2];
    // Single copies from side s's memory that the other side has finished, and the number of
    // the one side s gave up waiting for (its buffer may be gone: the copy is void).
    counter copied[2];
    counter withdrawn[2];
    // What side s said last (a header and a text), for the other side to read after the end.
    std::atomic<std::uint32_t> last_words_length[2] = {0, 0};
    char last_words[2][64 + 4096];
    // Whether side s may read the other side's memory (process_vm_readv, probed at set-up).
    std::atomic<std::uint32_t> can_read_peer[2] = {0, 0};
    // Whether side s sleeps on a futex wait on `asleep[s]` (wake it with FUTEX_WAKE) rather
    // than on the socket (wake it with a byte).
    std::atomic<std::uint32_t> futex_sleeper[2] = {0, 0};
    std::int32_t pid[2] = {0, 0};

    static constexpr std::size_t data_offset = 16384;
    static std::size_t bytes_for(std::size_t ring_bytes) noexcept {
        return data_offset + 2 * ring_bytes;
    }
    std::byte* ring_data(int s) noexcept;
};
static_assert(sizeof(shm_segment) <= shm_segment::data_offset);

// What a ring carries: records that start on 64-byte lines, each a 16-byte head, then, for
// `inline_bytes`, `length` bytes of the stream; for `single_copy`, a descriptor of `length`
// bytes of the stream that the reader copies straight out of the writer's memory; for
// `compact`, a point-to-point frame's header without its zero fields (`shm_compact`), then
// its payload (`length` counts the 64 bytes of the whole header too). The head's first word,
// the stamp, is stored last (release): the record's place in the stream, mixed with the
// segment's nonce (`stamp_for`), so that nothing an earlier lap left there looks like it.
struct shm_record {
    enum kind_t : std::uint32_t { inline_bytes = 1, single_copy = 2, compact = 3 };
    std::uint64_t stamp = 0;
    std::uint64_t kind_length = 0;  // the kind in the top 8 bits, the length below

    static std::uint64_t pack(kind_t k, std::uint64_t length) noexcept {
        return (std::uint64_t{k} << 56) | length;
    }
    std::uint32_t kind() const noexcept { return static_cast<std::uint32_t>(kind_length >> 56); }
    std::uint64_t length() const noexcept { return kind_length & ((std::uint64_t{1} << 56) - 1); }
};
// A point-to-point frame's header as a compact record carries it (frame_header's other fields
// are what a default header has: no checksum on shared memory).
struct shm_compact {
    std::uint8_t kind = 0;
    std::uint8_t flags = 0;
    std::uint16_t reserved = 0;
    std::uint32_t src = 0;
    std::uint32_t dst = 0;
    std::uint32_t reserved2 = 0;
    std::int64_t tag = 0;
};
inline constexpr std::size_t shm_line = 64;
// Payload bytes a compact record carries within one line.
inline constexpr std::size_t shm_compact_payload = shm_line - 16 - sizeof(shm_compact);
// Payload bytes of the largest compact record: a frame that goes as one small record
// (shm_channel::small_record_bytes, with its 64-byte header).
inline constexpr std::size_t shm_compact_most = 1024 - 64;
struct shm_remote {
    std::uint64_t address = 0;
    std::uint64_t number = 0;  // the writer's count of single copies, this one included
};
static_assert(sizeof(shm_record) == 16 && sizeof(shm_remote) == 16 && sizeof(shm_compact) == 24);
inline constexpr std::size_t pad_line(std::size_t n) noexcept {
    return (n + shm_line - 1) & ~(shm_line - 1);
}
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

}  // namespace detail

/// A channel through a shared segment (see the top of this file). Owns the mapping and the
/// socket; `side` 0 is the rank that created the segment. Only the reactor's thread uses it.
class shm_channel final : public channel {
public:
    /// Takes over `mapping` (`map_bytes` long, already initialised by the creator) and the
    /// connected unix socket `fd`, and starts watching the socket for the peer's end.
    /// Payloads of at least `single_copy_bytes` go as single copies where the peer may read
    /// this process's memory (0: never). With `futex_wait`, a sleep waits on an io_uring futex
    /// wait where the reactor's kernel has it (else on the socket).
    shm_channel(io::reactor& r, int side, void* mapping, std::size_t map_bytes, int fd,
                std::size_t single_copy_bytes = 0, bool futex_wait = true);
    COROCOLL_DECL ~shm_channel() override;

    const char* kind() const noexcept override { return "shm"; }
    bool keeps_framing() const noexcept override { return true; }
    std::string address() const override { return "shm"; }

    COROCOLL_DECL std::size_t try_recv(std::span<std::byte> out,
                                       bool /*may_call_kernel*/) noexcept override;

    bool worth_holding(std::uint64_t bytes) noexcept override { return bytes >= hold_bytes; }
    /// Payloads from this size on are held for their receive (`worth_holding`). Buffering an
    /// early message cost 15-45 µs per broadcast of 8-31 KiB (2 ranks) against 1-2 µs held;
    /// below 4 KiB a held message would keep the ones behind it waiting for little gain.
    static constexpr std::size_t hold_bytes = std::size_t{4} << 10;

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
    // 1 MiB message was copied in, then out, one after the other: a broadcast of 1 MiB on
    // 2 ranks took 172-226 µs, now 62.)
    static constexpr std::size_t stream_piece_bytes = std::size_t{64} << 10;

    // Writes all of `iov` (`total` bytes) as one inline record (a compact one for a small
    // point-to-point frame), or nothing when it does not fit now.
    bool put_gathered(std::span<iovec> iov, std::size_t total) noexcept;

    // Writes a single-copy record for `v` and publishes it; false when there is no room yet.
    bool put_remote(const iovec& v) noexcept;

    void publish() noexcept;

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
    // TSan does not model them; on x86 a seq_cst store costs what a fence does.)
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
    bool shut_ = false;
    bool peer_ended_ = false;
    std::coroutine_handle<> close_waiter_;
};

}  // namespace transport

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace transport {
namespace detail {

COROCOLL_DECL std::byte* shm_segment::ring_data(int s) noexcept {
    return reinterpret_cast<std::byte*>(this) + data_offset +
           static_cast<std::size_t>(s) * ring_bytes;
}

}  // namespace detail
}  // namespace transport

namespace transport {

COROCOLL_DECL shm_channel::shm_channel(io::reactor& r, int side, void* mapping,
                                       std::size_t map_bytes, int fd, std::size_t single_copy_bytes,
                                       bool futex_wait)
    : reactor_(r),
      side_(side),
      seg_(static_cast<detail::shm_segment*>(mapping)),
      map_bytes_(map_bytes),
      fd_(fd),
      mask_(seg_->ring_bytes - 1),
      out_(seg_->ring_data(side)),
      in_(seg_->ring_data(1 - side)) {
    out_tail_ = seg_->tail[side_].value.load(std::memory_order_relaxed);
    out_head_ = seg_->head[side_].value.load(std::memory_order_relaxed);
    in_head_ = seg_->head[1 - side_].value.load(std::memory_order_relaxed);
    nonce_ = seg_->probe | 1;
    single_copy_wanted_ = single_copy_bytes;
    peer_pid_ = seg_->pid[1 - side_];
    entry_.self = this;
    entry_.poll = &poll_entry_fn;
    entry_.prepare_sleep = &prepare_sleep_fn;
    entry_.end_sleep = &end_sleep_fn;
    watch_op_.self = this;
    watch_op_.prepare_ = &prepare_watch;
    watch_op_.complete_ = &complete_watch;
    futex_op_.self = this;
    futex_op_.prepare_ = &prepare_futex;
    futex_op_.complete_ = &complete_futex;
    use_futex_ = futex_wait && reactor_.features().futex_wait;
    seg_->futex_sleeper[side_].store(use_futex_ ? 1 : 0, std::memory_order_seq_cst);
    watching_ = true;
    reactor_.submit(watch_op_);
}

COROCOLL_DECL shm_channel::~shm_channel() {
    // close() was not awaited: the socket's receive (or the futex wait) may still be in the
    // kernel, and it would write into (or wait on) freed memory.
    if (in_kernel()) std::terminate();
    release();
}

COROCOLL_DECL std::size_t shm_channel::try_recv(std::span<std::byte> out,
                                                bool /*may_call_kernel*/) noexcept {
    std::size_t got = 0, freed = 0;
    while (got < out.size()) {
        if (in_left_ == 0 && !next_record()) break;
        std::size_t n = std::min<std::uint64_t>(in_left_, out.size() - got);
        if (in_kind_ == detail::shm_record::single_copy) {
            // Never after other bytes: what lands in a staging buffer should be small.
            if (got > 0) break;
            n = copy_remote(out.data(), n);
            if (n == 0) break;  // failed: recv reports it
        } else if (expanded_left_ > 0) {
            n = std::min(n, expanded_left_);
            std::memcpy(
                out.data() + got,
                reinterpret_cast<const std::byte*>(&expanded_) + sizeof(expanded_) - expanded_left_,
                n);
            expanded_left_ -= n;
        } else {
            copy_out(out.data() + got, n);
            in_head_ += n;
        }
        got += n;
        in_left_ -= n;
        if (in_left_ == 0) end_record();
        if (got - freed >= stream_piece_bytes) {  // the writer's next piece, while this goes on
            free_room();
            freed = got;
        }
    }
    if (got > freed) free_room();
    return got;
}

COROCOLL_DECL bool shm_channel::await_readable(std::coroutine_handle<> h) noexcept {
    if (shut_ || peer_ended_ || kicked_ || readable()) {
        kicked_ = false;
        return false;
    }
    idle_reader_ = h;
    reactor_.watch(entry_);
    return true;
}

COROCOLL_DECL void shm_channel::kick_reader() noexcept {
    kicked_ = true;
    if (idle_reader_) reactor_.watch(entry_);
}

COROCOLL_DECL task<std::size_t> shm_channel::recv_some(std::span<std::byte> out, io::op_options o) {
    for (;;) {
        if (std::size_t n = try_recv(out, false); n > 0 || out.empty()) co_return n;
        throw_copy_error();
        if (shut_ || peer_ended_) co_return 0;
        co_await wait{*this, false, o};
    }
}

COROCOLL_DECL task<> shm_channel::recv(std::span<std::byte> out, io::op_options o) {
    while (!out.empty()) {
        std::size_t n = try_recv(out, false);
        if (n == 0) {
            throw_copy_error();
            if (shut_ || peer_ended_) {
                corocoll::detail::throw_error(corocoll::errc::connection_closed,
                                              "corocoll: recv from shm: the peer is gone");
            }
            co_await wait{*this, false, o};
        }
        out = out.subspan(n);
    }
}

COROCOLL_DECL std::size_t shm_channel::try_send(std::span<iovec> iov) noexcept {
    if (shut_ || peer_ended_) return 0;
    // A small message (header and payload) goes as one record: the fewer cache lines it
    // spans, the sooner the reader has it.
    if (iov.size() > 1) {
        std::size_t total = detail::iov_bytes(iov);
        if (total <= small_record_bytes && put_gathered(iov, total)) {
            publish();
            return total;
        }
    }
    std::size_t sent = 0, published = 0;
    for (const iovec& v : iov) {
        // A payload for a single copy goes through `send`, which waits for the copy.
        if (single_copy(v.iov_len)) break;
        const auto* from = static_cast<const std::byte*>(v.iov_base);
        std::size_t left = v.iov_len;
        while (left > 0) {
            std::size_t n = put_inline(from, left);
            if (n == 0) break;
            from += n;
            left -= n;
            sent += n;
            if (left > 0) {  // more pieces of this payload follow: the reader starts on this one
                publish();
                published = sent;
            }
        }
        if (left > 0) break;
    }
    if (sent > published) publish();
    return sent;
}

COROCOLL_DECL task<> shm_channel::send(std::span<iovec> iov, io::op_options o) {
    iovec rest_space[4];
    if (iov.size() > std::size(rest_space)) {
        throw std::invalid_argument("corocoll: shm send: more than 4 buffers at once");
    }
    std::span<iovec> rest = iov;
    for (;;) {
        std::size_t n = try_send(rest);
        if (n == detail::iov_bytes(rest)) co_return;
        rest = detail::iov_after(rest, n, rest_space);
        if (shut_ || peer_ended_) {
            corocoll::detail::throw_error(std::make_error_code(std::errc::broken_pipe),
                                          "corocoll: send to shm: the peer is gone");
        }
        if (single_copy(rest[0].iov_len) && put_remote(rest[0])) {
            co_await single_copy_done(o);
            rest = rest.subspan(1);
            if (rest.empty()) co_return;
            continue;
        }
        co_await wait{*this, true, o};
    }
}

COROCOLL_DECL void shm_channel::send_now(std::span<iovec> iov) noexcept {
    if (shut_ || peer_ended_) return;
    if (put_gathered(iov, detail::iov_bytes(iov))) publish();
}

COROCOLL_DECL void shm_channel::leave_last_words(std::span<iovec> iov) noexcept {
    auto& area = seg_->last_words[side_];
    std::size_t n = 0;
    for (const iovec& v : iov) {
        std::size_t k = std::min(v.iov_len, sizeof(area) - n);
        std::memcpy(area + n, v.iov_base, k);
        n += k;
    }
    seg_->last_words_length[side_].store(static_cast<std::uint32_t>(n), std::memory_order_release);
}

COROCOLL_DECL std::string shm_channel::last_words() const {
    std::uint32_t n = seg_->last_words_length[1 - side_].load(std::memory_order_acquire);
    const auto& area = seg_->last_words[1 - side_];
    return std::string(area, std::min<std::size_t>(n, sizeof(area)));
}

COROCOLL_DECL void shm_channel::shutdown() noexcept {
    if (shut_) return;
    shut_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    // Whoever waits here sees the end at the next turn of the loop.
    if (reader_ != nullptr || writer_ != nullptr || idle_reader_) reactor_.watch(entry_);
}

COROCOLL_DECL task<> shm_channel::close() {
    shutdown();
    if (futex_armed_) {
        if (reactor_.withdraw(futex_op_)) {
            futex_armed_ = false;  // it never reached the kernel
        } else {
            // Our own wake ends our own wait.
            seg_->asleep[side_].value.store(0, std::memory_order_seq_cst);
            io::futex_wake(seg_->asleep[side_].value, 1);
        }
    }
    // The socket's receive ends with the shutdown, the futex wait with the wake; their
    // memory is ours until they have.
    if (in_kernel()) co_await closed_awaiter{*this};
    release();
}

COROCOLL_DECL std::size_t shm_channel::room() noexcept {
    out_head_ = seg_->head[side_].value.load(std::memory_order_seq_cst);
    return seg_->ring_bytes - (out_tail_ - out_head_);
}

COROCOLL_DECL void shm_channel::copy_in(const void* from, std::size_t n) noexcept {
    const auto* src = static_cast<const std::byte*>(from);
    std::size_t at = out_tail_ & mask_;
    std::size_t first = std::min<std::size_t>(n, seg_->ring_bytes - at);
    std::memcpy(out_ + at, src, first);
    if (first < n) std::memcpy(out_, src + first, n - first);
    out_tail_ += n;
}

COROCOLL_DECL void shm_channel::copy_out(void* to, std::size_t n) noexcept {
    auto* dst = static_cast<std::byte*>(to);
    std::size_t at = in_head_ & mask_;
    std::size_t first = std::min<std::size_t>(n, seg_->ring_bytes - at);
    std::memcpy(dst, in_ + at, first);
    if (first < n) std::memcpy(dst + first, in_, n - first);
}

COROCOLL_DECL std::uint64_t shm_channel::begin_record(detail::shm_record::kind_t kind,
                                                      std::uint64_t length) noexcept {
    const std::uint64_t start = out_tail_;
    out_tail_ += sizeof(std::uint64_t);  // the stamp, stored last
    const std::uint64_t kind_length = detail::shm_record::pack(kind, length);
    copy_in(&kind_length, sizeof(kind_length));
    return start;
}

COROCOLL_DECL void shm_channel::seal_record(std::uint64_t start) noexcept {
    out_tail_ = start + detail::pad_line(out_tail_ - start);
    auto* word = reinterpret_cast<std::uint64_t*>(out_ + (start & mask_));
    std::atomic_ref<std::uint64_t>(*word).store(stamp_for(start), std::memory_order_release);
}

COROCOLL_DECL bool shm_channel::record_here() noexcept {
    auto* word = reinterpret_cast<std::uint64_t*>(in_ + (in_head_ & mask_));
    return std::atomic_ref<std::uint64_t>(*word).load(std::memory_order_acquire) ==
           stamp_for(in_head_);
}

COROCOLL_DECL std::size_t shm_channel::put_inline(const std::byte* from, std::size_t n) noexcept {
    if (n == 0) return 0;
    n = std::min(n, stream_piece_bytes);
    constexpr std::size_t head = sizeof(detail::shm_record);
    auto usable = [](std::size_t room) { return room & ~(detail::shm_line - 1); };
    std::size_t free = usable(seg_->ring_bytes - (out_tail_ - out_head_));
    if (free < detail::pad_line(head + n)) free = usable(room());
    if (free < detail::shm_line) return 0;
    std::size_t take = std::min(n, free - head);
    const std::uint64_t start = begin_record(detail::shm_record::inline_bytes, take);
    copy_in(from, take);
    seal_record(start);
    return take;
}

COROCOLL_DECL bool shm_channel::put_gathered(std::span<iovec> iov, std::size_t total) noexcept {
    constexpr std::size_t head = sizeof(detail::shm_record);
    // A small point-to-point frame with a plain header goes compact (one line up to
    // shm_compact_payload bytes of payload).
    frame_header h;
    bool compact = iov.size() >= 1 && iov[0].iov_len == sizeof(h) &&
                   total - sizeof(h) <= detail::shm_compact_most;
    if (compact) {
        std::memcpy(&h, iov[0].iov_base, sizeof(h));
        frame_header plain;
        plain.kind = frame_kind::p2p;
        plain.flags = h.flags;
        plain.src = h.src;
        plain.dst = h.dst;
        plain.tag = h.tag;
        plain.length = total - sizeof(h);
        compact = std::memcmp(&plain, &h, sizeof(h)) == 0;
    }
    std::size_t need = detail::pad_line(
        head + (compact ? sizeof(detail::shm_compact) + total - sizeof(h) : total));
    if (seg_->ring_bytes - (out_tail_ - out_head_) < need && room() < need) return false;
    if (compact) {
        const std::uint64_t start = begin_record(detail::shm_record::compact, total);
        detail::shm_compact c;
        c.kind = static_cast<std::uint8_t>(h.kind);
        c.flags = h.flags;
        c.src = h.src;
        c.dst = h.dst;
        c.tag = h.tag;
        copy_in(&c, sizeof(c));
        for (const iovec& v : iov.subspan(1)) copy_in(v.iov_base, v.iov_len);
        seal_record(start);
        return true;
    }
    const std::uint64_t start = begin_record(detail::shm_record::inline_bytes, total);
    for (const iovec& v : iov) copy_in(v.iov_base, v.iov_len);
    seal_record(start);
    return true;
}

COROCOLL_DECL bool shm_channel::put_remote(const iovec& v) noexcept {
    if (room() < detail::shm_line) return false;
    detail::shm_remote where{reinterpret_cast<std::uintptr_t>(v.iov_base), ++copies_sent_};
    const std::uint64_t start = begin_record(detail::shm_record::single_copy, v.iov_len);
    copy_in(&where, sizeof(where));
    seal_record(start);
    publish();
    return true;
}

COROCOLL_DECL void shm_channel::publish() noexcept {
    seg_->tail[side_].value.store(out_tail_, std::memory_order_seq_cst);
    wake_peer_if_asleep();
}

COROCOLL_DECL void shm_channel::free_room() noexcept {
    seg_->head[1 - side_].value.store(in_head_, std::memory_order_seq_cst);
    wake_peer_if_asleep();
}

COROCOLL_DECL bool shm_channel::next_record() noexcept {
    if (!record_here()) return false;
    const std::uint64_t start = in_head_;
    detail::shm_record rec;
    copy_out(&rec, sizeof(rec));
    in_head_ += sizeof(rec);
    in_kind_ = rec.kind();
    in_left_ = rec.length();
    std::uint64_t body = in_left_;
    if (in_kind_ == detail::shm_record::single_copy) {
        detail::shm_remote where;
        copy_out(&where, sizeof(where));
        in_head_ += sizeof(where);
        in_address_ = where.address;
        in_number_ = where.number;
        body = sizeof(where);
    } else if (in_kind_ == detail::shm_record::compact) {
        detail::shm_compact c;
        copy_out(&c, sizeof(c));
        in_head_ += sizeof(c);
        expanded_ = frame_header{};
        expanded_.kind = static_cast<frame_kind>(c.kind);
        expanded_.flags = c.flags;
        expanded_.src = c.src;
        expanded_.dst = c.dst;
        expanded_.tag = c.tag;
        expanded_.length = in_left_ - sizeof(frame_header);
        expanded_left_ = sizeof(frame_header);
        body = sizeof(c) + expanded_.length;
    }
    in_next_ = start + detail::pad_line(sizeof(rec) + body);
    return true;
}

COROCOLL_DECL void shm_channel::end_record() noexcept {
    if (in_kind_ == detail::shm_record::single_copy) {
        // The writer gave up on this copy (and may have freed its buffer) before we were
        // done: what was copied cannot be trusted.
        if (seg_->withdrawn[1 - side_].value.load(std::memory_order_seq_cst) >= in_number_) {
            copy_error_ = std::make_error_code(std::errc::connection_aborted);
        }
        seg_->copied[1 - side_].value.store(in_number_, std::memory_order_seq_cst);
    }
    in_head_ = in_next_;
}

COROCOLL_DECL std::size_t shm_channel::copy_remote(std::byte* to, std::size_t n) noexcept {
    iovec local{to, n};
    iovec remote{reinterpret_cast<void*>(in_address_), n};
    ssize_t got = ::process_vm_readv(peer_pid_, &local, 1, &remote, 1, 0);
    if (got <= 0) {
        // ESRCH: the writer's process is gone (killed) while its payload was being read.
        copy_error_ = got < 0 && errno == ESRCH
                          ? make_error_code(corocoll::errc::connection_closed)
                          : std::error_code(got < 0 ? errno : EIO, std::system_category());
        return 0;
    }
    in_address_ += static_cast<std::uint64_t>(got);
    return static_cast<std::size_t>(got);
}

COROCOLL_DECL void shm_channel::throw_copy_error() const {
    if (copy_error_) {
        corocoll::detail::throw_error(copy_error_,
                                      "corocoll: recv from shm: copying from the peer");
    }
}

COROCOLL_DECL bool shm_channel::single_copy(std::size_t bytes) noexcept {
    if (single_copy_wanted_ == 0 || bytes < single_copy_wanted_) return false;
    if (!peer_reads_us_) {
        peer_reads_us_ = seg_->can_read_peer[1 - side_].load(std::memory_order_acquire) != 0;
    }
    return peer_reads_us_;
}

COROCOLL_DECL bool shm_channel::readable() noexcept { return in_left_ > 0 || record_here(); }

COROCOLL_DECL bool shm_channel::readable_by_tail() noexcept {
    return in_left_ > 0 || seg_->tail[1 - side_].value.load(std::memory_order_seq_cst) != in_head_;
}

COROCOLL_DECL task<> shm_channel::single_copy_done(io::op_options o) {
    awaiting_copy_ = true;
    try {
        while (!copy_finished()) {
            if (shut_ || peer_ended_) {
                corocoll::detail::throw_error(std::make_error_code(std::errc::broken_pipe),
                                              "corocoll: send to shm: the peer is gone");
            }
            co_await wait{*this, true, o};
        }
    } catch (...) {
        // The buffer may go away now: the peer must not trust a copy it finishes later.
        seg_->withdrawn[side_].value.store(copies_sent_, std::memory_order_seq_cst);
        awaiting_copy_ = false;
        throw;
    }
    awaiting_copy_ = false;
}

COROCOLL_DECL void shm_channel::wake_peer_if_asleep() noexcept {
    auto& flag = seg_->asleep[1 - side_].value;
    if (flag.load(std::memory_order_seq_cst) == 0) return;
    if (flag.exchange(0, std::memory_order_acq_rel) == 0) return;
    if (seg_->futex_sleeper[1 - side_].load(std::memory_order_relaxed) != 0) {
        io::futex_wake(flag, 1);
        return;
    }
    char byte = 1;
    // A full socket buffer means wake-ups are already queued; the peer needs just one.
    [[maybe_unused]] auto n = ::send(fd_, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

COROCOLL_DECL void shm_channel::wait::await_suspend(std::coroutine_handle<> h) {
    handle = h;
    run_ = [](corocoll::detail::work_item* item) noexcept {
        static_cast<wait*>(item)->handle.resume();
    };
    (for_room ? ch.writer_ : ch.reader_) = this;
    ch.reactor_.watch(ch.entry_);
    if (o.deadline != io::op_options::time_point::max()) {
        timer.when = o.deadline;
        timer.w = this;
        timer.fire = [](io::timer_entry& t) noexcept {
            wait* w = static_cast<deadline_hook&>(t).w;
            w->ch.finish(*w, std::errc::timed_out);
        };
        ch.reactor_.arm(timer);
    }
    if (o.stop.stop_possible()) stopping.emplace(o.stop, on_stop{this});
}

COROCOLL_DECL void shm_channel::wait::await_resume() {
    stopping.reset();
    if (error) {
        corocoll::detail::throw_error(
            error, std::string("corocoll: ") + (for_room ? "send to" : "recv from") + " shm");
    }
}

COROCOLL_DECL void shm_channel::finish(wait& w, std::error_code error) noexcept {
    wait*& slot = w.for_room ? writer_ : reader_;
    if (slot != &w) return;
    slot = nullptr;
    reactor_.disarm(w.timer);
    w.error = error;
    reactor_.post(w);
}

COROCOLL_DECL void shm_channel::resume_now(wait* w) noexcept {
    reactor_.disarm(w->timer);
    w->handle.resume();
}

COROCOLL_DECL bool shm_channel::poll_entry_fn(io::poll_entry& e) noexcept {
    shm_channel& c = *static_cast<entry&>(e).self;
    bool progress = false;
    bool over = c.shut_ || c.peer_ended_;
    // Resumed right here rather than through the queue: a turn of the loop less per
    // message. What it does to the watched entries is safe during the walk (see
    // `poll_entry`).
    if (c.idle_reader_ && (over || c.kicked_ || c.readable())) {
        c.kicked_ = false;
        std::exchange(c.idle_reader_, {}).resume();
        progress = true;
    }
    if (c.reader_ != nullptr && (over || c.readable())) {
        c.resume_now(std::exchange(c.reader_, nullptr));
        progress = true;
    }
    if (c.writer_ != nullptr && (over || c.writer_ready())) {
        c.resume_now(std::exchange(c.writer_, nullptr));
        progress = true;
    }
    if (c.reader_ == nullptr && c.writer_ == nullptr && !c.idle_reader_) c.reactor_.unwatch(e);
    return progress;
}

COROCOLL_DECL bool shm_channel::prepare_sleep_fn(io::poll_entry& e) noexcept {
    shm_channel& c = *static_cast<entry&>(e).self;
    if (!c.watching_) return false;  // nothing would end the sleep
    auto& flag = c.seg_->asleep[c.side_].value;
    flag.store(1, std::memory_order_seq_cst);
    if (((c.reader_ != nullptr || c.idle_reader_) && c.readable_by_tail()) ||
        (c.writer_ != nullptr && c.writer_ready()) || c.shut_ || c.peer_ended_ || c.kicked_) {
        flag.store(0, std::memory_order_relaxed);
        return false;
    }
    if (c.use_futex_) {
        // Waits while the flag is 1: a wake that came first (the peer cleared it) makes the
        // wait end at once. One in flight serves every later sleep until it completes.
        if (!c.futex_armed_) {
            c.futex_armed_ = true;
            c.reactor_.submit(c.futex_op_);
        }
        c.reactor_.note_futex_sleep();
    }
    return true;
}

COROCOLL_DECL void shm_channel::end_sleep_fn(io::poll_entry& e) noexcept {
    shm_channel& c = *static_cast<entry&>(e).self;
    c.seg_->asleep[c.side_].value.store(0, std::memory_order_relaxed);
}

COROCOLL_DECL void shm_channel::prepare_watch(io::detail::io_op* op, io_uring* ring) noexcept {
    shm_channel* c = static_cast<watch_op*>(op)->self;
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    io_uring_prep_recv(sqe, c->fd_, c->sink_, sizeof(c->sink_), 0);
    io_uring_sqe_set_data(sqe, op);
}

COROCOLL_DECL void shm_channel::complete_watch(io::detail::io_op* op, int res) noexcept {
    shm_channel* c = static_cast<watch_op*>(op)->self;
    // -ECANCELED while open: the thread that submitted the receive ended (the kernel
    // cancels a thread's requests when it exits; threads may take turns driving a
    // reactor, see `io::reactor::borrowed`), not the peer.
    if ((res > 0 || res == -ECANCELED) && !c->shut_) {
        c->reactor_.submit(c->watch_op_);
        return;
    }
    if (res != -EINTR && res != -EAGAIN) {
        c->watching_ = false;
        if (!c->shut_) c->peer_ended_ = true;
        if (c->reader_ != nullptr || c->writer_ != nullptr || c->idle_reader_) {
            c->reactor_.watch(c->entry_);
        }
        c->resume_closer();
        return;
    }
    c->reactor_.submit(c->watch_op_);
}

COROCOLL_DECL void shm_channel::prepare_futex(io::detail::io_op* op, io_uring* ring) noexcept {
    shm_channel* c = static_cast<watch_op*>(op)->self;
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    io::detail::prep_futex_wait(sqe, c->seg_->asleep[c->side_].value, 1);
    io_uring_sqe_set_data(sqe, op);
}

COROCOLL_DECL void shm_channel::complete_futex(io::detail::io_op* op, int res) noexcept {
    shm_channel* c = static_cast<watch_op*>(op)->self;
    c->futex_armed_ = false;
    if (res == -EINVAL || res == -EOPNOTSUPP || res == -ENOSYS) {
        // Probed, yet refused (a kernel that forbids it for this mapping): the socket it is.
        c->use_futex_ = false;
        c->seg_->futex_sleeper[c->side_].store(0, std::memory_order_seq_cst);
    }
    c->resume_closer();
}

COROCOLL_DECL void shm_channel::release() noexcept {
    if (seg_ != nullptr) ::munmap(seg_, map_bytes_);
    seg_ = nullptr;
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}

}  // namespace transport

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
