#pragma once

// The point-to-point engine: sends, matched receives, the readers of every peer, collective
// checks, the stall round and the group's failure and close (docs/architecture.md,
// "Point-to-point engine"). Its bodies are in impl/, one file per job: engine.ipp (sends,
// posted receives, call checks), engine_read.ipp (the readers), engine_close.ipp (the close
// protocol and failure), engine_status.ipp (the stall timer, this rank's answers, and the
// engine's side of the status round, which status_round.hpp runs).

#include <corocoll/core/async_scope.hpp>
#include <corocoll/core/error.hpp>
#include <corocoll/core/log.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/core/when_all.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/io/socket.hpp>
#include <corocoll/transport/channel.hpp>
#include <corocoll/transport/frame.hpp>
#include <corocoll/transport/matching.hpp>
#include <corocoll/transport/options.hpp>
#include <corocoll/transport/peer.hpp>
#include <corocoll/transport/posted_recv.hpp>
#include <corocoll/transport/recv_op.hpp>
#include <corocoll/transport/status.hpp>
#include <corocoll/transport/status_round.hpp>
#include <corocoll/transport/tcp/channel.hpp>
#include <corocoll/transport/tcp/lazy_mesh.hpp>
#include <corocoll/version.hpp>

#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// How a group ended, as every rank reports it (`engine::report`).
struct failure_report {
    /// What kind of failure it was.
    failure_cause cause = failure_cause::blamed;
    /// The rank it names: the one that failed or is to blame, the one that revoked the
    /// group; -1 when none (a close).
    int rank = -1;
    /// The ranks this rank knows to have failed (`engine::failed_ranks`).
    std::vector<int> failed_ranks;
    /// The error every pending and later operation of the group ends with.
    std::string what;
};

/// Point-to-point messaging over a mesh of connections, on one reactor: the transport under
/// a process group. Messages are matched by (source, tag) in the order receives were posted;
/// between one pair of ranks, messages with the same tag never overtake each other. A posted
/// receive is filled straight from the socket; a message that arrives first is buffered
/// (one copy). The first failure of any peer (closed connection, reset, timeout mid-message,
/// a broken header) fails every pending operation and every later one with an error naming
/// that peer; the engine is then unusable. Must be `close()`d before it is destroyed.
///
/// A rank that gives up on a peer fails the whole group, and tells every peer the rank to
/// blame: every rank reports the same cause. When a receive's deadline passes, or when this
/// rank's receives made no progress for the stall interval, the engine asks every peer what
/// it is doing (a status query over the same connections; the readers answer it, whatever
/// the program is doing, as long as its reactor runs). A rank that does not answer within the
/// answer window is the one that stopped; ranks whose collectives differ are a divergence;
/// both fail the group at once, with a report of what each rank was doing. Every collective
/// frame carries a fingerprint of its sender's earlier collectives, and a frame of a
/// collective that this rank ran differently fails the group when it arrives.
class engine final : private status_round::host {
    using posted_recv = detail::posted_recv;
    using peer = detail::peer;
    using op_label = detail::op_label;

public:
    /// Deadlines are points on the steady clock.
    using time_point = std::chrono::steady_clock::time_point;

    /// Over one channel per rank, indexed by rank (null for this rank and where none is).
    engine(io::reactor& r, int rank, int size, std::vector<std::unique_ptr<channel>> channels,
           engine_options options = {});
    /// Over one connected socket per rank (TCP channels).
    engine(io::reactor& r, int rank, int size, std::vector<io::socket> sockets,
           engine_options options = {})
        : engine(r, rank, size, tcp_channels(std::move(sockets), options), options) {}
    engine(const engine&) = delete;
    engine& operator=(const engine&) = delete;
    ~engine() {
        // close() was not awaited
        if (readers_.pending() != 0 || acceptors_.pending() != 0) std::terminate();
    }

    /// This rank in the group.
    int rank() const noexcept { return rank_; }
    /// Ranks in the group.
    int size() const noexcept { return size_; }
    /// The reactor the engine's operations run on.
    io::reactor& reactor() const noexcept { return reactor_; }

