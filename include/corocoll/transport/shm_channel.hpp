#pragma once

// The channel to a peer on the same host: two single-producer/single-consumer byte rings in
// a shared segment (one per direction), and a kept unix socket between the two ranks that
// carries nothing but wake-ups and, by its end, the news that the peer is gone.
//
// Each ring is a power-of-two array of bytes with two running counters, each on a cache line
// of its own: `tail` (bytes the producer has written; only it stores) and `head` (bytes the
// consumer has taken; only it stores). Frames go in as the bytes of the stream, header
// inline, so a small message is one copy in and one copy out, and a large one flows through
// the ring in pieces as the consumer frees room (a pipelined copy). Each side keeps its own
// counter and the last value it read of the other's in process-local memory, so that the
// shared lines move between the caches only when there is news.
//
// Waiting belongs to the reactor: a receive or send that cannot go on watches a
// `poll_entry`, which the loop polls at every turn. When the loop has polled without progress
// for its busy-poll time it may sleep: the entry then raises its side's `asleep` flag, and a
// peer that writes to or frees room in a ring looks at that flag after its own store (a
// full fence on both sides, so one of them sees the other) and, only if it is raised, sends
// one byte on the socket. The byte completes the receive the sleeper's ring keeps in flight
// on that socket, which ends its sleep.
//
// The socket's end is the peer's end: a rank killed by SIGKILL closes it, its pending
// receive completes with 0, and the stream ends after what the rings already hold, exactly
// like a TCP connection's.

#include <corocoll/core/error.hpp>
#include <corocoll/core/event_loop.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/transport/channel.hpp>
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
#include <iterator>
#include <exception>
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

    static constexpr std::size_t data_offset = 1024;
    static std::size_t bytes_for(std::size_t ring_bytes) noexcept {
        return data_offset + 2 * ring_bytes;
    }
    std::byte* ring_data(int s) noexcept {
        return reinterpret_cast<std::byte*>(this) + data_offset +
               static_cast<std::size_t>(s) * ring_bytes;
    }
};
static_assert(sizeof(shm_segment) <= shm_segment::data_offset);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

}  // namespace detail

/// A channel through a shared segment (see the top of this file). Owns the mapping and the
/// socket; `side` 0 is the rank that created the segment. Only the reactor's thread uses it.
class shm_channel final : public channel {
public:
    /// Takes over `mapping` (`map_bytes` long, already initialised by the creator) and the
    /// connected unix socket `fd`, and starts watching the socket for the peer's end.
    shm_channel(io::reactor& r, int side, void* mapping, std::size_t map_bytes, int fd)
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
        in_tail_ = in_head_;
        entry_.self = this;
        entry_.poll = &poll_entry_fn;
        entry_.prepare_sleep = &prepare_sleep_fn;
        entry_.end_sleep = &end_sleep_fn;
        watch_op_.self = this;
        watch_op_.prepare_ = &prepare_watch;
        watch_op_.complete_ = &complete_watch;
        watching_ = true;
        reactor_.submit(watch_op_);
    }
    ~shm_channel() override {
        // close() was not awaited: the socket's receive may still be in the kernel, and it
        // would write into freed memory.
        if (watching_) std::terminate();
        release();
    }

    const char* kind() const noexcept override { return "shm"; }
    std::string address() const override { return "shm"; }

    std::size_t try_recv(std::span<std::byte> out, bool /*may_call_kernel*/) noexcept override {
        if (in_tail_ == in_head_) {
            in_tail_ = seg_->tail[1 - side_].value.load(std::memory_order_acquire);
            if (in_tail_ == in_head_) return 0;
        }
        std::size_t n = std::min<std::uint64_t>(in_tail_ - in_head_, out.size());
        copy_out(out.data(), n);
        in_head_ += n;
        seg_->head[1 - side_].value.store(in_head_, std::memory_order_release);
        wake_peer_if_asleep();
        return n;
    }

    task<std::size_t> recv_some(std::span<std::byte> out, io::op_options o) override {
        for (;;) {
            if (std::size_t n = try_recv(out, false); n > 0 || out.empty()) co_return n;
            if (shut_ || peer_ended_) co_return 0;
            co_await wait{*this, false, o};
        }
    }

    task<> recv(std::span<std::byte> out, io::op_options o) override {
        while (!out.empty()) {
            std::size_t n = try_recv(out, false);
            if (n == 0) {
                if (shut_ || peer_ended_) {
                    corocoll::detail::throw_error(corocoll::errc::connection_closed,
                                                  "corocoll: recv from shm: the peer is gone");
                }
                co_await wait{*this, false, o};
            }
            out = out.subspan(n);
        }
    }

    std::size_t try_send(std::span<iovec> iov) noexcept override {
        if (shut_ || peer_ended_) return 0;
        std::size_t want = detail::iov_bytes(iov);
        std::size_t room = seg_->ring_bytes - (out_tail_ - out_head_);
        if (room < want) {
            out_head_ = seg_->head[side_].value.load(std::memory_order_acquire);
            room = seg_->ring_bytes - (out_tail_ - out_head_);
        }
        std::size_t sent = 0;
        for (const iovec& v : iov) {
            std::size_t n = std::min(v.iov_len, room - sent);
            copy_in(static_cast<const std::byte*>(v.iov_base), n);
            sent += n;
            if (n < v.iov_len) break;
        }
        if (sent == 0) return 0;
        seg_->tail[side_].value.store(out_tail_, std::memory_order_release);
        wake_peer_if_asleep();
        return sent;
    }

    task<> send(std::span<iovec> iov, io::op_options o) override {
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
            co_await wait{*this, true, o};
        }
    }

    void send_now(std::span<iovec> iov) noexcept override {
        if (shut_ || peer_ended_) return;
        out_head_ = seg_->head[side_].value.load(std::memory_order_acquire);
        if (seg_->ring_bytes - (out_tail_ - out_head_) < detail::iov_bytes(iov)) return;
        try_send(iov);
    }

    void shutdown() noexcept override {
        if (shut_) return;
        shut_ = true;
        ::shutdown(fd_, SHUT_RDWR);
        // Whoever waits here sees the end at the next turn of the loop.
        if (reader_ != nullptr || writer_ != nullptr) reactor_.watch(entry_);
    }

    task<> close() override {
        shutdown();
        // The socket's receive ends with the shutdown; its memory is ours until it has.
        if (watching_) co_await closed_awaiter{*this};
        release();
    }

    bool is_open() const noexcept override { return fd_ >= 0; }

