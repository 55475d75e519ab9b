#pragma once

#include <corocoll/core/async_mutex.hpp>
#include <corocoll/core/async_scope.hpp>
#include <corocoll/core/error.hpp>
#include <corocoll/core/log.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/core/when_all.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/io/socket.hpp>
#include <corocoll/transport/frame.hpp>
#include <corocoll/version.hpp>

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// `recv` from whichever rank sends first.
inline constexpr int any_source = -1;

/// What a receive got: who sent it and how many bytes.
struct recv_result {
    int source = -1;
    std::size_t length = 0;
};

/// Limits of the point-to-point engine.
struct engine_options {
    /// The largest message a peer may announce; a larger header fails the group (1 TiB).
    std::uint64_t max_message_bytes = std::uint64_t{1} << 40;
    /// Unexpected messages (arrived before a matching receive was posted) buffered per peer.
    /// Past this bound the peer's connection is not read until a matching receive is posted:
    /// TCP flow control then holds the sender back. A message is never dropped.
    std::size_t unexpected_bytes_per_peer = std::size_t{64} << 20;
    /// SO_SNDBUF for connections whose two ends have the same address (peers on this host;
    /// the kernel doubles it). A small send buffer keeps what a sender writes in the caches
    /// until the receiver copies it out: with 256 KiB, all_gather and broadcast of 64 MiB
    /// between two ranks ran 15-20% faster than with the kernel's autotuned buffer on a
    /// two-core machine. Connections to other hosts keep autotuning, which a long network
    /// path needs. 0: autotuning everywhere.
    std::size_t same_host_send_buffer = std::size_t{256} << 10;
};

/// Point-to-point messaging over a mesh of connections, on one reactor: the transport under
/// a process group. Messages are matched by (source, tag) in the order receives were posted;
/// between one pair of ranks, messages with the same tag never overtake each other. A posted
/// receive is filled straight from the socket; a message that arrives first is buffered
/// (one copy). The first failure of any peer (closed connection, reset, timeout mid-message,
/// a broken header) fails every pending operation and every later one with an error naming
/// that peer; the engine is then unusable. Must be `close()`d before it is destroyed.
class engine {
    struct posted_recv;
    struct peer;

public:
    using time_point = std::chrono::steady_clock::time_point;

    engine(io::reactor& r, int rank, int size, std::vector<io::socket> sockets,
           engine_options options = {})
        : reactor_(r), rank_(rank), size_(size), options_(options), peers_(sockets.size()) {
        for (std::size_t p = 0; p < peers_.size(); ++p) {
            peers_[p].sock = std::move(sockets[p]);
            if (peers_[p].sock.is_open()) {
                size_send_buffer(peers_[p].sock);
                peers_[p].address = peers_[p].sock.peer().to_string();
                readers_.spawn(read_loop(static_cast<int>(p)));
            }
        }
    }
    engine(const engine&) = delete;
    engine& operator=(const engine&) = delete;
    ~engine() {
        if (readers_.pending() != 0) std::terminate();  // close() was not awaited
    }

    int rank() const noexcept { return rank_; }
    int size() const noexcept { return size_; }
    io::reactor& owner() const noexcept { return reactor_; }

    /// True once a peer failed or the engine was closed.
    bool failed() const noexcept { return static_cast<bool>(failure_); }