    /// True once a peer failed or the engine was closed.
    bool failed() const noexcept { return static_cast<bool>(failure_); }
    /// Stopped when the group fails (a peer's end, a timeout, an abort notice, a mismatch):
    /// for work outside the group that must end with it (the set-up of a group made from
    /// this one).
    std::stop_token failure_token() const noexcept { return failed_stop_.get_token(); }
    /// The rank blamed for the failure (-1: none, or not failed).
    int failed_peer() const noexcept { return failed_peer_; }
    /// What the group's failure says ("" when it has not failed).
    std::string failure_what() const {
        if (!failure_) return {};
        try {
            std::rethrow_exception(failure_);
        } catch (const std::exception& e) {
            return e.what();
        } catch (...) {
            return "an unknown error";
        }
    }

    /// What kind of failure ended the group (`closed` once it was closed without one);
    /// `blamed` while it has not failed.
    failure_cause cause() const noexcept { return cause_; }
    /// The ranks this rank knows to have failed (ended or stopped: the rank blamed by a
    /// `failure_cause::rank_failed` failure). Empty while the group is sound, and when it
    /// ended for another reason (a revoke, a mismatch, a close).
    std::vector<int> failed_ranks() const {
        if (cause_ == failure_cause::rank_failed && failed_peer_ >= 0) return {failed_peer_};
        return {};
    }

    /// Fails the group from this rank, as the rank to blame, with `text`: every pending and
    /// later operation here ends with it, and every peer gets it in an abort notice, so theirs
    /// do too (std::errc::operation_canceled). Nothing if the group failed already.
    void abandon(const std::string& text) {
        fail_verbatim(rank_, std::make_error_code(std::errc::operation_canceled), text);
    }

    /// Revokes the group from this rank (MPI's MPIX_Comm_revoke): every pending and later
    /// operation on every live rank ends with `text` (std::errc::operation_canceled), and
    /// nobody is taken for failed. Every rank that learns of it tells every peer before its
    /// connections shut, so the word spreads even if this rank dies right after. Nothing if
    /// the group failed already.
    void revoke(const std::string& text) {
        fail_verbatim(rank_, std::make_error_code(std::errc::operation_canceled), text,
                      failure_cause::revoked);
    }

    /// `co_await`ed (on the engine's reactor): completes once the group has failed or was
    /// closed, at once if it has; see `until_failed`.
    class failure_wait {
    public:
        /// Waits for `e`'s failure (see `until_failed`).
        explicit failure_wait(engine& e) noexcept : e_(&e) {}
        failure_wait(const failure_wait&) = delete;
        failure_wait& operator=(const failure_wait&) = delete;
        ~failure_wait() { unlink(); }
        bool await_ready() {
            if (e_->failure_ == nullptr) return false;
            report_ = e_->report();
            return true;
        }
        void await_suspend(std::coroutine_handle<> h) noexcept;
        failure_report await_resume() noexcept { return std::move(report_); }

    private:
        friend class engine;
        void unlink() noexcept;

        struct resume_item : corocoll::detail::work_item {
            std::coroutine_handle<> waiter;
        };
        engine* e_;
        // Taken when the failure is known: the engine may be gone by the time the waiter
        // runs (a group closed and deleted).
        failure_report report_;
        resume_item item_;
        failure_wait* prev_ = nullptr;
        failure_wait* next_ = nullptr;
        bool linked_ = false;
    };
    /// An awaitable that completes once the group has failed (a peer's end, a revoke, a
    /// mismatch, a timeout) or was closed, yielding the `report` of that moment: for a
    /// supervisor coroutine that reacts to a failure while others go on computing. It is
    /// resumed from the reactor's queue, never from inside the failure's own path.
    failure_wait until_failed() noexcept { return failure_wait(*this); }

    /// How the group ended: cause, rank, failed ranks and text (meaningful once `failed()`).
    failure_report report() const {
        failure_report r;
        r.cause = cause_;
        r.rank = cause_ == failure_cause::closed ? -1 : failed_peer_;
        r.failed_ranks = failed_ranks();
        r.what = failure_what();
        return r;
    }

    /// Fails the group with peer `p` to blame, its connection closed (what its channel's end
    /// does), because of `detail`: for a peer found gone outside its channel (a copy from its
    /// memory that found no process). Nothing if the group failed already.
    void peer_gone(int p, const std::string& detail) {
        fail(p, make_error_code(corocoll::errc::connection_closed), detail);
    }

