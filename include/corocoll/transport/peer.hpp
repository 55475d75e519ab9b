#pragma once

// One peer of the engine: its channel, what its reader has staged, the messages that
// arrived before a receive wanted them, and the receives posted for it.

#include <corocoll/core/async_mutex.hpp>
#include <corocoll/core/error.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/core/when_all.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/transport/channel.hpp>
#include <corocoll/transport/frame.hpp>
#include <corocoll/transport/posted_recv.hpp>
#include <corocoll/version.hpp>

#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <span>
#include <stop_token>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace transport::detail {

// Bytes whose storage is not zeroed first: a buffered message is overwritten whole at once
// (zeroing a 1 MiB message cost a fifth of a broadcast's time on shared memory).
template <class T>
struct uninitialized_allocator : std::allocator<T> {
    template <class U>
    struct rebind {
        using other = uninitialized_allocator<U>;
    };
    uninitialized_allocator() noexcept = default;
    template <class U>
    uninitialized_allocator(const uninitialized_allocator<U>&) noexcept {}  // NOLINT
    template <class U>
    void construct(U* p) noexcept {
        ::new (static_cast<void*>(p)) U;
    }
    template <class U, class... A>
    void construct(U* p, A&&... a) {
        ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
    }
};
using message_bytes = std::vector<std::byte, uninitialized_allocator<std::byte>>;

// A message that arrived before any receive matched it, kept whole (one copy).
struct unexpected_msg {
    frame_header header;
    std::uint64_t arrival = 0;  // engine-wide arrival order, for any-source receives
    message_bytes data;
};

struct peer {
    /// What one receive from the socket may bring at most at first: a small message (header
    /// and payload) and the frames behind it cost one system call.
    static constexpr std::size_t staging_bytes = std::size_t{16} << 10;
    /// What it may grow to (`fit_staging`) once this peer sends a frame that does not fit but
    /// would fit this: such a frame otherwise takes a second receive for its last bytes, and a
    /// stream of them one receive each (over TCP on 2 ranks of an AMD EPYC, a gather of 16 KiB
    /// blocks took 18-21 µs a call with 16 KiB, 8-11 with 64 KiB; docs/performance.md, "A frame
    /// that outgrows the staging buffer"). Peers that only send small frames keep 16 KiB.
    static constexpr std::size_t staging_most = std::size_t{64} << 10;

    std::unique_ptr<channel> link;
    // The channel cannot lose its framing: headers to and from this peer carry no checksum.
    bool framed = false;
    std::string address;
    local_async_mutex send_lock;
    // Receives posted for this peer by name, in posting order.
    recv_queue posted;
    std::deque<unexpected_msg> unexpected;
    std::size_t unexpected_bytes = 0;
    // A reader that holds a header it has nowhere to put (buffer full) waits here.
    const frame_header* blocked = nullptr;
    std::coroutine_handle<> blocked_reader;
    posted_recv* handed = nullptr;
    // Ends the hold of a large message that came before its receive (see
    // engine_options::hold).
    struct hold_timer : io::timer_entry {
        peer* owner = nullptr;
    } hold;
    // A receive this held message does not match ended the hold (engine::release_holds).
    bool hold_released = false;
    // A hold ran out, and no receive from the peer has had to wait since (one that found its
    // message buffered does not count): the reader holds nothing more until one does (the
    // messages behind would each wait out a hold of their own, and so would whatever comes
    // behind them: a status answer).
    bool hold_spent = false;
    // The receive whose payload the reader is reading now; its owner clears this when it
    // abandons the receive, and the reader then leaves it alone.
    posted_recv* delivering = nullptr;
    // The peer closed its group (a goodbye frame): its EOF is no failure.
    bool said_goodbye = false;
    // How it left where that was not a goodbye (a connection on first use found nobody).
    std::string left_how;
    bool reader_exited = false;
    // A send to this peer ended part-way through a frame: nothing more may follow it.
    bool stream_cut = false;
    // Sends to this peer that wait for room (for the status report).
    int sends_waiting = 0;
    // Receives whose message is in, completed once the reader has gone through the bytes
    // staged behind it (engine::complete_after_staged); linked through `next`.
    posted_recv* deferred_head = nullptr;
    posted_recv* deferred_tail = nullptr;
    std::coroutine_handle<> exit_waiter;
    bool connected() const noexcept { return link != nullptr && link->is_open(); }
    // Where a connection opened on first use stands while `link` is null (engine::open_link):
    // none tried, this rank dials, this rank answers the peer's dial, or this rank waits for the
    // peer's connection (its own dial was refused: the peer's wins).
    enum class opening : std::uint8_t { none, dialling, answering, awaiting };
    opening opens = opening::none;

    // What the reader has received and not yet consumed, in a buffer of `staging_size`
    // bytes (allocated at the first receive).
    std::unique_ptr<std::byte[]> staged;
    std::size_t staged_begin = 0;
    std::size_t staged_end = 0;
    std::size_t staging_size = staging_bytes;

    bool has_unexpected(frame_kind kind, std::uint64_t seq, std::int64_t tag) const noexcept;

    // Where the next receive from the socket goes: the room after what is staged (moved to
    // the front first). The reader adds what arrived with `staged_end += n`.
    std::span<std::byte> staging_room();

    // Grows the staging buffer to hold `frame_bytes` (a header and its payload) where that
    // is at most `staging_most`, keeping what is staged: later frames of that size then come
    // in one receive. Larger frames leave it as it is (their payload goes straight from the
    // channel into the receive's buffer).
    void fit_staging(std::uint64_t frame_bytes);

    // True when a whole header waits in the staging buffer (no system call needed).
    bool header_staged() const noexcept {
        return staged_end - staged_begin >= sizeof(frame_header);
    }

    // Takes a staged header without suspending; `header_staged()` must be true.
    void take_header(frame_header& h) noexcept;

    // Moves what is staged into the front of `out`; returns the rest of `out`, which the
    // caller receives from the socket.
    std::span<std::byte> take_staged(std::span<std::byte> out) noexcept;

    // Reads the text that follows an abort notice (at most `abort_notice::max_text` bytes,
    // within 5 s); empty when it does not come.
    task<std::string> read_text(std::uint64_t length);

    // Writes `h` and `text` at once without waiting, where no frame is half-sent (the send
    // lock is free); nothing otherwise. For last words: a header and a short text fit an idle
    // channel, so the write does not come up short.
    // False when the lock was held (nothing written).
    bool send_now(const frame_header& h, const std::string& text) noexcept;

    // Waits until this peer's reader has ended (read the peer's last words or its EOF), or
    // until `deadline`.
    task<> reader_exit(io::reactor& reactor, std::chrono::steady_clock::time_point deadline);

    // Fills `out` from the peer's stream: what is staged, then what the channel already has,
    // then the channel's waits only for what is still missing.
    task<> read_payload(std::span<std::byte> out, io::op_options o);

    // Grows `data`, a message of `length` bytes that arrived before its receive, for the
    // next of its bytes: to 1 MiB at once, then doubling, never by the announced length alone
    // (a header that announces a terabyte and sends nothing costs a megabyte; larger
    // messages pay for it with copies on growth, at most their own size in all). Returns the
    // room to read them into.
    std::span<std::byte> grow_early(message_bytes& data, std::uint64_t length);
};

}  // namespace transport::detail

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/impl/peer.ipp>
#endif
