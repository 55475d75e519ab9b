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

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace transport {
namespace detail {

COROCOLL_DECL recv_queue& matcher::queue_of(const posted_recv& pr) noexcept {
    if (pr.expired) return expired_;
    return pr.src == any_source ? any_ : peer_at(pr.src).posted;
}

COROCOLL_DECL void matcher::on_expiry(void (*expire)(void*, posted_recv&), void* context) noexcept {
    expire_ = expire;
    expire_context_ = context;
}

COROCOLL_DECL void matcher::enqueue(posted_recv& pr) {
    pr.order = posted_++;
    queue_of(pr).push_back(pr);
    if (pr.deadline != std::chrono::steady_clock::time_point::max()) {
        pr.timer.when = pr.deadline;
        pr.timer.fire = &on_deadline;
        pr.timer.owner = this;
        pr.timer.pr = &pr;
        reactor_.arm(pr.timer);
    }
}

COROCOLL_DECL posted_recv* matcher::match(int p, const frame_header& h) noexcept {
    posted_recv* named = peer_at(p).posted.first_match(p, h);
    posted_recv* any = any_.empty() ? nullptr : any_.first_match(p, h);
    if (named == nullptr) return any;
    if (any == nullptr) return named;
    return named->order < any->order ? named : any;
}

COROCOLL_DECL void matcher::complete(posted_recv& pr) {
    if (pr.state == posted_recv::done) return;
    pr.state = posted_recv::done;
    reactor_.disarm(pr.timer);
    if (pr.waiter) std::exchange(pr.waiter, {}).resume();
}

COROCOLL_DECL void matcher::fail_all(recv_queue& queue, const std::exception_ptr& error) {
    while (posted_recv* pr = queue.front()) {
        queue.remove(*pr);
        pr->error = error;
        complete(*pr);
    }
}

COROCOLL_DECL void matcher::withdraw(posted_recv& pr) noexcept {
    if (pr.linked) queue_of(pr).remove(pr);
    reactor_.disarm(pr.timer);
    // A matched receive knows its sender: only that peer's reader can be filling it.
    if (pr.state == posted_recv::receiving && pr.from >= 0) {
        peer& ps = peer_at(pr.from);
        if (ps.delivering == &pr) ps.delivering = nullptr;
        // Or its message is in and its completion held back behind staged bytes.
        posted_recv* before = nullptr;
        for (posted_recv* d = ps.deferred_head; d != nullptr; before = d, d = d->next) {
            if (d != &pr) continue;
            (before != nullptr ? before->next : ps.deferred_head) = d->next;
            if (ps.deferred_tail == d) ps.deferred_tail = before;
            break;
        }
    }
}

COROCOLL_DECL auto matcher::find_unexpected(const posted_recv& pr) -> std::optional<found> {
    std::optional<found> best;
    int first = pr.src == any_source ? 0 : pr.src;
    int last = pr.src == any_source ? static_cast<int>(peers_.size()) : pr.src + 1;
    for (int p = first; p < last; ++p) {
        peer& ps = peer_at(p);
        for (auto it = ps.unexpected.begin(); it != ps.unexpected.end(); ++it) {
            if (!pr.matches(p, it->header)) continue;
            if (!best || it->arrival < best->msg->arrival) best = found{p, it};
            break;
        }
    }
    return best;
}

COROCOLL_DECL void matcher::take(posted_recv& pr, const found& f) {
    peer& from = peer_at(f.rank);
    fill_from(pr, f.rank, f.msg->data);
    from.unexpected_bytes -= f.msg->data.size();
    from.unexpected.erase(f.msg);
    // Room freed: a reader held back by the bound may go on.
    if (from.blocked_reader) std::exchange(from.blocked_reader, {}).resume();
}

COROCOLL_DECL bool matcher::hand_to_blocked_reader(posted_recv& pr) {
    int first = pr.src == any_source ? 0 : pr.src;
    int last = pr.src == any_source ? static_cast<int>(peers_.size()) : pr.src + 1;
    for (int p = first; p < last; ++p) {
        peer& ps = peer_at(p);
        if (ps.blocked != nullptr && pr.matches(p, *ps.blocked) && ps.blocked_reader) {
            ps.handed = &pr;
            pr.state = posted_recv::receiving;
            std::exchange(ps.blocked_reader, {}).resume();
            return true;
        }
    }
    return false;
}

COROCOLL_DECL void matcher::fill_from(posted_recv& pr, int p, std::span<const std::byte> data) {
    pr.from = p;
    pr.length = data.size();
    if (data.size() > pr.buf.size()) {
        pr.error = too_long(p, data.size(), pr.buf.size());
    } else if (!data.empty()) {
        std::memcpy(pr.buf.data(), data.data(), data.size());
    }
    pr.state = posted_recv::done;
}

COROCOLL_DECL std::exception_ptr matcher::too_long(int p, std::size_t len, std::size_t room) {
    return std::make_exception_ptr(std::system_error(
        make_error_code(corocoll::errc::message_too_large),
        "the message from rank " + std::to_string(p) + " has " + std::to_string(len) +
            " bytes, the receive buffer " + std::to_string(room)));
}

COROCOLL_DECL void matcher::on_deadline(io::timer_entry& t) noexcept {
    auto& timer = static_cast<posted_recv::deadline_timer&>(t);
    posted_recv& pr = *timer.pr;
    matcher* self = timer.owner;
    if (pr.state != posted_recv::waiting) return;
    self->unlink(pr);
    if (self->expire_ != nullptr && !pr.soft_deadline) {
        pr.expired = true;
        self->expired_.push_back(pr);
        self->expire_(self->expire_context_, pr);
        return;
    }
    pr.error = std::make_exception_ptr(std::system_error(std::make_error_code(std::errc::timed_out),
                                                         "no matching message arrived in time"));
    self->complete(pr);
}

}  // namespace detail
}  // namespace transport

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
