#pragma once

// What the engine needs from the connection to one peer: an ordered, reliable byte stream
// with an end. Matching, sequencing and failure handling sit above it, in the engine; each
// kind of connection is one implementation in a file of its own (tcp/channel.hpp,
// shm/channel.hpp). A new kind (RDMA, say) is a new folder that implements this.

#include <corocoll/core/task.hpp>
#include <corocoll/io/detail/basic_op.hpp>
#include <corocoll/version.hpp>

#include <sys/uio.h>

#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// Which channel a pair of ranks uses. `automatic`: shared memory where both ranks can map
/// the same memory (same boot, same network namespace, a segment both see), TCP otherwise.
/// `shm`: shared memory for every pair, and set-up fails for a pair that cannot. `tcp`:
/// sockets everywhere. COROCOLL_TRANSPORT=auto|tcp|shm sets the default.
enum class transport_choice { automatic, tcp, shm };

/// One peer's connection as a byte stream: what one side sends arrives whole and in order on
/// the other, then the end of the stream. Only the reactor's thread uses it. At most one
/// receive and one send are in flight at a time (the engine's reader and its send lock).
class channel {
public:
    channel() = default;
    channel(const channel&) = delete;
    channel& operator=(const channel&) = delete;
    virtual ~channel() = default;

    /// "tcp" or "shm": what logs and errors call it.
    virtual const char* kind() const noexcept = 0;
    /// How errors name the peer's end ("127.0.0.1:40123", "shm").
    virtual std::string address() const = 0;

    /// Copies into `out` what is already here, without waiting; 0 when nothing is. Where that
    /// costs a system call (a socket) it is made only with `may_call_kernel`.
    virtual std::size_t try_recv(std::span<std::byte> out, bool may_call_kernel) noexcept = 0;
    /// Waits for bytes and yields how many were copied into `out`, 0 at the end of the stream.
    virtual task<std::size_t> recv_some(std::span<std::byte> out, io::op_options o) = 0;
    /// Fills all of `out`; fails with `corocoll::errc::connection_closed` if the stream ends
    /// first.
    virtual task<> recv(std::span<std::byte> out, io::op_options o) = 0;

    /// Lets a reader wait for bytes with no coroutine frame of its own: true when `h` will be
    /// resumed, from the reactor's loop, once bytes are here, the stream has ended, the channel
    /// was shut down or `kick_reader` was called; false when nothing needs waiting for (bytes
    /// are here, or the end) or the channel cannot wait this way: the reader then calls
    /// `recv_some`, which says which. At most one reader waits.
    virtual bool await_readable(std::coroutine_handle<> h) noexcept {
        (void)h;
        return false;
    }
    /// Resumes the reader waiting in `await_readable` at the next turn of the loop, whether
    /// bytes came or not (the engine's way to stop its readers).
    virtual void kick_reader() noexcept {}

    /// True when the stream cannot lose its framing (shared memory: each record is published
    /// whole by the one writer, in memory no other process may touch): frame headers then
    /// carry no checksum on this channel, and the reader checks what else a header says. A
    /// socket says no.
    virtual bool keeps_framing() const noexcept { return false; }

    /// True when a payload of `bytes` that no receive wants yet is better left in the channel
    /// for a while than buffered: the receive usually comes soon, and then the payload goes
    /// straight into it (see `engine_options::hold`). Shared memory and TCP say yes for large
    /// payloads (buffering one costs an allocation, page faults and a second copy); the base
    /// says no.
    COROCOLL_DECL virtual bool worth_holding(std::uint64_t bytes) noexcept;

    /// Sends, without waiting, a prefix of the buffers of `iov` as long as fits now; returns
    /// its length.
    virtual std::size_t try_send(std::span<iovec> iov) noexcept = 0;
    /// Sends every byte of `iov` (left as it was).
    virtual task<> send(std::span<iovec> iov, io::op_options o) = 0;
    /// Last words: all of `iov` now, or nothing (when it does not fit at once).
    virtual void send_now(std::span<iovec> iov) noexcept = 0;

    /// Leaves `iov` (a header and a short text, at most `last_words_bytes`) where the peer
    /// finds it after the stream has ended, even if a frame was cut off in the middle: the
    /// reason this rank failed reaches the peer although a send was in flight. Nothing where
    /// the channel has no such place (a socket: its last words go in the stream).
    virtual void leave_last_words(std::span<iovec> iov) noexcept { (void)iov; }
    /// What the peer left with `leave_last_words`; empty when nothing.
    virtual std::string last_words() const { return {}; }
    /// Room `leave_last_words` has: a frame header and an abort notice's text.
    static constexpr std::size_t last_words_bytes = 64 + 4096;

    /// Ends the stream both ways: the peer reads its end, and a receive or send waiting here
    /// ends at once (a receive with the end of the stream).
    virtual void shutdown() noexcept = 0;
    /// Waits for what the channel still has in flight in the kernel, then releases it. After
    /// `shutdown`, with no receive or send waiting.
    virtual task<> close() = 0;
    /// False after `close`.
    virtual bool is_open() const noexcept = 0;
};

namespace detail {

COROCOLL_DECL std::size_t iov_bytes(std::span<const iovec> iov) noexcept;

// What is left of `iov` after its first `n` bytes, written into `rest` (which has room for
// as many entries); returns the entries used.
COROCOLL_DECL std::span<iovec> iov_after(std::span<const iovec> iov, std::size_t n,
                                         std::span<iovec> rest) noexcept;

}  // namespace detail

}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/impl/channel.ipp>
#endif
