// The bodies of the non-template functions declared in <corocoll/transport/engine.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/engine.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

COROCOLL_DECL engine::engine(io::reactor& r, int rank, int size,
                             std::vector<std::unique_ptr<channel>> channels, engine_options options)
    : reactor_(r), rank_(rank), size_(size), options_(options), peers_(channels.size()) {
    if (!options_.stall) options_.stall = stall_from_env();
    if (!options_.answer_window) {
        options_.answer_window =
            options_.stall->count() == 0
                ? std::chrono::milliseconds(3000)
                : std::clamp<std::chrono::milliseconds>(
                      *options_.stall / 4, std::chrono::seconds(1), std::chrono::seconds(10));
    }
    matching_.on_expiry(&on_expired, this);
    for (std::size_t p = 0; p < peers_.size(); ++p) {
        peers_[p].link = std::move(channels[p]);
        peers_[p].framed = peers_[p].link != nullptr && peers_[p].link->keeps_framing();
        if (peers_[p].connected()) {
            peers_[p].address = peers_[p].link->address();
            readers_.spawn(read_loop(static_cast<int>(p)));
        }
    }
    // Armed without stall checks too: `paused` reads it.
    stall_timer_.owner = this;
    stall_timer_.fire = &on_stall_timer;
    stall_timer_.when = std::chrono::steady_clock::now() + timer_period();
    reactor_.arm(stall_timer_);
}

COROCOLL_DECL task<> engine::send(std::span<const std::byte> data, int dst, std::int64_t tag,
                                  time_point deadline) {
    frame_header h;
    h.kind = frame_kind::p2p;
    h.tag = tag;
    op_label what;
    what.sending = true;
    what.peer = dst;
    what.tag = tag;
    what.bytes = data.size();
    return send_frame(data, dst, h, what, deadline);
}

COROCOLL_DECL task<> engine::send_coll(std::span<const std::byte> data, int dst,
                                       const collective_meta& meta, std::uint32_t step,
                                       time_point deadline) {
    frame_header h;
    meta.apply_to(h);
    h.tag = step;
    op_label what;
    what.sending = true;
    what.peer = dst;
    what.collective = true;
    what.meta = meta;
    return send_frame(data, dst, h, what, deadline);
}

COROCOLL_DECL recv_op<recv_yields::length> engine::recv_coll(std::span<std::byte> buf, int src,
                                                             const collective_meta& meta,
                                                             std::uint32_t step,
                                                             time_point deadline,
                                                             bool soft_deadline) {
    op_label what;
    what.peer = src;
    what.collective = true;
    what.meta = meta;
    return {*this, buf, src, frame_kind::collective, meta.seq, step, what, deadline, soft_deadline};
}

COROCOLL_DECL void engine::begin_collective(collective_meta& meta) {
    meta.history = fingerprint_;
    active_ = meta;
    has_active_ = true;
    for (int p = 0; p < size_ && !failure_; ++p) {
        for (const auto& m : peer_at(p).unexpected) {
            if (!check_active(p, m.header)) return;
        }
        // A header a reader holds back (the buffer bound) is already here too.
        if (const frame_header* held = peer_at(p).blocked) {
            if (!check_active(p, *held)) return;
        }
    }
}

COROCOLL_DECL void engine::end_collective() noexcept {
    if (!has_active_) return;
    has_active_ = false;
    remembered_[active_.seq % remembered_.size()] = active_;
    fingerprint_ = active_.fold(fingerprint_);
    done_seq_ = active_.seq;
}

COROCOLL_DECL task<> engine::catch_up() {
    int quiet = 0;
    for (int i = 0; i < 20 && quiet < 2 && !failure_; ++i) {
        auto before = frames_in_;
        co_await reactor_.sleep_for(std::chrono::milliseconds(5));
        quiet = frames_in_ == before ? quiet + 1 : 0;
    }
    was_paused_ = false;
}

