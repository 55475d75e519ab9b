// The bodies of <corocoll/transport/engine.hpp>, part 1 of 4:
// the engine's construction, sends, posted receives and the checks of collective calls.
// Inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
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
            ++frames_checked_at_begin_;
            // A rank sends the frames of its collectives in their order (they run one at a
            // time, and a peer's sends keep theirs): what follows a later collective's frame
            // is later still, and is checked when its own call begins or its frame is read.
            // Looking further made a root whose senders ran ahead read its whole backlog at
            // every call.
            if (m.header.kind == frame_kind::collective && m.header.seq > meta.seq) break;
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

COROCOLL_DECL task<> engine::send_frame(std::span<const std::byte> data, int dst, frame_header h,
                                        op_label what, time_point deadline) {
    check_peer(dst, what);
    check_usable(what);
    peer& ps = peer_at(dst);
    if (ps.said_goodbye) throw_left(dst, what);
    auto guard = co_await ps.send_lock.scoped_lock();
    check_usable(what);
    if (ps.link == nullptr) {
        if (lazy_ == nullptr) {
            corocoll::detail::throw_error(std::make_error_code(std::errc::not_connected),
                                          "corocoll: rank " + std::to_string(rank_) + ": " +
                                              describe_op(what) + ": no connection to rank " +
                                              std::to_string(dst));
        }
        co_await open_link(dst, deadline);
        check_usable(what);
        if (ps.said_goodbye) throw_left(dst, what);
        if (ps.link == nullptr) {
            // As a send that cannot finish by its deadline: the group fails.
            fail(dst, std::make_error_code(std::errc::timed_out),
                 "its connection on first use did not come by the deadline");
            check_usable(what);
        }
    }
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
        if (!failure_) co_await ps.reader_exit(reactor_, io::deadline_after(last_words_grace));
        fail(dst, failed, "");
    }
    check_usable(what);
}

COROCOLL_DECL void engine::open_on_first_use(std::unique_ptr<lazy_mesh> m) {
    lazy_ = std::move(m);
    acceptors_.spawn(accept_links());
}

COROCOLL_DECL task<> engine::open_link(int p, time_point deadline, bool for_status) {
    using opening = peer::opening;
    peer& ps = peer_at(p);
    if (ps.opens == opening::none) {
        ps.opens = opening::dialling;
        std::unique_ptr<channel> ch;
        std::error_code failed;
        std::string why;
        // A dial waits like a send (the stall checks count it).
        ++sends_waiting_;
        ++ps.sends_waiting;
        try {
            ch = co_await lazy_->dial(p, deadline, stop_.get_token());
        } catch (const std::system_error& e) {
            failed = e.code();
            why = e.what();
        } catch (const std::exception& e) {  // an address in the store that is none
            failed = make_error_code(corocoll::errc::protocol_error);
            why = e.what();
        }
        --sends_waiting_;
        --ps.sends_waiting;
        if (ps.link != nullptr) {
            // The peer's own connection was taken meanwhile (this rank is the higher, or the
            // peer refused this dial): the pair has its connection, and this dial's end (the
            // peer may have closed its group since) says nothing about the peer.
            if (ch) co_await ch->close();
            co_return;
        }
        if (failed) {
            ps.opens = opening::none;
            // Refused, or cut off in the handshake (a listener closed with this dial queued).
            bool gone = failed == std::errc::connection_refused ||
                        cause_of(failed) == failure_cause::rank_failed;
            if (!gone) {
                if (!(for_status && failed == std::errc::timed_out)) fail(p, failed, why);
                co_return;
            }
            // Nobody listens where the peer has since set-up: it closed its group, or its
            // process ended. A peer that failed the group first told the ranks it was
            // connected to, and their word is on its way here: it names the cause, which
            // "cannot be reached" would hide. So the group's failure is awaited a moment
            // first, as a send cut off by a peer waits for its last frame.
            co_await until_failed_or(std::min(deadline, io::deadline_after(last_words_grace)));
            if (failure_) co_return;
            // Like a goodbye, this fails only what needs the peer; a death fails the group
            // through the peer's neighbours on the ring of set-up connections, which see its
            // connections end without one.
            peer_left(p, "rank " + std::to_string(p) +
                             " cannot be reached where it has listened since set-up: it closed "
                             "its process group, or its process ended (" +
                             why + ")");
            co_return;
        }
        if (ch) {
            attach(p, std::move(ch));
            co_return;
        }
        // Refused: the peer's own connection is the pair's, and comes (or came) to the listener.
        if (ps.link == nullptr) ps.opens = opening::awaiting;
    }
    while (ps.link == nullptr && !failure_ && !ps.said_goodbye &&
           std::chrono::steady_clock::now() < deadline) {
        // Rare (two ranks that dialled each other at once): the peer's handshake with this
        // rank's listener is a round trip from done.
        co_await reactor_.sleep_for(std::chrono::milliseconds(1));
    }
}

