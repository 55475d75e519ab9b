#pragma once

// Posted receives: what a receive waits with, and the queues the engine matches arriving
// frames against (one per peer, one for any-source receives).

#include <corocoll/io/reactor.hpp>
#include <corocoll/transport/frame.hpp>
#include <corocoll/version.hpp>

#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// `recv` from whichever rank sends first.
inline constexpr int any_source = -1;

/// What a receive got: who sent it and how many bytes.
struct recv_result {
    /// The rank that sent the message.
    int source = -1;
    /// Bytes received.
    std::size_t length = 0;
};

namespace detail {

class matcher;

// How collective metadata reads in error messages; the collectives layer installs its own.
using describer = std::string (*)(const collective_meta&);

COROCOLL_DECL std::string describe_raw(const collective_meta& m);

// Names an operation in error messages; spelled out only when one is thrown, so that the
// operations themselves build no strings.
struct op_label {
    bool sending = false;
    int peer = any_source;
    std::int64_t tag = 0;
    std::size_t bytes = 0;
    bool collective = false;
    collective_meta meta{};
    // Where a collective waited, when not on a message ("shared-memory step").
    const char* place = nullptr;

    std::string spell(describer describe) const;
};

// One receive waiting for its message. It lives in the receiving coroutine's frame (inside a
// `recv_op`) and is linked into a `recv_queue` while it waits; the reader that matches a
// frame to it fills `buf` and completes it.
struct posted_recv {
    enum state_t { idle, waiting, receiving, done };

    std::span<std::byte> buf;
    int src = any_source;
    frame_kind kind = frame_kind::p2p;
    std::uint64_t seq = 0;
    std::int64_t tag = 0;
    // A collective receive checks the sender's metadata against this.
    const collective_meta* expect = nullptr;
    std::chrono::steady_clock::time_point deadline;
    // Its deadline ends only this receive, never the group (a wait with a bound of its own,
    // like monitored_barrier's).
    bool soft_deadline = false;
    // Its deadline passed; it waits in the matcher's expired queue for the group's verdict.
    bool expired = false;
    // Order of posting, engine-wide: a frame that two queues could take goes to the receive
    // posted first.
    std::uint64_t order = 0;
    state_t state = idle;
    int from = -1;
    std::size_t length = 0;
    std::exception_ptr error;
    posted_recv* prev = nullptr;
    posted_recv* next = nullptr;
    bool linked = false;
    std::coroutine_handle<> waiter;
    // Watches `deadline` while the receive waits for a frame; `fire` and `owner` are the
    // engine's.
    struct deadline_timer : io::timer_entry {
        matcher* owner = nullptr;
        posted_recv* pr = nullptr;
    } timer;

    bool matches(int p, const frame_header& h) const noexcept;
};

// An intrusive FIFO of posted receives: linking and unlinking cost no allocation.
class recv_queue {
public:
    bool empty() const noexcept { return head_ == nullptr; }
    posted_recv* front() const noexcept { return head_; }

    void push_back(posted_recv& pr) noexcept;

    void remove(posted_recv& pr) noexcept;

    // The earliest receive here that a frame `h` from rank `p` satisfies.
    posted_recv* first_match(int p, const frame_header& h) const noexcept;

private:
    posted_recv* head_ = nullptr;
    posted_recv* tail_ = nullptr;
};

}  // namespace detail

}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/impl/posted_recv.ipp>
#endif
