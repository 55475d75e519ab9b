#pragma once

// Matching receives to messages: the queues of posted receives (one per peer, one for any
// source), the buffered messages that came first, and the receives' deadlines.

#include <corocoll/core/error.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/transport/frame.hpp>
#include <corocoll/transport/peer.hpp>
#include <corocoll/transport/posted_recv.hpp>
#include <corocoll/version.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace transport::detail {

/// Where the engine's receives wait and how arriving frames find them. A receive that names
/// its source waits in that peer's queue and is matched only against that peer's frames and
/// buffered messages; a receive from any source waits in one queue of its own. Between the
/// two, the receive posted first wins. Nothing here allocates per receive; a buffered message
/// is one allocation (its bytes).
class matcher {
public:
    matcher(io::reactor& r, std::vector<peer>& peers) noexcept : reactor_(r), peers_(peers) {}
    matcher(const matcher&) = delete;
    matcher& operator=(const matcher&) = delete;

    recv_queue& any_source_queue() noexcept { return any_; }
    const recv_queue& any_source_queue() const noexcept { return any_; }

    recv_queue& queue_of(const posted_recv& pr) noexcept;

    /// Receives whose deadline passed, waiting for the group's verdict (see `on_expiry`).
    recv_queue& expired_queue() noexcept { return expired_; }
    const recv_queue& expired_queue() const noexcept { return expired_; }

    /// What happens when a receive's deadline passes: by default it completes with
    /// `timed_out`. With `expire` set, a receive without `soft_deadline` is moved to the
    /// expired queue instead (no frame matches it there any more) and `expire(context, pr)` is
    /// called: the engine then decides whom to blame and fails the group.
    void on_expiry(void (*expire)(void*, posted_recv&), void* context) noexcept;

    /// Queues `pr` and arms its deadline: when it passes before a frame matched, the receive
    /// completes with `timed_out` (see `on_expiry`).
    void enqueue(posted_recv& pr);

    void unlink(posted_recv& pr) noexcept { queue_of(pr).remove(pr); }

    /// The receive a frame `h` from rank `p` goes to: the earliest posted of those naming `p`
    /// and those from any source.
    posted_recv* match(int p, const frame_header& h) noexcept;

    /// Marks `pr` done and resumes whoever waits for it.
    void complete(posted_recv& pr);

    /// Completes every receive of `queue` with `error`.
    void fail_all(recv_queue& queue, const std::exception_ptr& error);

    /// `pr`'s owner goes away before it completed: the receive is withdrawn; a reader that is
    /// filling its buffer finishes the message and drops it.
    void withdraw(posted_recv& pr) noexcept;

    /// A buffered message that a receive matches.
    struct found {
        int rank;
        std::deque<unexpected_msg>::iterator msg;
    };

    /// The buffered message `pr` takes, if one matches: from its source, or the earliest to
    /// arrive from any peer for an any-source receive.
    std::optional<found> find_unexpected(const posted_recv& pr);

    /// Fills `pr` from the buffered message `f` and drops the message.
    void take(posted_recv& pr, const found& f);

    /// True while a posted receive may take a frame from rank `p` (one naming it, or one from
    /// any source).
    bool waits_for(int p) const noexcept;

    /// A reader stopped by the buffer bound may hold exactly the header this receive wants:
    /// it gets `pr` and goes on with the payload.
    bool hand_to_blocked_reader(posted_recv& pr);

    /// The next arrival number, which orders buffered messages across peers.
    std::uint64_t next_arrival() noexcept { return arrivals_++; }

    /// Copies a whole message into `pr` (or records that it does not fit) and marks it done.
    static void fill_from(posted_recv& pr, int p, std::span<const std::byte> data);

    static std::exception_ptr too_long(int p, std::size_t len, std::size_t room);

private:
    peer& peer_at(int p) noexcept { return peers_[static_cast<std::size_t>(p)]; }

    // Only a receive still waiting can be withdrawn; one whose payload is arriving ends with
    // its socket operation, which has the same deadline.
    static void on_deadline(io::timer_entry& t) noexcept;

    io::reactor& reactor_;
    std::vector<peer>& peers_;
    recv_queue any_;
    recv_queue expired_;
    void (*expire_)(void*, posted_recv&) = nullptr;
    void* expire_context_ = nullptr;
    std::uint64_t posted_ = 0;
    std::uint64_t arrivals_ = 0;
};

}  // namespace transport::detail

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/impl/matching.ipp>
#endif