COROCOLL_DECL task<> engine::until_failed_or(time_point until) {
    if (failure_) co_return;
    try {
        // A failure, or the close, stops `stop_`.
        co_await reactor_.sleep_until(until, stop_.get_token());
    } catch (const std::system_error&) {
    }
}

COROCOLL_DECL task<> engine::open_for_recv(int p, time_point deadline) {
    peer& ps = peer_at(p);
    auto guard = co_await ps.send_lock.scoped_lock();
    // The receive's own deadline judges a peer whose connection does not come.
    if (ps.link == nullptr && !failure_) co_await open_link(p, deadline);
}

COROCOLL_DECL task<> engine::accept_links() {
    auto stop = accepting_.get_token();
    for (;;) {
        io::socket s;
        try {
            s = co_await lazy_->accept(stop);
        } catch (const std::system_error& e) {
            if (!stop.stop_requested()) {
                COROCOLL_LOG(warn, "P2P", "rank ", rank_, " stops taking connections: ", e.what());
            }
            break;
        }
        acceptors_.spawn(take_link(std::move(s)));
    }
}

COROCOLL_DECL task<> engine::take_link(io::socket s) {
    using opening = peer::opening;
    std::string from = s.peer().to_string();
    int p = -1;
    try {
        p = co_await lazy_->greet(s, accepting_.get_token());
    } catch (const std::exception& e) {
        if (!accepting_.stop_requested()) {
            COROCOLL_LOG(warn, "P2P", "rank ", rank_, " dropped a connection from ", from, ": ",
                         e.what());
        }
        co_return;
    }
    peer& ps = peer_at(p);
    // The pair keeps the lower rank's connection where both dialled; one that came while this
    // rank waits for exactly it (its own was refused) is taken.
    bool take = ps.link == nullptr && (ps.opens == opening::none || ps.opens == opening::awaiting ||
                                       (ps.opens == opening::dialling && p < rank_));
    opening before = ps.opens;
    if (take) ps.opens = opening::answering;
    std::unique_ptr<channel> ch;
    try {
        ch = co_await lazy_->answer(std::move(s), p, take, accepting_.get_token());
    } catch (const std::exception& e) {
        if (take && ps.link == nullptr) ps.opens = before;
        COROCOLL_LOG(warn, "P2P", "rank ", rank_, " lost the connection of rank ", p,
                     " in its handshake: ", e.what());
        co_return;
    }
    if (ch) attach(p, std::move(ch));
}

COROCOLL_DECL void engine::attach(int p, std::unique_ptr<channel> ch) {
    peer& ps = peer_at(p);
    ps.link = std::move(ch);
    ps.opens = peer::opening::none;
    ps.framed = ps.link->keeps_framing();
    ps.address = ps.link->address();
    if (!failure_) {
        readers_.spawn(read_loop(p));
        return;
    }
    // Connected after the group failed: the dialer learns why, as the others did.
    if (send_abort_notice(p) == notice_sent::after_frame) {
        readers_.spawn(send_abort_notice_after_frame(p));
    } else {
        ps.link->shutdown();
    }
}

