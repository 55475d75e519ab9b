// The bodies of <corocoll/transport/engine.hpp>, part 2 of 4:
// the close protocol: goodbyes, abort notices, the group's failure and shutting down.
// Inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/engine.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

COROCOLL_DECL task<> engine::close(time_point linger_until) {
    if (!failure_ && linger_until > std::chrono::steady_clock::now()) {
        co_await send_goodbyes();
        std::stop_source timer_stop;
        auto timer = [&]() -> task<> {
            try {
                co_await reactor_.sleep_until(linger_until, timer_stop.get_token());
            } catch (const std::system_error&) {
                co_return;  // every peer left first
            }
            COROCOLL_LOG(warn, "P2P", "rank ", rank_, " stops waiting for peers to close");
            // Whatever is still pending ends with this, not as if it had succeeded.
            if (!failure_) {
                failure_ = closed_error();
                cause_ = failure_cause::closed;
            }
            closing_ = true;
            abort_all();
        };
        auto readers = [&]() -> task<> {
            co_await readers_.join();
            timer_stop.request_stop();
        };
        co_await when_all(readers(), timer());
        goodbyes_sent_ = true;
    }
    co_await shut_down();
}

COROCOLL_DECL std::exception_ptr engine::closed_error() {
    return std::make_exception_ptr(std::system_error(
        std::make_error_code(std::errc::operation_canceled), "the process group was closed"));
}

COROCOLL_DECL task<> engine::send_goodbyes() {
    auto deadline = io::deadline_after(std::chrono::seconds(5));
    std::vector<task<>> goodbyes;
    for (int p = 0; p < size_; ++p) {
        if (peer_at(p).connected()) {
            goodbyes.push_back(send_goodbye(p, deadline));
        }
    }
    co_await when_all(std::move(goodbyes));
}

COROCOLL_DECL task<> engine::shut_down() {
    reactor_.disarm(stall_timer_);
    if (!failure_ && !goodbyes_sent_) co_await send_goodbyes();
    if (!failure_) {
        failure_ = closed_error();
        cause_ = failure_cause::closed;
    }
    closing_ = true;
    abort_all();
    wake_failure_waiters();
    accepting_.request_stop();
    co_await acceptors_.join();
    // A peer that dials from now on is refused at once, not left in the listen queue.
    if (lazy_) lazy_->stop_listening();
    co_await readers_.join();
    for (auto& p : peers_) {
        if (p.link) co_await p.link->close();
    }
}

COROCOLL_DECL task<> engine::send_goodbye(int p, time_point deadline) {
    peer& ps = peer_at(p);
    auto guard = co_await ps.send_lock.scoped_lock();
    frame_header h;
    h.kind = frame_kind::goodbye;
    h.src = static_cast<std::uint32_t>(rank_);
    h.dst = static_cast<std::uint32_t>(p);
    h.seal();
    iovec iov{&h, sizeof(h)};
    try {
        co_await ps.link->send(std::span(&iov, 1), deadline);
    } catch (const std::system_error&) {
        ps.stream_cut = true;
        // The peer is gone already; nothing to tell it.
    }
}

COROCOLL_DECL auto engine::send_abort_notice(int q) -> notice_sent {
    peer& p = peer_at(q);
    // The culprit is told too: after a mismatch it is alive and needs the reason (a dead
    // one's socket just refuses the write).
    if (failed_peer_ < 0 || !p.connected() || p.said_goodbye) return notice_sent::no;
    frame_header h;
    std::string text = abort_notice_to(q, h);
    // Also where the peer finds it after a frame cut off by this failure (shared memory).
    iovec iov[2] = {{&h, sizeof(h)}, {text.data(), text.size()}};
    p.link->leave_last_words(iov);
    return p.send_now(h, text) ? notice_sent::now : notice_sent::after_frame;
}

COROCOLL_DECL std::string engine::abort_notice_to(int q, frame_header& h) const {
    std::string text = failure_text_.substr(0, abort_notice::max_text);
    abort_notice notice{static_cast<std::uint32_t>(failed_peer_), failure_code_.value(),
                        failure_code_.category() == corocoll::error_category(), text.size(),
                        cause_};
    h = notice.header(static_cast<std::uint32_t>(rank_), static_cast<std::uint32_t>(q));
    return text;
}

COROCOLL_DECL task<> engine::send_abort_notice_after_frame(int q) {
    peer& p = peer_at(q);
    {
        auto guard = co_await p.send_lock.scoped_lock();
        if (!p.stream_cut && p.connected() && !p.said_goodbye) {
            frame_header h;
            std::string text = abort_notice_to(q, h);
            iovec iov[2] = {{&h, sizeof(h)}, {text.data(), text.size()}};
            p.link->send_now(iov);
        }
    }
    p.link->shutdown();
}

COROCOLL_DECL task<> engine::receive_abort_notice(peer& ps, int p, const abort_notice& notice) {
    fail_as_notice_says(p, notice, co_await ps.read_text(notice.text_length));
}

