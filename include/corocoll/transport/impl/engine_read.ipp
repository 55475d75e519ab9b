// The bodies of <corocoll/transport/engine.hpp>, part 3 of 4:
// the readers: each peer's frames read, matched and delivered.
// Inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/copy.hpp>
#include <corocoll/transport/engine.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

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
            ps.fit_staging(sizeof(frame_header) + h.length);
            if (h.kind != frame_kind::p2p && h.kind != frame_kind::collective) {
                if (co_await take_control_frame(ps, p, h)) continue;
                co_return;
            }
            if (h.src != static_cast<std::uint32_t>(p) ||
                h.dst != static_cast<std::uint32_t>(rank_)) {
                throw_unexpected_frame(p, h);
            }
            ++frames_in_;
            if (!check_active(p, h)) co_return;  // the group failed
            posted_recv* pr = matching_.match(p, h);
            if (pr == nullptr && h.length > 0 && options_.hold.count() > 0 && !ps.hold_spent &&
                ps.link->worth_holding(h.length) && !matching_.waits_for(p)) {
                // Copied into a buffer now, it would be copied twice; the receive usually
                // comes soon. (Not where a receive from this peer waits already: it may need
                // what is behind; nor once a hold of this peer's ran out and no receive from it
                // has waited since: peer::hold_spent.)
                ps.blocked = &h;
                ps.hold.owner = &ps;
                ps.hold.when = std::chrono::steady_clock::now() + hold_for(h);
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
                const bool released = std::exchange(ps.hold_released, false);
                const bool expired = !ps.hold.armed() && !released;
                reactor_.disarm(ps.hold);
                if (!unblocked(ps, p, h, pr)) co_return;
                if (released) {
                    ++holds_.released;
                } else if (expired) {
                    ++holds_.expired;
                    if (pr != nullptr) {
                        ++holds_.expired_with_receive;
                    } else {
                        ps.hold_spent = true;  // buffered: nobody takes this peer's messages
                    }
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
                    io::op_options o(pr->deadline, stop_.get_token());
                    const std::uint64_t left = rest.empty() ? h.length : rest.size();
                    // Delivering before the receives held back complete: a coroutine one of
                    // them resumes may drop this receive too.
                    ps.delivering = pr;
                    complete_deferred(ps);
                    if (ps.delivering == nullptr) {
                        co_await skip_payload(ps, left, std::move(o));  // withdrawn already
                        continue;
                    }
                    co_await deliver(ps, p, h, rest, std::move(o));
                    pr = std::exchange(ps.delivering, nullptr);
                    if (pr == nullptr) continue;  // withdrawn
                }
                complete_after_staged(ps, *pr);
                continue;
            }
            detail::unexpected_msg m{h, matching_.next_arrival(), {}};
            if (ps.staged_end - ps.staged_begin < h.length) complete_deferred(ps);
            // Read into a buffer that grows as the bytes arrive (`peer::grow_early`), until a
            // receive for it is posted: the rest then goes straight into that receive.
            posted_recv* late = nullptr;
            while (m.data.size() < h.length) {
                std::span<std::byte> more = ps.grow_early(m.data, h.length);
                co_await ps.read_payload(more, stop_.get_token());
                if (m.data.size() == h.length) break;
                late = matching_.match(p, h);
                if (late != nullptr && h.length <= late->buf.size()) break;
                late = nullptr;  // too small for it: it gets the whole message, and its error
            }
            if (late == nullptr) late = matching_.match(p, h);
            if (late == nullptr) {
                ps.unexpected_bytes += m.data.size();
                ps.unexpected.push_back(std::move(m));
                ++holds_.buffered;
                continue;
            }
            if (!verify(*late, p, h)) co_return;
            matching_.unlink(*late);
            if (m.data.size() < h.length) {
                late->state = posted_recv::receiving;
                late->from = p;
                late->length = h.length;
                copy_bytes(late->buf.data(), m.data.data(), m.data.size());
                std::span<std::byte> rest =
                    late->buf.subspan(m.data.size(), h.length - m.data.size());
                m.data = {};
                io::op_options o(late->deadline, stop_.get_token());
                // As above: delivering before the receives held back complete.
                ps.delivering = late;
                complete_deferred(ps);
                if (ps.delivering == nullptr) {
                    co_await skip_payload(ps, rest.size(), std::move(o));  // withdrawn already
                    continue;
                }
                co_await ps.read_payload(rest, std::move(o));
                late = std::exchange(ps.delivering, nullptr);
                if (late == nullptr) continue;  // withdrawn
            } else {
                detail::matcher::fill_from(*late, p, m.data);
                late->state = posted_recv::receiving;
            }
            complete_after_staged(ps, *late);
        }
    } catch (const std::system_error& e) {
        // Our own protocol errors carry their detail in the text; socket errors say all
        // in their code.
        bool ours = e.code().category() == corocoll::error_category() &&
                    e.code() != corocoll::errc::connection_closed;
        if (!closing_ && !failure_ && !abort_notice_left_by(p)) {
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

COROCOLL_DECL task<bool> engine::take_control_frame(peer& ps, int p, const frame_header& h) {
    if (h.kind == frame_kind::goodbye && h.src == static_cast<std::uint32_t>(p)) {
        if (auto notice = abort_notice::of(h, size_)) {
            co_await receive_abort_notice(ps, p, *notice);
        } else {
            peer_left(p);
        }
        co_return false;
    }
    bool ranks_ok =
        h.src == static_cast<std::uint32_t>(p) && h.dst == static_cast<std::uint32_t>(rank_);
    if (ranks_ok && h.kind == frame_kind::status_query && h.length == 0) {
        answer(p, h.seq);
        co_return true;
    }
    if (ranks_ok && h.kind == frame_kind::status_reply &&
        h.length <= detail::rank_status::max_bytes(size_)) {
        std::string bytes(h.length, '\0');
        co_await ps.read_payload(std::as_writable_bytes(std::span(bytes)), stop_.get_token());
        round_.take_answer(p, h.seq, bytes);
        co_return true;
    }
    throw_unexpected_frame(p, h);
}

COROCOLL_DECL void engine::throw_unexpected_frame(int p, const frame_header& h) const {
    corocoll::detail::throw_error(corocoll::errc::protocol_error,
                                  "unexpected frame from rank " + std::to_string(p) + " to rank " +
                                      std::to_string(rank_) + ": kind " +
                                      std::to_string(static_cast<int>(h.kind)) + ", from rank " +
                                      std::to_string(h.src) + " to rank " + std::to_string(h.dst) +
                                      ", " + std::to_string(h.length) + " bytes");
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

COROCOLL_DECL task<> engine::deliver(peer& ps, int p, const frame_header& h,
                                     std::span<std::byte> rest, io::op_options o) {
    if (!rest.empty()) {
        co_await ps.read_payload(rest, std::move(o));
        co_return;
    }
    co_await skip_payload(ps, h.length, std::move(o));
    if (posted_recv* still = ps.delivering) {
        still->error = detail::matcher::too_long(p, h.length, still->buf.size());
    }
}

COROCOLL_DECL task<> engine::skip_payload(peer& ps, std::uint64_t bytes, io::op_options o) {
    std::vector<std::byte> scratch(std::min<std::uint64_t>(bytes, 1 << 20));
    for (std::uint64_t left = bytes; left > 0;) {
        auto n = static_cast<std::size_t>(std::min<std::uint64_t>(left, scratch.size()));
        co_await ps.read_payload(std::span(scratch).first(n), o);
        left -= n;
    }
}

}  // namespace transport

COROCOLL_END_NAMESPACE