    /// Peer `p` left a collective with an error while this rank copied from its memory (it
    /// withdrew what it offered): fails the group as p's abort notice says, where p left one
    /// beside its channel when its group failed (a shared-memory channel keeps it), so that
    /// the copier reports the failure p saw rather than p's leaving. True where it did, or
    /// where the group failed already.
    bool fail_as_left_by(int p) {
        if (failure_) return true;
        return peer_at(p).link != nullptr && abort_notice_left_by(p);
    }

    /// Sends `data` to `dst` with `tag`; completes when the bytes are handed to the kernel.
    task<> send(std::span<const std::byte> data, int dst, std::int64_t tag, time_point deadline);

    /// Sends one step of a collective: `meta` travels with it and the receiver checks it.
    task<> send_coll(std::span<const std::byte> data, int dst, const collective_meta& meta,
                     std::uint32_t step, time_point deadline);

    /// Receives one step of a collective from `src` into `buf`; yields the length. A message
    /// whose metadata differs from `meta` (another collective, size, root, op or type on that
    /// rank) fails the whole group with a message naming both calls, on every rank.
    /// With `soft_deadline`, the deadline ends only this receive (see `context`).
    recv_op<recv_yields::length> recv_coll(std::span<std::byte> buf, int src,
                                           const collective_meta& meta, std::uint32_t step,
                                           time_point deadline, bool soft_deadline = false);

    /// Declares the collective this rank runs now (collectives of a group run one at a time)
    /// and stamps `meta.history` with the fingerprint of the ones before it: any frame of the
    /// same sequence number that disagrees with it, already buffered or arriving later, from
    /// whichever rank, is a mismatch at once, even if no posted receive would ever match it.
    /// `end_collective` when done.
    void begin_collective(collective_meta& meta);
    /// The running collective is over (done or failed): it joins the fingerprint.
    void end_collective() noexcept;
    /// How many buffered frames `begin_collective` has looked at, in all (a count for tests:
    /// each early frame is looked at about once, however far ahead its sender ran).
    std::uint64_t frames_checked_at_begin() const noexcept { return frames_checked_at_begin_; }

    /// Whether a collective that just ended must first let the readers catch up
    /// (`catch_up`): true when this rank's reactor did not run for a while (stopped, or its
    /// thread held elsewhere), so messages and, behind them, abort notices may wait unread.
    bool must_catch_up() const noexcept { return !failure_ && (paused() || was_paused_); }
    /// Lets the readers go through what has arrived: short waits in the reactor (5 ms each)
    /// until two in a row bring no frame, or the group failed; at most 20 (100 ms). One wait
    /// was not always enough: a loaded or instrumented (TSan) process woken from SIGSTOP
    /// could end a collective before its readers reached the abort notices queued behind its
    /// last message.
    task<> catch_up();

    /// Throws the group's failure, as an error of collective `meta`, if the group failed: a
    /// call that completes after its group failed does not count as done.
    /// `place` says where the call waited when not on a message ("shared-memory step").
    void raise_if_failed(const collective_meta& meta, const char* place = nullptr) const;

    /// A wait outside the message stream (a shared-memory collective waiting for ranks to
    /// reach a step of a shared arena) begins: until `end_shared_wait`, the stall checks count
    /// it as waiting, and status answers say this rank waits for `ranks` (the ranks it has not
    /// seen yet, kept by the caller while the wait lasts).
    void begin_shared_wait(std::span<const int> ranks) noexcept {
        shared_waiting_ = ranks;
        shared_wait_ = true;
    }
    /// The shared wait is over; `progressed` counts as a frame for the stall checks.
    void end_shared_wait(bool progressed) noexcept {
        shared_wait_ = false;
        shared_waiting_ = {};
        if (progressed) ++frames_in_;
    }
    /// The shared wait reached its deadline while waiting for `culprit` (in `what`): the
    /// ranks are asked who to blame, as for a receive past its deadline, and the group fails.
    void shared_wait_expired(int culprit, std::string what);
    /// Checks what rank `p` declared for a collective (read from a shared arena) against this
    /// rank's call `mine`: false, and the group failed naming both calls, when they differ.
    bool check_call(int p, const collective_meta& mine, const collective_meta& theirs) {
        if (theirs == mine) return true;
        return mismatch(p, mine, theirs);
    }