COROCOLL_DECL void engine::raise_if_failed(const collective_meta& meta, const char* place) const {
    if (!failure_) return;
    op_label what;
    what.collective = true;
    what.meta = meta;
    what.place = place;
    check_usable(what);
}

COROCOLL_DECL task<> engine::close(time_point linger_until) {
    if (!failure_ && linger_until > std::chrono::steady_clock::now()) {
        co_await say_goodbyes();
        std::stop_source timer_stop;
        auto timer = [&]() -> task<> {
            try {
                co_await reactor_.sleep_until(linger_until, timer_stop.get_token());
            } catch (const std::system_error&) {
                co_return;  // every peer left first
            }
            COROCOLL_LOG(warn, "P2P", "rank ", rank_, " stops waiting for peers to close");
            // Whatever is still pending ends with this, not as if it had succeeded.
            if (!failure_) failure_ = closed_error();
            closing_ = true;
            abort_all();
        };
        auto readers = [&]() -> task<> {
            co_await readers_.join();
            timer_stop.request_stop();
        };
        co_await when_all(readers(), timer());
        goodbyes_said_ = true;
    }
    co_await close_now();
}

COROCOLL_DECL std::vector<std::unique_ptr<channel>> engine::tcp_channels(
    std::vector<io::socket> sockets, const engine_options& o) {
    std::vector<std::unique_ptr<channel>> out(sockets.size());
    for (std::size_t p = 0; p < sockets.size(); ++p) {
        if (sockets[p].is_open()) {
            out[p] = tcp_channel::make(std::move(sockets[p]), o.same_host_send_buffer);
        }
    }
    return out;
}

COROCOLL_DECL std::exception_ptr engine::closed_error() {
    return std::make_exception_ptr(std::system_error(
        std::make_error_code(std::errc::operation_canceled), "the process group was closed"));
}

COROCOLL_DECL task<> engine::send_frame(std::span<const std::byte> data, int dst, frame_header h,
                                        op_label what, time_point deadline) {
    check_peer(dst, what);
    check_usable(what);
    peer& ps = peer_at(dst);
    if (ps.departed) {
        corocoll::detail::throw_error(corocoll::errc::connection_closed,
                                      "corocoll: rank " + std::to_string(rank_) + ": " +
                                          spell(what) + ": rank " + std::to_string(dst) +
                                          " closed its process group");
    }
    auto guard = co_await ps.send_lock.scoped_lock();
    check_usable(what);
    h.src = static_cast<std::uint32_t>(rank_);
    h.dst = static_cast<std::uint32_t>(dst);
    h.length = data.size();
    if (ps.framed) {
        h.checksum = 0;
    } else {
        h.seal();
    }
    iovec iov[2] = {{&h, sizeof(h)}, {const_cast<std::byte*>(data.data()), data.size()}};
    std::span<iovec> all(iov, data.empty() ? 1 : 2);
    std::error_code failed;
    // The send lock makes this the channel's only send: what fits now goes at once, and
    // only the rest waits.
    std::size_t sent = ps.link->try_send(all);
    if (sent < sizeof(h) + data.size()) {
        iovec rest_space[2];
        ++sends_waiting_;
        ++ps.sends_waiting;
        try {
            co_await ps.link->send(detail::iov_after(all, sent, rest_space),
                                   io::op_options(deadline, stop_.get_token()));
        } catch (const std::system_error& e) {
            failed = e.code();
            ps.stream_cut = true;
        }
        --sends_waiting_;
        --ps.sends_waiting;
    }
    if (failed) {
        // A peer that failed the group tells us why in its last frame; a send that hits
        // its closed socket first must not hide that. Let its reader get to it.
        if (!failure_)
            co_await ps.reader_exit(reactor_, io::deadline_after(std::chrono::seconds(1)));
        fail(dst, failed, "");
    }
    check_usable(what);
}