private:
    // ---- the rings ----

    void copy_in(const std::byte* from, std::size_t n) noexcept {
        std::size_t at = out_tail_ & mask_;
        std::size_t first = std::min<std::size_t>(n, seg_->ring_bytes - at);
        std::memcpy(out_ + at, from, first);
        if (first < n) std::memcpy(out_, from + first, n - first);
        out_tail_ += n;
    }

    void copy_out(std::byte* to, std::size_t n) noexcept {
        std::size_t at = in_head_ & mask_;
        std::size_t first = std::min<std::size_t>(n, seg_->ring_bytes - at);
        std::memcpy(to, in_ + at, first);
        if (first < n) std::memcpy(to + first, in_, n - first);
    }

    bool readable() noexcept {
        if (in_tail_ != in_head_) return true;
        in_tail_ = seg_->tail[1 - side_].value.load(std::memory_order_acquire);
        return in_tail_ != in_head_;
    }

    bool has_room() noexcept {
        out_head_ = seg_->head[side_].value.load(std::memory_order_acquire);
        return out_tail_ - out_head_ < seg_->ring_bytes;
    }

    // After a store the peer may wait for: the fence orders it before the look at the flag,
    // as the sleeper's fence orders its flag before its last look at the rings.
    void wake_peer_if_asleep() noexcept {
        std::atomic_thread_fence(std::memory_order_seq_cst);
        auto& flag = seg_->asleep[1 - side_].value;
        if (flag.load(std::memory_order_relaxed) == 0) return;
        if (flag.exchange(0, std::memory_order_acq_rel) == 0) return;
        char byte = 1;
        // A full socket buffer means wake-ups are already queued; the peer needs just one.
        [[maybe_unused]] auto n = ::send(fd_, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    }

    // ---- waiting ----

    // One receive or send waiting for the rings (or the end, a deadline, a stop): resumed
    // through the reactor's queue, never from inside the loop's poll.
    struct wait : corocoll::detail::work_item {
        shm_channel& ch;
        bool for_room;
        const io::op_options& o;
        std::coroutine_handle<> handle;
        struct deadline_hook : io::timer_entry {
            wait* w = nullptr;
        } timer;
        std::error_code error;
        struct on_stop {
            wait* w;
            void operator()() const noexcept { w->ch.finish(*w, std::errc::operation_canceled); }
        };
        std::optional<std::stop_callback<on_stop>> stopping;

        wait(shm_channel& c, bool room, const io::op_options& opts) noexcept
            : ch(c), for_room(room), o(opts) {}

        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<> h) {
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
        void await_resume() {
            stopping.reset();
            if (error) {
                corocoll::detail::throw_error(error, std::string("corocoll: ") +
                                                         (for_room ? "send to" : "recv from") +
                                                         " shm");
            }
        }
    };

    // Ends `w`'s wait (with `error`, or none: the rings have news). Idempotent.
    void finish(wait& w, std::error_code error = {}) noexcept {
        wait*& slot = w.for_room ? writer_ : reader_;
        if (slot != &w) return;
        slot = nullptr;
        reactor_.disarm(w.timer);
        w.error = error;
        reactor_.post(w);
    }
    void finish(wait& w, std::errc e) noexcept { finish(w, std::make_error_code(e)); }

    struct entry : io::poll_entry {
        shm_channel* self = nullptr;
    };

    static bool poll_entry_fn(io::poll_entry& e) noexcept {
        shm_channel& c = *static_cast<entry&>(e).self;
        bool progress = false;
        bool over = c.shut_ || c.peer_ended_;
        if (c.reader_ != nullptr && (over || c.readable())) {
            c.finish(*c.reader_);
            progress = true;
        }
        if (c.writer_ != nullptr && (over || c.has_room())) {
            c.finish(*c.writer_);
            progress = true;
        }
        if (c.reader_ == nullptr && c.writer_ == nullptr) c.reactor_.unwatch(e);
        return progress;
    }

    static bool prepare_sleep_fn(io::poll_entry& e) noexcept {
        shm_channel& c = *static_cast<entry&>(e).self;
        if (!c.watching_) return false;  // nothing would end the sleep
        auto& flag = c.seg_->asleep[c.side_].value;
        flag.store(1, std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if ((c.reader_ != nullptr && c.readable()) || (c.writer_ != nullptr && c.has_room()) ||
            c.shut_ || c.peer_ended_) {
            flag.store(0, std::memory_order_relaxed);
            return false;
        }
        return true;
    }

    static void end_sleep_fn(io::poll_entry& e) noexcept {
        shm_channel& c = *static_cast<entry&>(e).self;
        c.seg_->asleep[c.side_].value.store(0, std::memory_order_relaxed);
    }

    // The receive kept in flight on the socket: wake-up bytes, then its end.
    struct watch_op : io::detail::io_op {
        shm_channel* self = nullptr;
    };
    static void prepare_watch(io::detail::io_op* op, io_uring* ring) noexcept {
        shm_channel* c = static_cast<watch_op*>(op)->self;
        io_uring_sqe* sqe = io_uring_get_sqe(ring);
        io_uring_prep_recv(sqe, c->fd_, c->sink_, sizeof(c->sink_), 0);
        io_uring_sqe_set_data(sqe, op);
    }
    static void complete_watch(io::detail::io_op* op, int res) noexcept {
        shm_channel* c = static_cast<watch_op*>(op)->self;
        if (res > 0 && !c->shut_) {
            c->reactor_.submit(c->watch_op_);
            return;
        }
        if (res != -EINTR && res != -EAGAIN) {
            c->watching_ = false;
            if (!c->shut_) c->peer_ended_ = true;
            if (c->reader_ != nullptr || c->writer_ != nullptr) c->reactor_.watch(c->entry_);
            if (c->close_waiter_) std::exchange(c->close_waiter_, {}).resume();
            return;
        }
        c->reactor_.submit(c->watch_op_);
    }

    struct closed_awaiter {
        shm_channel& c;
        bool await_ready() const noexcept { return !c.watching_; }
        void await_suspend(std::coroutine_handle<> h) noexcept { c.close_waiter_ = h; }
        void await_resume() const noexcept {}
    };

    void release() noexcept {
        if (seg_ != nullptr) ::munmap(seg_, map_bytes_);
        seg_ = nullptr;
        if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    }

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
    std::uint64_t in_tail_ = 0;
    wait* reader_ = nullptr;
    wait* writer_ = nullptr;
    entry entry_;
    watch_op watch_op_;
    char sink_[64]{};
    bool watching_ = false;
    bool shut_ = false;
    bool peer_ended_ = false;
    std::coroutine_handle<> close_waiter_;
};

}  // namespace transport

COROCOLL_END_NAMESPACE