    /// What the readers did with messages that came before their receive (`engine_options::
    /// hold`), counted since the engine was made. Only on the reactor's thread.
    struct hold_counts {
        /// Messages a reader left in their channel to wait for their receive.
        std::uint64_t held = 0;
        /// Of those, the ones whose receive came while they were held and took them.
        std::uint64_t taken = 0;
        /// Of those, the ones whose hold ran out (they were then buffered or taken as any
        /// message).
        std::uint64_t expired = 0;
        /// Of the expired ones, those whose receive had been posted before the hold ran out:
        /// a receive that waited for the hold's timer instead of being handed the message.
        /// Never more than 0 unless the hand-off is broken.
        std::uint64_t expired_with_receive = 0;
        /// Of those, the ones whose hold a receive from their peer that they did not match
        /// ended (they were then buffered).
        std::uint64_t released = 0;
        /// Messages read whole into a buffer because no receive had come for them (held
        /// first or not).
        std::uint64_t buffered = 0;
    };
    /// See `hold_counts`.
    const hold_counts& holds() const noexcept { return holds_; }

    /// How long a stall lasts before the ranks compare notes (0: never), and how long they
    /// wait for each other's answers.
    std::chrono::milliseconds stall_interval() const noexcept { return *options_.stall; }
    /// How long a stall report waits for the other ranks' answers.
    std::chrono::milliseconds answer_window() const noexcept { return *options_.answer_window; }

    /// How collective metadata reads in error messages ("all_reduce(sum, float32 x 100)");
    /// the collectives layer installs its own.
    using describer = detail::describer;
    /// Installs `d` to describe collective metadata in error messages.
    void set_describer(describer d) noexcept { describe_ = d; }
    /// `m` as error messages describe it.
    std::string describe(const collective_meta& m) const { return describe_(m); }

    /// Opens the connections this engine was made without on first use, through `m` (the
    /// set-up's listener and every peer's address): a send to such a peer (a message, a status
    /// question) dials it first, and the connections peers dial are taken. Where two ranks dial
    /// each other at once, the lower rank's connection is the pair's. A peer that cannot be
    /// reached fails the group with it to blame, as a connection that ends does. A group that
    /// failed still takes connections, to tell their dialers why in an abort notice. Call once,
    /// right after construction.
    COROCOLL_DECL void open_on_first_use(std::unique_ptr<lazy_mesh> m);

    /// The kind of channel to rank `p` ("tcp", "shm"); empty for this rank.
    const char* channel_kind(int p) const noexcept {
        return p >= 0 && p < size_ && peer_at(p).link ? peer_at(p).link->kind() : "";
    }

    /// Receives a message with `tag` from `src` (or `any_source`) into `buf`; yields the sender
    /// and the length (or, with `Y`, only one of them). A message longer than `buf` is an
    /// error (the message is consumed).
    template <recv_yields Y = recv_yields::result>
    recv_op<Y> recv(std::span<std::byte> buf, int src, std::int64_t tag, time_point deadline) {
        op_label what;
        what.peer = src;
        what.tag = tag;
        return {*this, buf, src, frame_kind::p2p, 0, tag, what, deadline};
    }

    /// Says goodbye to every peer (after whatever this rank already sent, so they get all of
    /// it and can tell a departure from a crash), stops the readers, closes every connection
    /// and fails whatever is still pending here. With `linger_until`, it first waits (until
    /// then at most) for every peer to say goodbye or disconnect: what a rank that serves the
    /// others' store does, so that nobody loses the store while still using it.
    task<> close(time_point linger_until = {});

private:
    template <recv_yields>
    friend class recv_op;

    peer& peer_at(int p) noexcept { return peers_[static_cast<std::size_t>(p)]; }
    const peer& peer_at(int p) const noexcept { return peers_[static_cast<std::size_t>(p)]; }

    std::string describe_op(const op_label& l) const { return l.spell(describe_); }