COROCOLL_DECL void engine::post(posted_recv& pr, const op_label& what) {
    if (pr.src != any_source) check_peer(pr.src, what);
    check_usable(what);
    if (pr.src != any_source && peer_at(pr.src).departed &&
        !peer_at(pr.src).has_unexpected(pr.kind, pr.seq, pr.tag)) {
        corocoll::detail::throw_error(corocoll::errc::connection_closed,
                                      "corocoll: rank " + std::to_string(rank_) + ": " +
                                          spell(what) + ": rank " + std::to_string(pr.src) +
                                          " closed its process group");
    }
    pr.expect = what.collective ? &what.meta : nullptr;
    pr.state = posted_recv::waiting;
    if (auto found = matching_.find_unexpected(pr)) {
        if (!verify(pr, found->rank, found->msg->header)) {
            pr.error = failure_;
            pr.state = posted_recv::done;
            return;
        }
        matching_.take(pr, *found);
        return;
    }
    if (matching_.hand_to_blocked_reader(pr)) return;
    matching_.enqueue(pr);
}

COROCOLL_DECL void engine::rethrow(const posted_recv& pr, const op_label& what) const {
    try {
        std::rethrow_exception(pr.error);
    } catch (const std::system_error& e) {
        corocoll::detail::throw_error(e.code(), "corocoll: rank " + std::to_string(rank_) + ": " +
                                                    spell(what) + ": " +
                                                    corocoll::detail::context_of(e));
    }
}

COROCOLL_DECL bool engine::check_active(int p, const frame_header& h) {
    if (h.kind != frame_kind::collective) return true;
    const collective_meta* mine = nullptr;
    if (has_active_ && h.seq == active_.seq) {
        mine = &active_;
    } else if (h.seq <= done_seq_ && done_seq_ - h.seq < remembered_.size()) {
        mine = &remembered_[h.seq % remembered_.size()];
    }
    if (mine == nullptr) return true;
    collective_meta theirs = collective_meta::of(h);
    if (theirs == *mine) return true;
    return mismatch(p, *mine, theirs);
}

COROCOLL_DECL bool engine::verify(const posted_recv& pr, int p, const frame_header& h) {
    if (pr.expect == nullptr || h.kind != frame_kind::collective) return true;
    collective_meta theirs = collective_meta::of(h);
    if (theirs == *pr.expect) return true;
    return mismatch(p, *pr.expect, theirs);
}

COROCOLL_DECL bool engine::mismatch(int p, const collective_meta& mine,
                                    const collective_meta& theirs) {
    std::string text = "collective #" + std::to_string(mine.seq);
    if (mine.same_call(theirs)) {
        // Same call, different fingerprints: an earlier collective differed without a
        // frame of it ever reaching a rank that ran it differently.
        text += " (" + describe_(mine) + "): rank " + std::to_string(rank_) + " and rank " +
                std::to_string(p) + " ran different collectives before it; rank " +
                std::to_string(rank_) + " ran " + recent_calls();
    } else {
        text += " does not match across ranks: rank " + std::to_string(rank_) + " called " +
                describe_(mine) + ", rank " + std::to_string(p) + " called " + describe_(theirs);
    }
    fail_verbatim(p, make_error_code(corocoll::errc::protocol_error), text);
    return false;
}

COROCOLL_DECL std::string engine::recent_calls() const {
    std::string s;
    std::uint64_t first = done_seq_ > 4 ? done_seq_ - 3 : 1;
    for (std::uint64_t k = first; k <= done_seq_; ++k) {
        s += (s.empty() ? "#" : ", #") + std::to_string(k) + " " +
             describe_(remembered_[k % remembered_.size()]);
    }
    return s.empty() ? "none" : s;
}

COROCOLL_DECL task<> engine::say_goodbyes() {
    auto deadline = io::deadline_after(std::chrono::seconds(5));
    std::vector<task<>> goodbyes;
    for (int p = 0; p < size_; ++p) {
        if (peer_at(p).connected()) {
            goodbyes.push_back(say_goodbye(p, deadline));
        }
    }
    co_await when_all(std::move(goodbyes));
}