COROCOLL_DECL bool engine::abort_notice_left_by(int p) {
    std::string words = peer_at(p).link->last_words();
    if (words.size() < sizeof(frame_header)) return false;
    frame_header h;
    std::memcpy(&h, words.data(), sizeof(h));
    if (!h.problem(abort_notice::max_text).empty() || h.src != static_cast<std::uint32_t>(p))
        return false;
    auto notice = abort_notice::of(h, size_);
    if (!notice) return false;
    fail_as_notice_says(p, *notice, words.substr(sizeof(h), notice->text_length));
    return true;
}

COROCOLL_DECL void engine::fail_as_notice_says(int p, const abort_notice& notice,
                                               std::string text) {
    std::error_code code = notice.corocoll_code
                               ? std::error_code(notice.code, corocoll::error_category())
                               : std::error_code(notice.code, std::system_category());
    std::string by = "reported by rank " + std::to_string(p);
    if (text.empty()) {
        fail(static_cast<int>(notice.culprit), code, by, notice.cause);
    } else {
        if (text.find("(reported by rank") == std::string::npos) text += " (" + by + ")";
        fail_verbatim(static_cast<int>(notice.culprit), code, text, notice.cause);
    }
}

COROCOLL_DECL void engine::peer_left(int p, const std::string& how) {
    peer_at(p).said_goodbye = true;
    peer_at(p).left_how = how;
    bool anyone_left = false;
    for (int q = 0; q < size_; ++q) {
        if (q != rank_ && !peer_at(q).said_goodbye) anyone_left = true;
    }
    auto gone = std::make_exception_ptr(std::system_error(
        make_error_code(corocoll::errc::connection_closed),
        how.empty() ? "rank " + std::to_string(p) + " closed its process group before sending"
                    : how));
    matching_.fail_all(peer_at(p).posted, gone);
    if (!anyone_left) matching_.fail_all(matching_.any_source_queue(), gone);
}

COROCOLL_DECL failure_cause engine::cause_of(std::error_code code) noexcept {
    bool gone = code == corocoll::errc::connection_closed || code == std::errc::connection_reset ||
                code == std::errc::broken_pipe || code == std::errc::connection_aborted;
    return gone ? failure_cause::rank_failed : failure_cause::blamed;
}

COROCOLL_DECL void engine::fail(int p, std::error_code code, const std::string& detail,
                                failure_cause cause) {
    if (failure_) return;
    std::string peer_name = "rank " + std::to_string(p);
    if (p >= 0 && p < size_ && !peer_at(p).address.empty()) {
        peer_name += " (" + peer_at(p).address + ")";
    }
    fail_verbatim(p, code, "peer " + peer_name + " failed" + (detail.empty() ? "" : ": " + detail),
                  cause);
}

COROCOLL_DECL void engine::fail_verbatim(int p, std::error_code code, const std::string& text,
                                         failure_cause cause) {
    if (failure_) return;
    COROCOLL_LOG(warn, "P2P", text, ": ", code.message());
    failure_ = std::make_exception_ptr(std::system_error(code, text));
    failure_text_ = text;
    failed_peer_ = p;
    failure_code_ = code;
    cause_ = cause;
    abort_all();
    failed_stop_.request_stop();
    wake_failure_waiters();
}

COROCOLL_DECL void engine::wake_failure_waiters() noexcept {
    while (failure_wait* w = failure_waiters_) {
        w->unlink();
        try {
            w->report_ = report();
        } catch (const std::exception&) {
            w->report_.cause = cause_;  // out of memory for the words: the cause still holds
            w->report_.rank = failed_peer_;
        }
        reactor_.post(w->item_);
    }
}

COROCOLL_DECL void engine::failure_wait::await_suspend(std::coroutine_handle<> h) noexcept {
    item_.waiter = h;
    item_.run_ = [](corocoll::detail::work_item* i) noexcept {
        static_cast<resume_item*>(i)->waiter.resume();
    };
    next_ = e_->failure_waiters_;
    if (next_ != nullptr) next_->prev_ = this;
    prev_ = nullptr;
    e_->failure_waiters_ = this;
    linked_ = true;
}

COROCOLL_DECL void engine::failure_wait::unlink() noexcept {
    if (!linked_) return;
    if (prev_ != nullptr) {
        prev_->next_ = next_;
    } else {
        e_->failure_waiters_ = next_;
    }
    if (next_ != nullptr) next_->prev_ = prev_;
    prev_ = next_ = nullptr;
    linked_ = false;
}

COROCOLL_DECL void engine::abort_all() {
    stop_.request_stop();
    for (std::size_t q = 0; q < peers_.size(); ++q) {
        peer& p = peers_[q];
        bool later = false;
        if (send_abort_notice(static_cast<int>(q)) == notice_sent::after_frame) {
            try {
                readers_.spawn(send_abort_notice_after_frame(static_cast<int>(q)));
                later = true;
            } catch (const std::exception&) {
                // Out of memory: the peer learns of the failure from the closed socket.
            }
        }
        if (p.link && !later) p.link->shutdown();
        if (p.link) p.link->kick_reader();
        if (p.blocked_reader) std::exchange(p.blocked_reader, {}).resume();
    }
    for (auto& p : peers_) matching_.fail_all(p.posted, failure_);
    matching_.fail_all(matching_.any_source_queue(), failure_);
    matching_.fail_all(matching_.expired_queue(), failure_);
    round_.stop();
}

}  // namespace transport

COROCOLL_END_NAMESPACE