    static std::vector<std::unique_ptr<channel>> tcp_channels(std::vector<io::socket> sockets,
                                                              const engine_options& o);

    static std::exception_ptr closed_error();

    task<> send_frame(std::span<const std::byte> data, int dst, frame_header h, op_label what,
                      time_point deadline);

    // ---- connections on first use (`open_on_first_use`) ----

    // Gives peer `p` a connection (`lazy_` set), with the send lock held: dials it, or waits
    // for the peer's own connection where the pair's rule keeps that one, until `deadline`.
    // Throws nothing: the caller finds `p`'s link set, or the group failed (a dial that went
    // wrong), or `p` taken as gone (nobody listens for it: `peer_left`), or none of these (the
    // deadline came first). `for_status`: a status frame's dial, for which a dial that timed
    // out fails nothing: no answer comes from `p` then, and the status round judges that (a
    // failure of its own, at the round's deadline, would race the round's verdict).
    task<> open_link(int p, time_point deadline, bool for_status = false);
    // Dials `p` for a receive posted for it (unless a connection came meanwhile).
    task<> open_for_recv(int p, time_point deadline);
    // Returns once the group has failed or closes, or `until` passed.
    task<> until_failed_or(time_point until);
    // How long a send cut off by a peer waits for that peer's last frame, and a dial that
    // finds a peer gone for the group's failure: a peer that failed the group sent its cause
    // (to this rank, or around the ring), and that cause, not the closed socket, is what this
    // rank reports.
    static constexpr std::chrono::seconds last_words_grace{1};
    // Takes the connections that peers dial, until the engine shuts down.
    task<> accept_links();
    // One dialled connection: its handshake, this rank's verdict, the channel attached.
    task<> take_link(io::socket s);
    // `p`'s connection is `ch` from now on: its reader starts (or, where the group failed,
    // the abort notice goes out on it and it shuts).
    void attach(int p, std::unique_ptr<channel> ch);

    // ---- posted receives ----

    // Posts `pr`: fills it at once from a buffered message, or hands it to a reader held back
    // by the buffer bound, or queues it (deadline armed) for the readers to match.
    void post(posted_recv& pr, const op_label& what);

    [[noreturn]] void rethrow(const posted_recv& pr, const op_label& what) const;

    // A collective frame must describe the same call as this rank's of that number: the
    // running one, or one it finished (and still remembers). False (and the group failed)
    // when it does not. A frame of a finished collective that this rank called the same way
    // is left alone (monitored_barrier's late arrivals).
    bool check_active(int p, const frame_header& h);

    // A collective message matched by (sequence, step) must also agree on what the call is;
    // if not, the ranks called different things and the group cannot go on.
    bool verify(const posted_recv& pr, int p, const frame_header& h);

    // Rank `p` called `theirs` where this rank called `mine`: the group fails, naming both.
    bool mismatch(int p, const collective_meta& mine, const collective_meta& theirs);

    // "#7 all_reduce(...), #8 broadcast(...)": the last collectives this rank finished.
    std::string recent_calls() const;

    // ---- the close protocol (docs/architecture.md, "Closing and failing") ----
    //
    // Two notices end a pair's stream. A *goodbye* says "I close in order; everything I sent
    // is before this": the peer's receives that only this rank could satisfy fail, the rest
    // go on. An *abort notice* says "the group failed, rank X is to blame, because T": the
    // peer fails with the same culprit and text. An abort notice goes in the stream when no
    // frame is in flight, after the frame when one is, and beside the stream (the channel's
    // last words) where a frame may be cut off. Then the engine *shuts down*: readers stopped,
    // channels closed.

    // Sends a goodbye to every connected peer (5 s at most).
    task<> send_goodbyes();

    // Sends a goodbye to `p`, after whatever this rank already sent it.
    task<> send_goodbye(int p, time_point deadline);

    // A goodbye came from `p` (or, `how` saying so, a connection on first use found nobody
    // where `p` listened): receives that only `p` could satisfy fail; the rest go on.
    void peer_left(int p, const std::string& how = {});

    // The error of an operation `what` with peer `p`, which left (`peer_left`).
    [[noreturn]] void throw_left(int p, const op_label& what) const;