COROCOLL_DECL task<> engine::close_now() {
    reactor_.disarm(stall_timer_);
    if (!failure_ && !goodbyes_said_) co_await say_goodbyes();
    if (!failure_) failure_ = closed_error();
    closing_ = true;
    abort_all();
    co_await readers_.join();
    for (auto& p : peers_) {
        if (p.link) co_await p.link->close();
    }
}

COROCOLL_DECL task<> engine::say_goodbye(int p, time_point deadline) {
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

COROCOLL_DECL auto engine::tell_abort(int q) -> told {
    peer& p = peer_at(q);
    // The culprit is told too: after a mismatch it is alive and needs the reason (a dead
    // one's socket just refuses the write).
    if (failed_peer_ < 0 || !p.connected() || p.departed) return told::nothing;
    frame_header h;
    std::string text = abort_words(q, h);
    // Also where the peer finds it after a frame cut off by this failure (shared memory).
    iovec iov[2] = {{&h, sizeof(h)}, {text.data(), text.size()}};
    p.link->leave_last_words(iov);
    return p.send_now(h, text) ? told::told : told::busy;
}

COROCOLL_DECL std::string engine::abort_words(int q, frame_header& h) const {
    std::string text = failure_text_.substr(0, abort_notice::max_text);
    abort_notice notice{static_cast<std::uint32_t>(failed_peer_), failure_code_.value(),
                        failure_code_.category() == corocoll::error_category(), text.size()};
    h = notice.header(static_cast<std::uint32_t>(rank_), static_cast<std::uint32_t>(q));
    return text;
}

COROCOLL_DECL task<> engine::farewell(int q) {
    peer& p = peer_at(q);
    {
        auto guard = co_await p.send_lock.scoped_lock();
        if (!p.stream_cut && p.connected() && !p.departed) {
            frame_header h;
            std::string text = abort_words(q, h);
            iovec iov[2] = {{&h, sizeof(h)}, {text.data(), text.size()}};
            p.link->send_now(iov);
        }
    }
    p.link->shutdown();
}

COROCOLL_DECL task<> engine::take_abort(peer& ps, int p, const abort_notice& notice) {
    apply_abort(p, notice, co_await ps.read_text(notice.text_length));
}

COROCOLL_DECL bool engine::take_last_words(int p) {
    std::string words = peer_at(p).link->last_words();
    if (words.size() < sizeof(frame_header)) return false;
    frame_header h;
    std::memcpy(&h, words.data(), sizeof(h));
    if (!h.problem(abort_notice::max_text).empty() || h.src != static_cast<std::uint32_t>(p))
        return false;
    auto notice = abort_notice::of(h, size_);
    if (!notice) return false;
    apply_abort(p, *notice, words.substr(sizeof(h), notice->text_length));
    return true;
}

COROCOLL_DECL void engine::apply_abort(int p, const abort_notice& notice, std::string text) {
    std::error_code code = notice.corocoll_code
                               ? std::error_code(notice.code, corocoll::error_category())
                               : std::error_code(notice.code, std::system_category());
    std::string by = "reported by rank " + std::to_string(p);
    if (text.empty()) {
        fail(static_cast<int>(notice.culprit), code, by);
    } else {
        if (text.find("(reported by rank") == std::string::npos) text += " (" + by + ")";
        fail_verbatim(static_cast<int>(notice.culprit), code, text);
    }
}

COROCOLL_DECL void engine::depart(int p) {
    peer_at(p).departed = true;
    bool anyone_left = false;
    for (int q = 0; q < size_; ++q) {
        if (q != rank_ && !peer_at(q).departed) anyone_left = true;
    }
    auto departed = std::make_exception_ptr(std::system_error(
        make_error_code(corocoll::errc::connection_closed),
        "rank " + std::to_string(p) + " closed its process group before sending"));
    matching_.fail_all(peer_at(p).posted, departed);
    if (!anyone_left) matching_.fail_all(matching_.any_source_queue(), departed);
}

COROCOLL_DECL void engine::check_peer(int r, const op_label& what) const {
    if (r < 0 || r >= size_) {
        throw std::invalid_argument("corocoll: rank " + std::to_string(rank_) + ": " + spell(what) +
                                    ": rank " + std::to_string(r) + " is outside [0, " +
                                    std::to_string(size_) + ")");
    }
    if (r == rank_) {
        throw std::invalid_argument("corocoll: rank " + std::to_string(rank_) + ": " + spell(what) +
                                    ": the peer is this rank itself");
    }
}

COROCOLL_DECL void engine::check_usable(const op_label& what) const {
    if (!failure_) return;
    try {
        std::rethrow_exception(failure_);
    } catch (const std::system_error& e) {
        corocoll::detail::throw_error(e.code(), "corocoll: rank " + std::to_string(rank_) + ": " +
                                                    spell(what) + ": " +
                                                    corocoll::detail::context_of(e));
    }
}

COROCOLL_DECL void engine::fail(int p, std::error_code code, const std::string& detail) {
    if (failure_) return;
    std::string peer_name = "rank " + std::to_string(p);
    if (p >= 0 && p < size_ && !peer_at(p).address.empty()) {
        peer_name += " (" + peer_at(p).address + ")";
    }
    fail_verbatim(p, code, "peer " + peer_name + " failed" + (detail.empty() ? "" : ": " + detail));
}

COROCOLL_DECL void engine::fail_verbatim(int p, std::error_code code, const std::string& text) {
    if (failure_) return;
    COROCOLL_LOG(warn, "P2P", text, ": ", code.message());
    failure_ = std::make_exception_ptr(std::system_error(code, text));
    failure_text_ = text;
    failed_peer_ = p;
    failure_code_ = code;
    abort_all();
    failed_stop_.request_stop();
}

COROCOLL_DECL void engine::abort_all() {
    stop_.request_stop();
    for (std::size_t q = 0; q < peers_.size(); ++q) {
        peer& p = peers_[q];
        bool later = false;
        if (tell_abort(static_cast<int>(q)) == told::busy) {
            try {
                readers_.spawn(farewell(static_cast<int>(q)));
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
    round_.wake.request_stop();
}

COROCOLL_DECL task<> engine::read_loop(int p) {
    peer& ps = peer_at(p);
    // However the loop ends, the receives it held back complete (with the failure, if
    // any) and a sender waiting for it (see reader_exit) is released.
    struct exit_mark {
        engine& e;
        peer& ps;
        ~exit_mark() {
            e.complete_deferred(ps);
            ps.reader_exited = true;
            if (ps.exit_waiter) std::exchange(ps.exit_waiter, {}).resume();
        }
    } mark{*this, ps};
    try {
        for (;;) {
            frame_header h;
            // The header is read through the staging buffer with socket operations
            // awaited right here: a frame costs the reader no coroutine of its own.
            while (!ps.header_staged()) {
                std::span<std::byte> room = ps.staging_room();
                std::size_t n = ps.link->try_recv(room, false);
                if (n == 0) {
                    complete_deferred(ps);
                    // Where the channel lets the reader wait without a coroutine of its own
                    // (shared memory), a message costs no frame and no stop callback.
                    if (co_await readable_awaiter{*ps.link, stop_}) continue;
                    n = co_await ps.link->recv_some(room, stop_.get_token());
                }
                if (n == 0) {
                    corocoll::detail::throw_error(
                        corocoll::errc::connection_closed,
                        "corocoll: recv from " + ps.address + ": the connection closed");
                }
                ps.staged_end += n;
            }
            ps.take_header(h);
            if (ps.framed ? !h.sound_unsealed(options_.max_message_bytes)
                          : !h.sound(options_.max_message_bytes)) {
                corocoll::detail::throw_error(corocoll::errc::protocol_error,
                                              h.problem(options_.max_message_bytes, !ps.framed));
            }
            if (h.kind == frame_kind::goodbye && h.src == static_cast<std::uint32_t>(p)) {
                if (auto notice = abort_notice::of(h, size_)) {
                    co_await take_abort(ps, p, *notice);
                } else {
                    depart(p);
                }
                co_return;
            }
            bool ranks_ok = h.src == static_cast<std::uint32_t>(p) &&
                            h.dst == static_cast<std::uint32_t>(rank_);
            if (ranks_ok && h.kind == frame_kind::status_query && h.length == 0) {
                answer(p, h.seq);
                continue;
            }
            if (ranks_ok && h.kind == frame_kind::status_reply &&
                h.length <= detail::rank_status::max_bytes(size_)) {
                std::string bytes(h.length, '\0');
                co_await ps.read_payload(std::as_writable_bytes(std::span(bytes)),
                                         stop_.get_token());
                take_answer(p, h.seq, bytes);
                continue;
            }
            if ((h.kind != frame_kind::p2p && h.kind != frame_kind::collective) || !ranks_ok) {
                corocoll::detail::throw_error(corocoll::errc::protocol_error,
                                              "unexpected frame kind or ranks in a header");
            }
            ++frames_in_;
            if (!check_active(p, h)) co_return;  // the group failed
            posted_recv* pr = matching_.match(p, h);
            if (pr == nullptr && h.length > 0 && options_.hold.count() > 0 &&
                ps.link->worth_holding(h.length)) {
                // Copied into a buffer now, it would be copied twice; the receive usually
                // comes soon.
                ps.blocked = &h;
                ps.hold.owner = &ps;
                ps.hold.when = std::chrono::steady_clock::now() + options_.hold;
                ps.hold.fire = [](io::timer_entry& t) noexcept {
                    peer& held = *static_cast<peer::hold_timer&>(t).owner;
                    if (held.blocked_reader) std::exchange(held.blocked_reader, {}).resume();
                };
                reactor_.arm(ps.hold);
                ++holds_.held;
                complete_deferred(ps);
                // What that resumed may have posted this message's receive already, and found
                // no reader to hand it to yet: then there is nothing to wait for. (Waited for,
                // the hold's timer ended the wait: ~1 ms of every call of a collective that
                // sends before its peer's next receive, e.g. a 2-rank reduce of 8 KiB.)
                if (matching_.match(p, h) == nullptr) co_await blocked_awaiter{ps};
                const bool expired = !ps.hold.armed();
                reactor_.disarm(ps.hold);
                if (!unblocked(ps, p, h, pr)) co_return;
                if (expired) {
                    ++holds_.expired;
                    if (pr != nullptr) ++holds_.expired_with_receive;
                } else if (pr != nullptr) {
                    ++holds_.taken;
                }
            }
            while (pr == nullptr && h.length > 0 &&
                   ps.unexpected_bytes + h.length > options_.unexpected_bytes_per_peer &&
                   !ps.unexpected.empty()) {
                ps.blocked = &h;
                complete_deferred(ps);
                // As above: a receive posted meanwhile found no reader to hand it to.
                if (matching_.match(p, h) == nullptr) co_await blocked_awaiter{ps};
                if (!unblocked(ps, p, h, pr)) co_return;
            }
            if (pr != nullptr) {
                if (!verify(*pr, p, h)) {
                    // The group failed; a handed-over receive is in no queue that
                    // abort_all empties, so it ends here.
                    if (!pr->linked) {
                        pr->error = failure_;
                        matching_.complete(*pr);
                    }
                    co_return;
                }
                matching_.unlink(*pr);
                pr->state = posted_recv::receiving;
                pr->from = p;
                pr->length = h.length;
                // What is staged goes in first; the rest comes straight from the socket
                // into the buffer. `pr` may be withdrawn meanwhile (its owner then clears
                // `ps.delivering`), so only copies taken before waiting are used.
                std::span<std::byte> rest;
                if (h.length <= pr->buf.size()) rest = ps.take_staged(pr->buf.first(h.length));
                if (!rest.empty() || h.length > pr->buf.size()) {
                    complete_deferred(ps);
                    ps.delivering = pr;
                    co_await deliver(ps, p, h, rest,
                                     io::op_options(pr->deadline, stop_.get_token()));
                    pr = std::exchange(ps.delivering, nullptr);
                    if (pr == nullptr) continue;  // withdrawn
                }
                complete_after_staged(ps, *pr);
                continue;
            }
            detail::unexpected_msg m{h, matching_.next_arrival(), {}};
            if (ps.staged_end - ps.staged_begin < h.length) complete_deferred(ps);
            co_await ps.read_growing(m.data, h.length, stop_.get_token());
            // A receive may have been posted while the payload arrived.
            if (posted_recv* late = matching_.match(p, h)) {
                if (!verify(*late, p, h)) co_return;
                matching_.unlink(*late);
                detail::matcher::fill_from(*late, p, m.data);
                late->state = posted_recv::receiving;
                complete_after_staged(ps, *late);
            } else {
                ps.unexpected_bytes += m.data.size();
                ps.unexpected.push_back(std::move(m));
            }
        }
    } catch (const std::system_error& e) {
        // Our own protocol errors carry their detail in the text; socket errors say all
        // in their code.
        bool ours = e.code().category() == corocoll::error_category() &&
                    e.code() != corocoll::errc::connection_closed;
        if (!closing_ && !failure_ && !take_last_words(p)) {
            fail(p, e.code(), ours ? corocoll::detail::context_of(e) : "");
        }
    } catch (const std::exception& e) {
        if (!closing_) fail(p, make_error_code(corocoll::errc::protocol_error), e.what());
    }
    if (posted_recv* pr = std::exchange(ps.delivering, nullptr)) {
        pr->error = failure_;
        matching_.complete(*pr);
    }
}

COROCOLL_DECL void engine::complete_after_staged(peer& ps, posted_recv& pr) {
    if (ps.staged_end == ps.staged_begin) {
        matching_.complete(pr);
        return;
    }
    pr.next = nullptr;
    (ps.deferred_tail != nullptr ? ps.deferred_tail->next : ps.deferred_head) = &pr;
    ps.deferred_tail = &pr;
}

COROCOLL_DECL void engine::complete_deferred(peer& ps) {
    while (posted_recv* pr = ps.deferred_head) {
        ps.deferred_head = pr->next;
        if (ps.deferred_head == nullptr) ps.deferred_tail = nullptr;
        pr->next = nullptr;
        if (failure_ && !pr->error) pr->error = failure_;
        matching_.complete(*pr);
    }
}

COROCOLL_DECL bool engine::unblocked(peer& ps, int p, const frame_header& h, posted_recv*& pr) {
    ps.blocked = nullptr;
    posted_recv* handed = std::exchange(ps.handed, nullptr);
    if (closing_ || failure_) {
        if (handed != nullptr) {
            handed->error = failure_;
            matching_.complete(*handed);
        }
        return false;
    }
    pr = handed != nullptr ? handed : matching_.match(p, h);
    return true;
}

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
    if (failure_ || !ps.connected() || ps.departed || std::chrono::steady_clock::now() > until)
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

COROCOLL_DECL void engine::take_answer(int p, std::uint64_t id, const std::string& bytes) {
    status_round& rd = round_;
    if (!rd.running || id != rd.id || rd.answers[static_cast<std::size_t>(p)]) return;
    auto status = detail::rank_status::decode(bytes);
    if (!status) return;
    rd.answers[static_cast<std::size_t>(p)] = std::move(*status);
    if (--rd.missing == 0) rd.wake.request_stop();
}

COROCOLL_DECL task<> engine::run_status_round() {
    status_round& rd = round_;
    rd.running = true;
    rd.id += 1;
    rd.wake = std::stop_source();
    rd.answers.assign(static_cast<std::size_t>(size_), std::nullopt);
    rd.answers[static_cast<std::size_t>(rank_)] = my_status();
    rd.missing = 0;
    time_point until = std::chrono::steady_clock::now() + answer_window();
    frame_header q;
    q.kind = frame_kind::status_query;
    q.seq = rd.id;
    for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        peer& ps = peer_at(p);
        if (ps.departed || !ps.connected()) {
            detail::rank_status gone;
            gone.left = true;
            rd.answers[static_cast<std::size_t>(p)] = gone;
            continue;
        }
        ++rd.missing;
        readers_.spawn(send_status_frame(p, q, {}, until));
    }
    if (rd.missing > 0) {
        try {
            co_await reactor_.sleep_until(until, rd.wake.get_token());
        } catch (const std::system_error&) {
            // every answer came (or the group failed)
        }
    }
    rd.running = false;
    if (failure_ || closing_) co_return;
    const posted_recv* expired = matching_.expired_queue().front();
    const bool shared = expired == nullptr && shared_expired_;
    auto why = expired != nullptr || shared ? detail::status_reason::deadline
                                            : detail::status_reason::stalled;
    std::string waiting = expired != nullptr ? describe_wait(*expired)
                          : shared           ? shared_what_
                                             : "its receives, with no progress for " +
                                         std::to_string(stall_interval().count()) + " ms";
    int src = expired != nullptr ? expired->src : shared ? shared_culprit_ : any_source;
    auto verdict =
        detail::judge_status(rd.answers, rank_, why, src, waiting, answer_window(), describe_);
    if (shared && !verdict.fail) {
        // Every rank answered and none disagrees, yet the step never came: blame the rank
        // waited for, as a receive past its deadline does.
        verdict.fail = true;
        verdict.timed_out = true;
        verdict.culprit = shared_culprit_;
        verdict.text = "rank " + std::to_string(rank_) + " timed out waiting in " + shared_what_ +
                       "; " + verdict.text;
    }
    if (verdict.fail) {
        fail_verbatim(verdict.culprit,
                      verdict.timed_out ? std::make_error_code(std::errc::timed_out)
                                        : make_error_code(corocoll::errc::protocol_error),
                      verdict.text);
    } else {
        COROCOLL_LOG(warn, "P2P", "rank ", rank_, " made no progress for ",
                     stall_interval().count(), " ms: ", verdict.text);
        progress_at_ = std::chrono::steady_clock::now();
    }
}

COROCOLL_DECL void engine::shared_wait_expired(int culprit, std::string what) {
    if (failure_ || closing_) return;
    shared_expired_ = true;
    shared_culprit_ = culprit;
    shared_what_ = std::move(what);
    start_status_round();
}

COROCOLL_DECL void engine::start_status_round() noexcept {
    if (round_.running || failure_ || closing_) return;
    try {
        readers_.spawn(run_status_round());
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

COROCOLL_DECL task<> engine::deliver(peer& ps, int p, const frame_header& h,
                                     std::span<std::byte> rest, io::op_options o) {
    if (!rest.empty()) {
        co_await ps.read_payload(rest, std::move(o));
        co_return;
    }
    std::vector<std::byte> scratch(std::min<std::uint64_t>(h.length, 1 << 20));
    for (std::uint64_t left = h.length; left > 0;) {
        auto n = static_cast<std::size_t>(std::min<std::uint64_t>(left, scratch.size()));
        co_await ps.read_payload(std::span(scratch).first(n), o);
        left -= n;
    }
    if (posted_recv* still = ps.delivering) {
        still->error = detail::matcher::too_long(p, h.length, still->buf.size());
    }
}

}  // namespace transport

COROCOLL_END_NAMESPACE
