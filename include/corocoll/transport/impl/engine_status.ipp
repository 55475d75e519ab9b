// The bodies of <corocoll/transport/engine.hpp>, part 4 of 4:
// what this rank is doing (its answers to status queries), the stall timer, and the engine's
// side of the status round (status_round.hpp asks and judges; this says what it is about and
// carries its questions and verdict).
// Inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/engine.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

COROCOLL_DECL bool engine::paused() const noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    auto now = std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
    return stall_timer_.armed() &&
           now > stall_timer_.when.time_since_epoch() + std::chrono::milliseconds(10);
}

COROCOLL_DECL detail::rank_status engine::my_status() const {
    detail::rank_status s;
    s.in_collective = has_active_;
    s.current = active_;
    s.done = done_seq_;
    s.fingerprint = fingerprint_;
    std::uint64_t n = std::min<std::uint64_t>(done_seq_, detail::rank_status::remembered);
    for (std::uint64_t k = done_seq_ - n + 1; n > 0 && k <= done_seq_; ++k) {
        s.recent.push_back(remembered_[k % remembered_.size()]);
    }
    auto note = [&s](const detail::recv_queue& q) {
        for (const posted_recv* pr = q.front(); pr != nullptr; pr = pr->next) {
            if (std::find(s.waiting_for.begin(), s.waiting_for.end(), pr->src) ==
                s.waiting_for.end()) {
                s.waiting_for.push_back(pr->src);
            }
            if (pr->kind == frame_kind::p2p && !s.p2p_wait) {
                s.p2p_wait = true;
                s.p2p_tag = pr->tag;
            }
        }
    };
    for (std::size_t p = 0; p < peers_.size(); ++p) {
        note(peers_[p].posted);
        if (peers_[p].sends_waiting > 0) s.sending_to.push_back(static_cast<std::int32_t>(p));
    }
    note(matching_.any_source_queue());
    note(matching_.expired_queue());
    if (shared_wait_) {
        for (int q : shared_waiting_) {
            if (std::find(s.waiting_for.begin(), s.waiting_for.end(), q) == s.waiting_for.end())
                s.waiting_for.push_back(q);
        }
    }
    return s;
}

COROCOLL_DECL bool engine::anything_waits() {
    if (shared_wait_ || sends_waiting_ > 0 || !matching_.any_source_queue().empty()) return true;
    for (const auto& p : peers_) {
        if (!p.posted.empty()) return true;
    }
    return false;
}

COROCOLL_DECL std::string engine::describe_wait(const posted_recv& pr) const {
    if (pr.expect != nullptr)
        return "collective #" + std::to_string(pr.seq) + " " + describe_(*pr.expect);
    return "recv from " +
           (pr.src == any_source ? std::string("any rank") : "rank " + std::to_string(pr.src)) +
           " (tag " + std::to_string(pr.tag) + ")";
}

COROCOLL_DECL task<> engine::send_status_frame(int p, frame_header h, std::string payload,
                                               time_point until) {
    peer& ps = peer_at(p);
    auto guard = co_await ps.send_lock.scoped_lock();
    // Where the connection does not come, no answer does: the round judges that.
    if (ps.link == nullptr && lazy_ != nullptr && !failure_) co_await open_link(p, until, true);
    if (failure_ || !ps.connected() || ps.said_goodbye || std::chrono::steady_clock::now() > until)
        co_return;
    h.src = static_cast<std::uint32_t>(rank_);
    h.dst = static_cast<std::uint32_t>(p);
    h.length = payload.size();
    h.seal();
    iovec iov[2] = {{&h, sizeof(h)}, {payload.data(), payload.size()}};
    std::span<iovec> all(iov, payload.empty() ? 1 : 2);
    // What fits goes at once: the lock is not held across a trip through the reactor.
    std::size_t sent = ps.link->try_send(all);
    if (sent == sizeof(h) + payload.size()) co_return;
    iovec rest_space[2];
    try {
        co_await ps.link->send(detail::iov_after(all, sent, rest_space),
                               io::op_options(until, stop_.get_token()));
    } catch (const std::system_error& e) {
        ps.stream_cut = true;
        // A peer that is gone (its end closed) is judged by its reader, which reads to the end
        // of its stream: a goodbye there is a clean departure (a rank that a shared-memory
        // step had released may finish and leave before this rank's reactor next looks at the
        // step, while a status round of this rank still runs), its absence a failure.
        bool gone = e.code() == std::errc::broken_pipe || e.code() == std::errc::connection_reset;
        if (!failure_ && !gone) fail(p, e.code(), "a status frame could not be sent");
    }
}

COROCOLL_DECL void engine::answer(int p, std::uint64_t id) {
    frame_header h;
    h.kind = frame_kind::status_reply;
    h.seq = id;
    readers_.spawn(send_status_frame(p, h, my_status().encode(),
                                     std::chrono::steady_clock::now() + answer_window()));
}

COROCOLL_DECL void engine::ask(int p, std::uint64_t id, time_point until) {
    frame_header q;
    q.kind = frame_kind::status_query;
    q.seq = id;
    readers_.spawn(send_status_frame(p, q, {}, until));
}

COROCOLL_DECL status_round::subject engine::round_subject() const {
    status_round::subject s;
    if (const posted_recv* expired = matching_.expired_queue().front()) {
        s.why = detail::status_reason::deadline;
        s.waited_for = expired->src;
        s.waiting = describe_wait(*expired);
    } else if (shared_expired_) {
        s.why = detail::status_reason::deadline;
        s.waited_for = shared_culprit_;
        s.waiting = shared_what_;
    } else {
        s.waiting = "its receives, with no progress for " +
                    std::to_string(stall_interval().count()) + " ms";
    }
    return s;
}

COROCOLL_DECL void engine::stall_explained(const std::string& report) {
    COROCOLL_LOG(warn, "P2P", "rank ", rank_, " made no progress for ", stall_interval().count(),
                 " ms: ", report);
    progress_at_ = std::chrono::steady_clock::now();
}

COROCOLL_DECL void engine::shared_wait_expired(int culprit, std::string what) {
    if (failure_ || closing_) return;
    shared_expired_ = true;
    shared_culprit_ = culprit;
    shared_what_ = std::move(what);
    start_status_round();
}

COROCOLL_DECL void engine::start_status_round() noexcept {
    if (round_.running() || failure_ || closing_) return;
    try {
        readers_.spawn(round_.run(answer_window(), describe_));
    } catch (const std::exception&) {
        // Out of memory: the receive that expired stays until the group closes.
    }
}

COROCOLL_DECL void engine::on_stall_timer(io::timer_entry& t) noexcept {
    engine& e = *static_cast<stall_timer_entry&>(t).owner;
    if (e.failure_ || e.closing_) return;
    auto now = std::chrono::steady_clock::now();
    if (now > t.when + std::chrono::milliseconds(10)) e.was_paused_ = true;
    if (e.frames_in_ != e.frames_at_check_ || !e.anything_waits()) {
        e.frames_at_check_ = e.frames_in_;
        e.progress_at_ = now;
    } else if (e.stall_interval().count() > 0 && now - e.progress_at_ >= e.stall_interval()) {
        e.start_status_round();
    }
    t.when = now + e.timer_period();
    e.reactor_.arm(t);
}

}  // namespace transport

COROCOLL_END_NAMESPACE