    // Stops the stall timer, sends goodbyes unless the group failed or they went already,
    // fails what is pending, stops the readers and closes every channel.
    task<> shut_down();

    // How `send_abort_notice` went: not sent (no failure to tell, or the peer is gone or
    // left), sent now, or to go after the frame in flight (`send_abort_notice_after_frame`).
    enum class notice_sent { no, now, after_frame };

    // Tells peer `q` which rank made this group fail and why, so that it reports the same
    // cause and does not blame us when our connection closes first. At once where no frame
    // is being sent (the send lock is free): header and text fit the idle socket's buffer, so
    // the non-blocking write does not come up short. Also left beside the stream.
    notice_sent send_abort_notice(int q);

    // The abort notice for peer `q`: fills `h` and returns the text that follows it.
    std::string abort_notice_to(int q, frame_header& h) const;

    // A frame was in flight to `q` when the group failed (a status answer, say): the failure
    // cancelled its send, so the lock comes free at once. Where the frame went out whole, the
    // abort notice follows it; then the connection shuts.
    task<> send_abort_notice_after_frame(int q);

    // An abort notice came in `p`'s stream: reads its text, then `fail_as_notice_says`.
    task<> receive_abort_notice(peer& ps, int p, const abort_notice& notice);

    // Peer `p`'s stream ended: if it left an abort notice beside the stream (a frame was cut
    // off), that is the cause; true when it did.
    bool abort_notice_left_by(int p);

    // This group fails with the notice's culprit, code and text (marked as reported by `p`).
    void fail_as_notice_says(int p, const abort_notice& notice, std::string text);

    void check_peer(int r, const op_label& what) const;

    void check_usable(const op_label& what) const;

    // Records the first failure, then ends every pending operation. `detail` adds to what
    // the code says (a protocol problem); socket errors need none. Without `cause`, the
    // code says whether `p` is gone (`cause_of`).
    void fail(int p, std::error_code code, const std::string& detail) {
        fail(p, code, detail, cause_of(code));
    }
    void fail(int p, std::error_code code, const std::string& detail, failure_cause cause);

    // Records the first failure with exactly `text` (every rank gets the same words through
    // the abort frames), then ends every pending operation. `cause`: what kind of failure
    // it is (see `failure_cause`).
    void fail_verbatim(int p, std::error_code code, const std::string& text,
                       failure_cause cause = failure_cause::blamed);

    // What a peer's connection that ended with `code` says of the peer: gone (its stream
    // ended without a goodbye, or was reset) or only to blame (a protocol error, a timeout).
    static failure_cause cause_of(std::error_code code) noexcept;

    // Hands every `failure_wait` to the reactor's queue: the group failed or closes.
    void wake_failure_waiters() noexcept;

    // Shuts every connection (pending socket operations end at once), completes the waiting
    // receives with the failure and releases blocked readers.
    void abort_all();

    // Reads peer `p`'s frames until its connection ends: each goes to the receive posted
    // for it, straight into that buffer, or is kept until one is posted.
    task<> read_loop(int p);

    // A frame that is not a message (a goodbye, an abort notice, a status query or answer)
    // from `p`: handled, and true when the reader goes on (false: the stream has ended).
    // Malformed ones are protocol errors.
    task<bool> take_control_frame(peer& ps, int p, const frame_header& h);

    // A protocol error naming the frame `h` that came from `p` where it has no place (its
    // kind, or its ranks, are not what this connection carries).
    [[noreturn]] void throw_unexpected_frame(int p, const frame_header& h) const;

    // Completes `pr`, whose message is in, at once; or, when more of this peer's bytes are
    // already staged behind it, once the reader has gone through them (before it waits
    // again). A rank that was stopped finds the message that ends a collective and, behind
    // it, the abort notice of a peer that has given up on it: the notice is read before the
    // collective's owner resumes, so the call is not reported done.
    void complete_after_staged(peer& ps, posted_recv& pr);

    // Completes what `complete_after_staged` held back, in order; with the group's failure if
    // it failed meanwhile.
    void complete_deferred(peer& ps);

    // A reader that held back header `h` (`ps.blocked`) goes on: with the receive handed to
    // it meanwhile, else whatever matches now (in `pr`). False when the group failed or is
    // closing: a receive handed over meanwhile is in no queue, so it ends here.
    bool unblocked(peer& ps, int p, const frame_header& h, posted_recv*& pr);