COROCOLL_DECL void engine::post(posted_recv& pr, const op_label& what) {
    if (pr.src != any_source) check_peer(pr.src, what);
    check_usable(what);
    if (pr.src != any_source && peer_at(pr.src).said_goodbye &&
        !peer_at(pr.src).has_unexpected(pr.kind, pr.seq, pr.tag)) {
        throw_left(pr.src, what);
    }
    pr.expect = what.collective ? &what.meta : nullptr;
    pr.state = posted_recv::waiting;
    // Connections on first use: a receive from a peer not connected yet dials it too (the pair
    // keeps one connection whoever dials first), so a peer that cannot be reached fails the
    // receive now rather than at its deadline.
    if (pr.src != any_source && lazy_ != nullptr && peer_at(pr.src).link == nullptr &&
        peer_at(pr.src).opens == peer::opening::none) {
        acceptors_.spawn(open_for_recv(pr.src, pr.deadline));
    }
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
    release_holds(pr);
}

COROCOLL_DECL void engine::release_holds(const posted_recv& pr) {
    int first = pr.src == any_source ? 0 : pr.src;
    int last = pr.src == any_source ? size_ : pr.src + 1;
    for (int p = first; p < last; ++p) {
        peer& ps = peer_at(p);
        ps.hold_spent = false;  // a receive from the peer waits: its messages may be held again
        if (ps.blocked == nullptr || !ps.hold.armed() || !ps.blocked_reader) continue;
        // `pr` waits for something other than the held message, perhaps behind it: the reader
        // buffers the held one and reads on.
        reactor_.disarm(ps.hold);
        ps.hold_released = true;
        std::exchange(ps.blocked_reader, {}).resume();
    }
}

COROCOLL_DECL std::chrono::microseconds engine::hold_for(const frame_header& h) const noexcept {
    if (h.kind == frame_kind::collective && options_.collective_hold.count() > 0) {
        // A status answer behind the held message waits it out: a quarter of the window at most.
        return std::min<std::chrono::microseconds>(options_.collective_hold, answer_window() / 4);
    }
    return options_.hold;
}

COROCOLL_DECL void engine::throw_left(int p, const op_label& what) const {
    const std::string& how = peer_at(p).left_how;
    corocoll::detail::throw_error(
        corocoll::errc::connection_closed,
        "corocoll: rank " + std::to_string(rank_) + ": " + describe_op(what) + ": " +
            (how.empty() ? "rank " + std::to_string(p) + " closed its process group" : how));
}

COROCOLL_DECL void engine::rethrow(const posted_recv& pr, const op_label& what) const {
    try {
        std::rethrow_exception(pr.error);
    } catch (const std::system_error& e) {
        corocoll::detail::throw_error(e.code(), "corocoll: rank " + std::to_string(rank_) + ": " +
                                                    describe_op(what) + ": " +
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

COROCOLL_DECL void engine::check_peer(int r, const op_label& what) const {
    if (r < 0 || r >= size_) {
        throw std::invalid_argument("corocoll: rank " + std::to_string(rank_) + ": " +
                                    describe_op(what) + ": rank " + std::to_string(r) +
                                    " is outside [0, " + std::to_string(size_) + ")");
    }
    if (r == rank_) {
        throw std::invalid_argument("corocoll: rank " + std::to_string(rank_) + ": " +
                                    describe_op(what) + ": the peer is this rank itself");
    }
}

COROCOLL_DECL void engine::check_usable(const op_label& what) const {
    if (!failure_) return;
    try {
        std::rethrow_exception(failure_);
    } catch (const std::system_error& e) {
        corocoll::detail::throw_error(e.code(), "corocoll: rank " + std::to_string(rank_) + ": " +
                                                    describe_op(what) + ": " +
                                                    corocoll::detail::context_of(e));
    }
}

}  // namespace transport

COROCOLL_END_NAMESPACE
