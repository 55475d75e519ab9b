// The bodies of the non-template functions declared in <corocoll/transport/matching.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/copy.hpp>
#include <corocoll/transport/matching.hpp>

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

COROCOLL_DECL bool matcher::waits_for(int p) const noexcept {
    return !any_.empty() || !peers_[static_cast<std::size_t>(p)].posted.empty();
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
        copy_bytes(pr.buf.data(), data.data(), data.size());
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