    // A receive `pr` just queued ends the holds of the messages it does not match from the
    // peers it may take from (engine_options::hold): it may need what is behind them.
    void release_holds(const posted_recv& pr);

    // How long a reader holds message `h` before it buffers it (engine_options::hold,
    // collective_hold).
    std::chrono::microseconds hold_for(const frame_header& h) const noexcept;

    // ---- status queries: who is stuck, and who to blame ----

    // True when the stall timer is overdue by more than 10 ms: the reactor has not run for a
    // while. Read from the coarse clock (a few ns; the same clock as steady_clock, at a
    // resolution of a few ms), so every collective can afford it.
    bool paused() const noexcept;

    // What this rank does now, as it answers a status query.
    detail::rank_status my_status() const;

    bool anything_waits();

    // "collective #3 broadcast(root 0, ...)" or "recv from rank 1 (tag 7)": what `pr` is for.
    std::string describe_wait(const posted_recv& pr) const;

    // Sends a status frame (`h`, then `payload`) to `p` once its connection is free, unless
    // the group failed or `until` passed meanwhile. A frame cut off by `until` or an error
    // fails the group: the stream could not go on.
    task<> send_status_frame(int p, frame_header h, std::string payload, time_point until);

    // Peer `p` asks what this rank is doing (question `id`): the answer goes out as soon as
    // the connection is free.
    void answer(int p, std::uint64_t id);

    // Starts a status round (`round_`) unless one runs or the group failed or closes.
    void start_status_round() noexcept;

    // What the status round asks of the engine (status_round::host). The virtual functions
    // defined in impl/ carry COROCOLL_DECL here too (docs/architecture.md, "Compile time and
    // separate compilation").
    detail::rank_status status_now() const override { return my_status(); }
    bool can_ask(int p) const noexcept override {
        const peer& ps = peer_at(p);
        // A peer not connected yet is asked too where connections open on first use: the
        // question dials it.
        return !ps.said_goodbye && (ps.connected() || (ps.link == nullptr && lazy_ != nullptr));
    }
    COROCOLL_DECL void ask(int p, std::uint64_t id, time_point until) override;
    bool ended() const noexcept override { return failure_ || closing_; }
    COROCOLL_DECL status_round::subject round_subject() const override;
    void fail_group(int culprit, std::error_code code, const std::string& text,
                    bool stopped) override {
        fail_verbatim(culprit, code, text,
                      stopped ? failure_cause::rank_failed : failure_cause::blamed);
    }
    COROCOLL_DECL void stall_explained(const std::string& report) override;

    // A receive's deadline passed (it waits in the expired queue): the group fails once the
    // ranks have been asked who to blame.
    static void on_expired(void* self, posted_recv&) noexcept {
        static_cast<engine*>(self)->start_status_round();
    }

    // Every quarter of the stall interval: if something has waited without a frame arriving
    // for the whole interval, the ranks compare notes.
    static void on_stall_timer(io::timer_entry& t) noexcept;

    std::chrono::milliseconds timer_period() const noexcept {
        return stall_interval().count() > 0 ? stall_interval() / 4 : std::chrono::seconds(1);
    }

    // Waits through `channel::await_readable`; yields true when it waited (the reader then
    // looks again), false when the channel could not wait that way (the reader then calls
    // `recv_some`). A reader kicked because the engine stops ends as a stopped receive does.
    struct readable_awaiter {
        channel& link;
        const std::stop_source& stop;
        bool waited = false;
        bool await_ready() const noexcept { return false; }
        bool await_suspend(std::coroutine_handle<> h) noexcept {
            waited = link.await_readable(h);
            return waited;
        }
        bool await_resume() const {
            if (waited && stop.stop_requested()) {
                corocoll::detail::throw_error(std::make_error_code(std::errc::operation_canceled),
                                              "corocoll: recv from " + std::string(link.kind()));
            }
            return waited;
        }
    };