    /// Sends `data` to `dst` with `tag`; completes when the bytes are handed to the kernel.
    task<> send(std::span<const std::byte> data, int dst, std::int64_t tag, time_point deadline) {
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

    /// Sends one step of a collective: `meta` travels with it and the receiver checks it.
    task<> send_coll(std::span<const std::byte> data, int dst, const collective_meta& meta,
                     std::uint32_t step, time_point deadline) {
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

    /// Receives one step of a collective from `src` into `buf`. A message whose metadata
    /// differs from `meta` (another collective, size, root, op or type on that rank) fails the
    /// whole group with a message naming both calls, on every rank.
    task<std::size_t> recv_coll(std::span<std::byte> buf, int src, const collective_meta& meta,
                                std::uint32_t step, time_point deadline) {
        op_label what;
        what.peer = src;
        what.collective = true;
        what.meta = meta;
        auto r = co_await recv_frame(buf, src, frame_kind::collective, meta.seq, step, &meta, what,
                                     deadline);
        co_return r.length;
    }

    /// Declares the collective this rank runs now (collectives of a group run one at a time):
    /// any frame of the same sequence number that disagrees with it, already buffered or
    /// arriving later, from whichever rank, is a mismatch at once, even if no posted receive
    /// would ever match it. `end_collective` when done.
    void begin_collective(const collective_meta& meta) {
        active_ = meta;
        has_active_ = true;
        for (int p = 0; p < size_ && !failure_; ++p) {
            for (const auto& m : peers_[static_cast<std::size_t>(p)].unexpected) {
                if (!check_active(p, m.header)) return;
            }
        }
    }
    void end_collective() noexcept { has_active_ = false; }

    /// How collective metadata reads in error messages ("all_reduce(sum, float32 x 100)");
    /// the collectives layer installs its own.
    using describer = std::string (*)(const collective_meta&);
    void set_describer(describer d) noexcept { describe_ = d; }

    /// Receives a message with `tag` from `src` (or `any_source`) into `buf`; yields the sender
    /// and the length. A message longer than `buf` is an error (the message is consumed).
    task<recv_result> recv(std::span<std::byte> buf, int src, std::int64_t tag,
                           time_point deadline) {
        op_label what;
        what.peer = src;
        what.tag = tag;
        return recv_frame(buf, src, frame_kind::p2p, 0, tag, nullptr, what, deadline);
    }

    /// Says goodbye to every peer (after whatever this rank already sent, so they get all of
    /// it and can tell a departure from a crash), stops the readers, closes every connection
    /// and fails whatever is still pending here. With `linger_until`, it first waits (until
    /// then at most) for every peer to say goodbye or disconnect: what a rank that serves the
    /// others' store does, so that nobody loses the store while still using it.
    task<> close(time_point linger_until = {}) {
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

private:
    static std::string describe_raw(const collective_meta& m) {
        return "collective " + std::to_string(m.collective) + "(op " + std::to_string(m.redop) +
               ", dtype " + std::to_string(m.dtype) + ", root " + std::to_string(m.root) +
               ", count " + std::to_string(m.count) + ")";
    }

    void size_send_buffer(const io::socket& s) const {
        if (options_.same_host_send_buffer == 0) return;
        if (s.local_endpoint().host() != s.peer().host()) return;
        int bytes = static_cast<int>(
            std::min<std::size_t>(options_.same_host_send_buffer, std::size_t{1} << 30));
        // Best effort: a refusal leaves the kernel's autotuning, which works too.
        ::setsockopt(s.native_handle(), SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
    }

    // Names an operation in error messages; spelled out only when one is thrown, so that the
    // operations themselves build no strings.
    struct op_label {
        bool sending = false;
        int peer = any_source;
        std::int64_t tag = 0;
        std::size_t bytes = 0;
        bool collective = false;
        collective_meta meta{};
    };

    std::string spell(const op_label& l) const {
        std::string who =
            l.peer == any_source ? std::string("any rank") : "rank " + std::to_string(l.peer);
        if (l.collective)
            return describe_(l.meta) + (l.sending ? ": send to " : ": recv from ") + who;
        if (l.sending) {
            return "send to " + who + " (tag " + std::to_string(l.tag) + ", " +
                   std::to_string(l.bytes) + " bytes)";
        }
        return "recv from " + who + " (tag " + std::to_string(l.tag) + ")";
    }

    task<> send_frame(std::span<const std::byte> data, int dst, frame_header h, op_label what,
                      time_point deadline) {
        check_peer(dst, what);
        check_usable(what);
        peer& ps = peers_[static_cast<std::size_t>(dst)];
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
        h.seal();
        iovec iov[2] = {{&h, sizeof(h)}, {const_cast<std::byte*>(data.data()), data.size()}};
        std::error_code failed;
        io::op_options o(deadline, stop_.get_token());
        o.try_now = true;  // the send lock makes this the socket's only send
        try {
            co_await ps.sock.send_vec(std::span(iov, data.empty() ? 1 : 2), o);
        } catch (const std::system_error& e) {
            failed = e.code();
        }
        if (failed) {
            // A peer that failed the group tells us why in its last frame; a send that hits
            // its closed socket first must not hide that. Let its reader get to it.
            if (!failure_) co_await reader_exit(ps, io::deadline_after(std::chrono::seconds(1)));
            fail(dst, failed, "");
        }
        check_usable(what);
    }

    // Waits until `ps`'s reader has ended (read the peer's last words or its EOF), or until
    // `deadline`.
    task<> reader_exit(peer& ps, time_point deadline) {
        if (ps.reader_exited) co_return;
        struct exit_awaiter {
            peer& ps;
            bool await_ready() const noexcept { return ps.reader_exited; }
            void await_suspend(std::coroutine_handle<> h) noexcept { ps.exit_waiter = h; }
            void await_resume() const noexcept {}
        };
        std::stop_source timer_stop;
        auto timer = [&]() -> task<> {
            try {
                co_await reactor_.sleep_until(deadline, timer_stop.get_token());
            } catch (const std::system_error&) {
                co_return;
            }
            if (ps.exit_waiter) std::exchange(ps.exit_waiter, {}).resume();
        };
        auto waiter = [&]() -> task<> {
            co_await exit_awaiter{ps};
            timer_stop.request_stop();
        };
        co_await when_all(waiter(), timer());
    }

    task<recv_result> recv_frame(std::span<std::byte> buf, int src, frame_kind kind,
                                 std::uint64_t seq, std::int64_t tag, const collective_meta* expect,
                                 op_label what, time_point deadline) {
        if (src != any_source) check_peer(src, what);
        check_usable(what);
        if (src != any_source && peers_[static_cast<std::size_t>(src)].departed &&
            !has_unexpected_from(src, kind, seq, tag)) {
            corocoll::detail::throw_error(corocoll::errc::connection_closed,
                                          "corocoll: rank " + std::to_string(rank_) + ": " +
                                              spell(what) + ": rank " + std::to_string(src) +
                                              " closed its process group");
        }
        posted_recv pr;
        pr.buf = buf;
        pr.src = src;
        pr.kind = kind;
        pr.seq = seq;
        pr.tag = tag;
        pr.expect = expect;
        pr.deadline = deadline;
        if (!take_unexpected(pr) && !hand_to_blocked_reader(pr)) {
            link(pr);
            co_await wait_done(pr);
        } else if (pr.state != posted_recv::done) {
            co_await wait_done(pr);
        }
        if (pr.error) {
            try {
                std::rethrow_exception(pr.error);
            } catch (const std::system_error& e) {
                corocoll::detail::throw_error(e.code(), "corocoll: rank " + std::to_string(rank_) +
                                                            ": " + spell(what) + ": " +
                                                            corocoll::detail::context_of(e));
            }
        }
        co_return recv_result{pr.from, pr.length};
    }

    bool matches(const posted_recv& pr, int p, const frame_header& h) const noexcept {
        return (pr.src == p || pr.src == any_source) && pr.kind == h.kind && pr.tag == h.tag &&
               (h.kind != frame_kind::collective || pr.seq == h.seq);
    }

    // A collective frame of the running collective's sequence number must describe the same
    // call; false (and the group failed) when it does not.
    bool check_active(int p, const frame_header& h) {
        if (!has_active_ || h.kind != frame_kind::collective || h.seq != active_.seq) return true;
        collective_meta theirs = collective_meta::of(h);
        if (theirs == active_) return true;
        fail_verbatim(p, make_error_code(corocoll::errc::protocol_error),
                      "collective #" + std::to_string(active_.seq) +
                          " does not match across ranks: rank " + std::to_string(rank_) +
                          " called " + describe_(active_) + ", rank " + std::to_string(p) +
                          " called " + describe_(theirs));
        return false;
    }

    // A collective message matched by (sequence, step) must also agree on what the call is;
    // if not, the ranks called different things and the group cannot go on.
    bool verify(const posted_recv& pr, int p, const frame_header& h) {
        if (pr.expect == nullptr || h.kind != frame_kind::collective) return true;
        collective_meta theirs = collective_meta::of(h);
        if (theirs == *pr.expect) return true;
        std::string text = "collective #" + std::to_string(pr.expect->seq) +
                           " does not match across ranks: rank " + std::to_string(rank_) +
                           " called " + describe_(*pr.expect) + ", rank " + std::to_string(p) +
                           " called " + describe_(theirs);
        fail_verbatim(p, make_error_code(corocoll::errc::protocol_error), text);
        return false;
    }

    task<> say_goodbyes() {
        auto deadline = io::deadline_after(std::chrono::seconds(5));
        std::vector<task<>> goodbyes;
        for (int p = 0; p < size_; ++p) {
            if (peers_[static_cast<std::size_t>(p)].sock.is_open()) {
                goodbyes.push_back(say_goodbye(p, deadline));
            }
        }
        co_await when_all(std::move(goodbyes));
    }

    task<> close_now() {
        if (!failure_ && !goodbyes_said_) co_await say_goodbyes();
        if (!failure_) {
            failure_ = std::make_exception_ptr(
                std::system_error(std::make_error_code(std::errc::operation_canceled),
                                  "the process group was closed"));
        }
        closing_ = true;
        abort_all();
        co_await readers_.join();
        for (auto& p : peers_) p.sock.close();
    }

    task<> say_goodbye(int p, time_point deadline) {
        peer& ps = peers_[static_cast<std::size_t>(p)];
        auto guard = co_await ps.send_lock.scoped_lock();
        frame_header h;
        h.kind = frame_kind::goodbye;
        h.src = static_cast<std::uint32_t>(rank_);
        h.dst = static_cast<std::uint32_t>(p);
        h.seal();
        try {
            co_await ps.sock.send(std::as_bytes(std::span(&h, 1)), deadline);
        } catch (const std::system_error&) {
            // The peer is gone already; nothing to tell it.
        }
    }

    // Tells peer `q` which rank made this group fail and why, so that it reports the same
    // cause and does not blame us when our connection closes first. Only where no frame is
    // half-sent (the send lock is free); header and text fit the idle socket's buffer, so the
    // non-blocking write does not come up short.
    void tell_abort(int q) {
        peer& p = peers_[static_cast<std::size_t>(q)];
        // The culprit is told too: after a mismatch it is alive and needs the reason (a dead
        // one's socket just refuses the write).
        if (failed_peer_ < 0 || !p.sock.is_open() || p.departed) return;
        if (!p.send_lock.try_lock()) return;
        std::string text = failure_text_.substr(0, 4096);
        frame_header h;
        h.kind = frame_kind::goodbye;
        h.flags = goodbye_abort;
        h.src = static_cast<std::uint32_t>(rank_);
        h.dst = static_cast<std::uint32_t>(q);
        h.root = static_cast<std::uint32_t>(failed_peer_);
        h.count = static_cast<std::uint64_t>(failure_code_.value());
        h.op = failure_code_.category() == corocoll::error_category() ? 1 : 0;
        h.length = text.size();
        h.seal();
        iovec iov[2] = {{&h, sizeof(h)}, {text.data(), text.size()}};
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = 2;
        [[maybe_unused]] auto n =
            ::sendmsg(p.sock.native_handle(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        p.send_lock.unlock();
    }

    // A peer said goodbye: receives that can only be satisfied by it fail; the rest go on.
    void depart(int p) {
        peer& ps = peers_[static_cast<std::size_t>(p)];
        ps.departed = true;
        bool anyone_left = false;
        for (int q = 0; q < size_; ++q) {
            if (q != rank_ && !peers_[static_cast<std::size_t>(q)].departed) anyone_left = true;
        }
        for (posted_recv* pr = head_; pr != nullptr;) {
            posted_recv* next = pr->next;
            if (pr->src == p || (pr->src == any_source && !anyone_left)) {
                unlink(*pr);
                pr->error = std::make_exception_ptr(std::system_error(
                    make_error_code(corocoll::errc::connection_closed),
                    "rank " + std::to_string(p) + " closed its process group before sending"));
                complete(*pr);
            }
            pr = next;
        }
    }

    struct posted_recv {
        enum state_t { waiting, receiving, done };
        std::span<std::byte> buf;
        int src = any_source;
        frame_kind kind = frame_kind::p2p;
        std::uint64_t seq = 0;
        std::int64_t tag = 0;
        const collective_meta* expect = nullptr;
        time_point deadline;
        state_t state = waiting;
        int from = -1;
        std::size_t length = 0;
        std::exception_ptr error;
        posted_recv* prev = nullptr;
        posted_recv* next = nullptr;
        bool linked = false;
        std::coroutine_handle<> waiter;
        // Watches `deadline` while the receive waits for a frame.
        struct deadline_timer : io::timer_entry {
            engine* self = nullptr;
            posted_recv* pr = nullptr;
        } timer;
    };

    struct unexpected_msg {
        frame_header header;
        std::uint64_t arrival = 0;
        std::vector<std::byte> data;
    };

    struct peer {
        io::socket sock;
        std::string address;
        async_mutex send_lock;
        std::deque<unexpected_msg> unexpected;
        std::size_t unexpected_bytes = 0;
        // A reader that holds a header it has nowhere to put (buffer full) waits here.
        const frame_header* blocked = nullptr;
        std::coroutine_handle<> blocked_reader;
        posted_recv* handed = nullptr;
        // The peer closed its group (a goodbye frame): its EOF is no failure.
        bool departed = false;
        bool reader_exited = false;
        std::coroutine_handle<> exit_waiter;
        // What the reader has received and not yet consumed: one receive can bring a header,
        // its payload and further frames, so that a small message costs one system call.
        std::unique_ptr<std::byte[]> staged;
        std::size_t staged_begin = 0;
        std::size_t staged_end = 0;
    };
    static constexpr std::size_t staging_bytes = std::size_t{16} << 10;

    // Reads one frame header into `h`: from what is staged, receiving more when that is short.
    task<> read_header(peer& ps, frame_header& h) {
        while (ps.staged_end - ps.staged_begin < sizeof(h)) {
            std::byte* base = ps.staged.get();
            if (ps.staged_begin > 0) {
                std::memmove(base, base + ps.staged_begin, ps.staged_end - ps.staged_begin);
                ps.staged_end -= ps.staged_begin;
                ps.staged_begin = 0;
            }
            std::size_t n = co_await ps.sock.recv_some(
                std::span(base + ps.staged_end, staging_bytes - ps.staged_end), stop_.get_token());
            if (n == 0) {
                corocoll::detail::throw_error(
                    corocoll::errc::connection_closed,
                    "corocoll: recv from " + ps.address + ": the connection closed");
            }
            ps.staged_end += n;
        }
        std::memcpy(&h, ps.staged.get() + ps.staged_begin, sizeof(h));
        ps.staged_begin += sizeof(h);
    }

    // Moves what is staged into the front of `out`; returns the rest of `out`, which the
    // caller receives from the socket.
    static std::span<std::byte> take_staged(peer& ps, std::span<std::byte> out) noexcept {
        std::size_t n = std::min(ps.staged_end - ps.staged_begin, out.size());
        if (n > 0) std::memcpy(out.data(), ps.staged.get() + ps.staged_begin, n);
        ps.staged_begin += n;
        if (ps.staged_begin == ps.staged_end) ps.staged_begin = ps.staged_end = 0;
        return out.subspan(n);
    }

    // Fills `out` from the peer's stream: what is staged, then the socket.
    static task<> read_payload(peer& ps, std::span<std::byte> out, io::op_options o) {
        std::span<std::byte> rest = take_staged(ps, out);
        o.try_now = true;  // usually the rest of a large payload already waits in the socket
        if (!rest.empty()) co_await ps.sock.recv(rest, o);
    }

    void check_peer(int r, const op_label& what) const {
        if (r < 0 || r >= size_) {
            throw std::invalid_argument("corocoll: rank " + std::to_string(rank_) + ": " +
                                        spell(what) + ": rank " + std::to_string(r) +
                                        " is outside [0, " + std::to_string(size_) + ")");
        }
        if (r == rank_) {
            throw std::invalid_argument("corocoll: rank " + std::to_string(rank_) + ": " +
                                        spell(what) + ": the peer is this rank itself");
        }
    }

    void check_usable(const op_label& what) const {
        if (!failure_) return;
        try {
            std::rethrow_exception(failure_);
        } catch (const std::system_error& e) {
            corocoll::detail::throw_error(e.code(), "corocoll: rank " + std::to_string(rank_) +
                                                        ": " + spell(what) + ": " +
                                                        corocoll::detail::context_of(e));
        }
    }

    // Records the first failure, then ends every pending operation. `detail` adds to what
    // the code says (a protocol problem); socket errors need none.
    void fail(int p, std::error_code code, const std::string& detail) {
        if (failure_) return;
        std::string peer_name = "rank " + std::to_string(p);
        if (p >= 0 && p < size_ && !peers_[static_cast<std::size_t>(p)].address.empty()) {
            peer_name += " (" + peers_[static_cast<std::size_t>(p)].address + ")";
        }
        fail_verbatim(p, code,
                      "peer " + peer_name + " failed" + (detail.empty() ? "" : ": " + detail));
    }

    // Records the first failure with exactly `text` (every rank gets the same words through
    // the abort frames), then ends every pending operation.
    void fail_verbatim(int p, std::error_code code, const std::string& text) {
        if (failure_) return;
        COROCOLL_LOG(warn, "P2P", text, ": ", code.message());
        failure_ = std::make_exception_ptr(std::system_error(code, text));
        failure_text_ = text;
        failed_peer_ = p;
        failure_code_ = code;
        abort_all();
    }

    // Shuts every connection (pending socket operations end at once), completes the waiting
    // receives with the failure and releases blocked readers.
    void abort_all() {
        stop_.request_stop();
        for (std::size_t q = 0; q < peers_.size(); ++q) {
            peer& p = peers_[q];
            tell_abort(static_cast<int>(q));
            p.sock.shutdown();
            if (p.blocked_reader) std::exchange(p.blocked_reader, {}).resume();
        }
        while (head_ != nullptr) {
            posted_recv* pr = head_;
            unlink(*pr);
            pr->error = failure_;
            complete(*pr);
        }
    }

    void link(posted_recv& pr) {
        pr.prev = tail_;
        pr.next = nullptr;
        if (tail_ != nullptr) {
            tail_->next = &pr;
        } else {
            head_ = &pr;
        }
        tail_ = &pr;
        pr.linked = true;
    }
    void unlink(posted_recv& pr) {
        if (!pr.linked) return;
        (pr.prev != nullptr ? pr.prev->next : head_) = pr.next;
        (pr.next != nullptr ? pr.next->prev : tail_) = pr.prev;
        pr.prev = pr.next = nullptr;
        pr.linked = false;
    }

    posted_recv* match_posted(int p, const frame_header& h) {
        for (posted_recv* pr = head_; pr != nullptr; pr = pr->next) {
            if (matches(*pr, p, h)) return pr;
        }
        return nullptr;
    }

    void complete(posted_recv& pr) {
        if (pr.state == posted_recv::done) return;
        pr.state = posted_recv::done;
        reactor_.disarm(pr.timer);
        if (pr.waiter) std::exchange(pr.waiter, {}).resume();
    }

    // Fills `pr` from a buffered message if one matches (the earliest, for any_source).
    bool take_unexpected(posted_recv& pr) {
        peer* from = nullptr;
        std::deque<unexpected_msg>::iterator msg;
        int from_rank = -1;
        for (int p = 0; p < size_; ++p) {
            if (pr.src != any_source && pr.src != p) continue;
            peer& ps = peers_[static_cast<std::size_t>(p)];
            for (auto it = ps.unexpected.begin(); it != ps.unexpected.end(); ++it) {
                if (!matches(pr, p, it->header)) continue;
                if (from == nullptr || it->arrival < msg->arrival) {
                    from = &ps;
                    msg = it;
                    from_rank = p;
                }
                break;
            }
        }
        if (from == nullptr) return false;
        if (!verify(pr, from_rank, msg->header)) {
            pr.error = failure_;
            pr.state = posted_recv::done;
            return true;
        }
        fill_from(pr, from_rank, msg->data);
        from->unexpected_bytes -= msg->data.size();
        from->unexpected.erase(msg);
        // Room freed: a reader held back by the bound may go on.
        if (from->blocked_reader) std::exchange(from->blocked_reader, {}).resume();
        return true;
    }

    bool has_unexpected_from(int p, frame_kind kind, std::uint64_t seq, std::int64_t tag) const {
        for (const auto& m : peers_[static_cast<std::size_t>(p)].unexpected) {
            if (m.header.kind == kind && m.header.tag == tag &&
                (kind != frame_kind::collective || m.header.seq == seq)) {
                return true;
            }
        }
        return false;
    }

    void fill_from(posted_recv& pr, int p, const std::vector<std::byte>& data) {
        pr.from = p;
        pr.length = data.size();
        if (data.size() > pr.buf.size()) {
            pr.error = too_long(p, data.size(), pr.buf.size());
        } else if (!data.empty()) {
            std::memcpy(pr.buf.data(), data.data(), data.size());
        }
        pr.state = posted_recv::done;
    }

    std::exception_ptr too_long(int p, std::size_t len, std::size_t room) const {
        return std::make_exception_ptr(std::system_error(
            make_error_code(corocoll::errc::message_too_large),
            "the message from rank " + std::to_string(p) + " has " + std::to_string(len) +
                " bytes, the receive buffer " + std::to_string(room)));
    }

    // A reader stopped by the buffer bound may hold exactly the header this receive wants.
    bool hand_to_blocked_reader(posted_recv& pr) {
        for (int p = 0; p < size_; ++p) {
            if (pr.src != any_source && pr.src != p) continue;
            peer& ps = peers_[static_cast<std::size_t>(p)];
            if (ps.blocked != nullptr && matches(pr, p, *ps.blocked) && ps.blocked_reader) {
                ps.handed = &pr;
                pr.state = posted_recv::receiving;
                std::exchange(ps.blocked_reader, {}).resume();
                return true;
            }
        }
        return false;
    }

    // Suspends the receiving coroutine until `pr` is done or its deadline passes.
    task<> wait_done(posted_recv& pr) {
        struct done_awaiter {
            posted_recv& pr;
            bool await_ready() const noexcept { return pr.state == posted_recv::done; }
            void await_suspend(std::coroutine_handle<> h) noexcept { pr.waiter = h; }
            void await_resume() const noexcept {}
        };
        if (pr.state == posted_recv::done) co_return;
        if (pr.deadline != time_point::max()) {
            pr.timer.when = pr.deadline;
            pr.timer.fire = &on_recv_deadline;
            pr.timer.self = this;
            pr.timer.pr = &pr;
            reactor_.arm(pr.timer);
        }
        co_await done_awaiter{pr};
        reactor_.disarm(pr.timer);
    }

    // Only a receive still waiting can be withdrawn; one whose payload is arriving ends with
    // its socket operation, which has the same deadline.
    static void on_recv_deadline(io::timer_entry& t) noexcept {
        auto& timer = static_cast<posted_recv::deadline_timer&>(t);
        posted_recv& pr = *timer.pr;
        if (pr.state != posted_recv::waiting) return;
        timer.self->unlink(pr);
        pr.error = std::make_exception_ptr(std::system_error(
            std::make_error_code(std::errc::timed_out), "no matching message arrived in time"));
        timer.self->complete(pr);
    }

    task<> read_loop(int p) {
        peer& ps = peers_[static_cast<std::size_t>(p)];
        ps.staged = std::make_unique_for_overwrite<std::byte[]>(staging_bytes);
        // However the loop ends, a sender waiting for it (see reader_exit) is released.
        struct exit_mark {
            peer& ps;
            ~exit_mark() {
                ps.reader_exited = true;
                if (ps.exit_waiter) std::exchange(ps.exit_waiter, {}).resume();
            }
        } mark{ps};
        posted_recv* delivering = nullptr;
        try {
            for (;;) {
                frame_header h;
                co_await read_header(ps, h);
                if (std::string problem = h.problem(options_.max_message_bytes); !problem.empty()) {
                    corocoll::detail::throw_error(corocoll::errc::protocol_error, problem);
                }
                if (h.kind == frame_kind::goodbye && h.src == static_cast<std::uint32_t>(p)) {
                    if ((h.flags & goodbye_abort) != 0 &&
                        h.root < static_cast<std::uint32_t>(size_)) {
                        auto value = static_cast<int>(h.count);
                        std::error_code code =
                            h.op == 1 ? std::error_code(value, corocoll::error_category())
                                      : std::error_code(value, std::system_category());
                        std::string text(std::min<std::uint64_t>(h.length, 4096), '\0');
                        if (!text.empty()) {
                            try {
                                co_await read_payload(
                                    ps, std::as_writable_bytes(std::span(text.data(), text.size())),
                                    io::deadline_after(std::chrono::seconds(5)));
                            } catch (const std::system_error&) {
                                text.clear();
                            }
                        }
                        std::string by = "reported by rank " + std::to_string(p);
                        if (text.empty()) {
                            fail(static_cast<int>(h.root), code, by);
                        } else {
                            if (text.find("(reported by rank") == std::string::npos) {
                                text += " (" + by + ")";
                            }
                            fail_verbatim(static_cast<int>(h.root), code, text);
                        }
                    } else {
                        depart(p);
                    }
                    co_return;
                }
                if ((h.kind != frame_kind::p2p && h.kind != frame_kind::collective) ||
                    h.src != static_cast<std::uint32_t>(p) ||
                    h.dst != static_cast<std::uint32_t>(rank_)) {
                    corocoll::detail::throw_error(corocoll::errc::protocol_error,
                                                  "unexpected frame kind or ranks in a header");
                }
                if (!check_active(p, h)) co_return;  // the group failed
                posted_recv* pr = match_posted(p, h);
                while (pr == nullptr && h.length > 0 &&
                       ps.unexpected_bytes + h.length > options_.unexpected_bytes_per_peer &&
                       !ps.unexpected.empty()) {
                    ps.blocked = &h;
                    co_await blocked_awaiter{ps};
                    ps.blocked = nullptr;
                    if (closing_ || failure_) co_return;
                    pr = std::exchange(ps.handed, nullptr);
                    if (pr == nullptr) pr = match_posted(p, h);
                }
                if (pr != nullptr && !verify(*pr, p, h)) co_return;  // the group failed
                if (pr != nullptr) {
                    unlink(*pr);
                    pr->state = posted_recv::receiving;
                    delivering = pr;
                    co_await deliver(ps, p, h, *pr);
                    delivering = nullptr;
                    complete(*pr);
                    continue;
                }
                unexpected_msg m{h, arrivals_++, std::vector<std::byte>(h.length)};
                co_await read_payload(ps, m.data, stop_.get_token());
                // A receive may have been posted while the payload arrived.
                if (posted_recv* late = match_posted(p, h)) {
                    if (!verify(*late, p, h)) co_return;
                    unlink(*late);
                    fill_from(*late, p, m.data);
                    late->state = posted_recv::receiving;
                    complete(*late);
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
            if (!closing_) fail(p, e.code(), ours ? corocoll::detail::context_of(e) : "");
        } catch (const std::exception& e) {
            if (!closing_) fail(p, make_error_code(corocoll::errc::protocol_error), e.what());
        }
        if (delivering != nullptr) {
            delivering->error = failure_;
            complete(*delivering);
        }
    }

    struct blocked_awaiter {
        peer& ps;
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<> h) noexcept { ps.blocked_reader = h; }
        void await_resume() const noexcept {}
    };

    // Reads a payload straight into a posted receive's buffer (or drains it when too long).
    task<> deliver(peer& ps, int p, const frame_header& h, posted_recv& pr) {
        io::op_options o(pr.deadline, stop_.get_token());
        pr.from = p;
        pr.length = h.length;
        if (h.length <= pr.buf.size()) {
            co_await read_payload(ps, pr.buf.first(h.length), o);
            co_return;
        }
        std::vector<std::byte> scratch(std::min<std::uint64_t>(h.length, 1 << 20));
        for (std::uint64_t left = h.length; left > 0;) {
            auto n = static_cast<std::size_t>(std::min<std::uint64_t>(left, scratch.size()));
            co_await read_payload(ps, std::span(scratch).first(n), o);
            left -= n;
        }
        pr.error = too_long(p, h.length, pr.buf.size());
    }

    io::reactor& reactor_;
    int rank_;
    int size_;
    engine_options options_;
    std::vector<peer> peers_;
    posted_recv* head_ = nullptr;
    posted_recv* tail_ = nullptr;
    std::uint64_t arrivals_ = 0;
    std::exception_ptr failure_;
    collective_meta active_;
    bool has_active_ = false;
    std::string failure_text_;
    int failed_peer_ = -1;
    std::error_code failure_code_;
    bool closing_ = false;
    bool goodbyes_said_ = false;
    std::stop_source stop_;
    describer describe_ = &describe_raw;
    async_scope readers_;
};

}  // namespace transport

COROCOLL_END_NAMESPACE