    struct blocked_awaiter {
        peer& ps;
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<> h) noexcept { ps.blocked_reader = h; }
        void await_resume() const noexcept {}
    };

    // The part of a payload that was not staged: `rest` straight from the socket into the
    // receive's buffer, or, for a message too long for the receive, the whole of it read and
    // dropped. Only a message that did not arrive whole with its header comes here (one
    // coroutine frame, from the pool).
    static task<> deliver(peer& ps, int p, const frame_header& h, std::span<std::byte> rest,
                          io::op_options o);
    // Reads the next `bytes` of `ps`'s stream (staged first) and drops them: the rest of a
    // message too long for its receive, or of one whose receive was dropped.
    static task<> skip_payload(peer& ps, std::uint64_t bytes, io::op_options o);

    io::reactor& reactor_;
    int rank_;
    int size_;
    engine_options options_;
    std::vector<peer> peers_;
    detail::matcher matching_{reactor_, peers_};
    std::exception_ptr failure_;
    collective_meta active_;
    bool has_active_ = false;
    // The collectives this rank finished: how many, their fingerprint, the last 64 calls.
    std::uint64_t done_seq_ = 0;
    std::uint32_t fingerprint_ = 0;
    std::array<collective_meta, 64> remembered_{};
    // Progress, for the stall checks: frames that arrived, sends that wait for room, and when
    // the count last moved (or nothing waited).
    std::uint64_t frames_in_ = 0;
    std::uint64_t frames_checked_at_begin_ = 0;
    hold_counts holds_;
    // The stall timer fired late (the reactor did not run for a while) since the last
    // `catch_up`: a collective that ends now must first read what arrived meanwhile, even
    // though the timer, having fired, no longer looks overdue. A shared-memory step, which
    // needs no message, completed on a rank woken from SIGSTOP before it read the abort
    // notices that the others had sent while it slept.
    bool was_paused_ = false;
    // A shared wait (see `begin_shared_wait`), and one that reached its deadline.
    bool shared_wait_ = false;
    std::span<const int> shared_waiting_{};
    bool shared_expired_ = false;
    int shared_culprit_ = -1;
    std::string shared_what_;
    std::uint64_t frames_at_check_ = 0;
    int sends_waiting_ = 0;
    time_point progress_at_ = std::chrono::steady_clock::now();
    struct stall_timer_entry : io::timer_entry {
        engine* owner = nullptr;
    } stall_timer_;
    // The status round this rank runs when it waits too long (one at a time).
    status_round round_{*this, reactor_, rank_, size_};
    std::string failure_text_;
    int failed_peer_ = -1;
    std::stop_source failed_stop_;
    std::error_code failure_code_;
    failure_cause cause_ = failure_cause::blamed;
    // The coroutines waiting in `until_failed`, a list through their awaiters.
    failure_wait* failure_waiters_ = nullptr;
    bool closing_ = false;
    bool goodbyes_sent_ = false;
    std::stop_source stop_;
    describer describe_ = &detail::describe_raw;
    async_scope readers_;
    // Connections on first use: the dialling and answering side, the loop that takes the
    // peers' connections and the handshakes in flight (apart from the readers, which a close
    // that lingers joins while peers leave), stopped only when the engine shuts down.
    std::unique_ptr<lazy_mesh> lazy_;
    std::stop_source accepting_;
    async_scope acceptors_;
};

template <recv_yields Y>
recv_op<Y>::~recv_op() {
    if (pr_.state != detail::posted_recv::idle && pr_.state != detail::posted_recv::done) {
        engine_->matching_.withdraw(pr_);
    }
}

template <recv_yields Y>
void recv_op<Y>::start() {
    if (pr_.state == detail::posted_recv::idle) engine_->post(pr_, what_);
}

template <recv_yields Y>
auto recv_op<Y>::result() {
    if (early_) std::rethrow_exception(early_);
    if (pr_.error) engine_->rethrow(pr_, what_);
    if constexpr (Y == recv_yields::source) {
        return pr_.from;
    } else if constexpr (Y == recv_yields::length) {
        return pr_.length;
    } else {
        return recv_result{pr_.from, pr_.length};
    }
}

}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/impl/engine.ipp>
#include <corocoll/transport/impl/engine_close.ipp>
#include <corocoll/transport/impl/engine_read.ipp>
#include <corocoll/transport/impl/engine_status.ipp>
#endif
