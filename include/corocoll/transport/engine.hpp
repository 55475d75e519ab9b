#pragma once

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
#include <corocoll/transport/peer.hpp>
#include <corocoll/transport/posted_recv.hpp>
#include <corocoll/transport/recv_op.hpp>
#include <corocoll/transport/status.hpp>
#include <corocoll/transport/tcp_channel.hpp>
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

/// A short name held inline (at most `capacity` bytes): what `engine_options::host_tag` holds,
/// so that engine_options stays trivially copyable. g++ 12 copies an aggregate made in a
/// `co_await` expression (`co_await build_group(..., {}, ...)`) into the coroutine's frame
/// bit for bit, which a std::string member does not survive (its buffer pointer still points
/// at the temporary): see docs/architecture.md, "Compiler workarounds".
class inline_name {
public:
    /// The longest name it holds.
    static constexpr std::size_t capacity = 63;
    /// Empty.
    constexpr inline_name() noexcept = default;
    /// Holds `name`; a longer one than `capacity` throws `std::invalid_argument`.
    inline_name(std::string_view name) {  // NOLINT(google-explicit-constructor): a string stands in
        if (name.size() > capacity) {
            throw std::invalid_argument("corocoll: engine_options::host_tag '" + std::string(name) +
                                        "' is longer than " + std::to_string(capacity) + " bytes");
        }
        std::memcpy(text_, name.data(), name.size());
        size_ = static_cast<unsigned char>(name.size());
    }
    /// Holds `name` (see the string_view form).
    inline_name(const char* name) : inline_name(std::string_view(name)) {}  // NOLINT: as above
    /// Holds `name` (see the string_view form).
    inline_name(const std::string& name) : inline_name(std::string_view(name)) {}  // NOLINT
    /// The name.
    std::string_view view() const noexcept { return {text_, size_}; }
    /// True when no name is held.
    bool empty() const noexcept { return size_ == 0; }

private:
    char text_[capacity] = {};
    unsigned char size_ = 0;
};

/// Limits of the point-to-point engine. Trivially copyable (see `inline_name`).
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
    /// Which channel each pair of ranks gets at set-up (see `transport_choice`); unset:
    /// COROCOLL_TRANSPORT, auto when that is unset too.
    std::optional<transport_choice> transport;
    /// Bytes of each direction's ring of a shared-memory channel (a power of two, at least
    /// 64 KiB).
    std::size_t shm_ring_bytes = std::size_t{1} << 20;
    /// Payloads of at least this many bytes travel between ranks that share memory as one
    /// copy from the sender's buffer to the receiver's (process_vm_readv, where the kernel
    /// allows it); 0: always through the ring, two copies that the two ranks make at once.
    /// Off by default: on the 2-core VM this was measured on, process_vm_readv copied at
    /// 3-4 GB/s and the ring at 8-20 GB/s (ping-pong of 1 MiB: 103 µs against 52; all_reduce
    /// of 64 MiB: 37 ms against 11).
    std::size_t shm_single_copy_bytes = 0;
    /// Bytes of each of the two data sets of the arena that a group whose ranks all share
    /// one host maps (transport/shm_arena.hpp), where its shared-memory collectives put their
    /// data; the arena maps twice this plus a page or two. 0: no arena (no shared-memory
    /// collectives).
    std::size_t shm_arena_bytes = std::size_t{1} << 20;
    /// `shm_arena_single_copy_bytes`' default: 16 KiB in a group of 2 ranks, never in a
    /// larger one (on the 2-core VM it was measured on, 4 ranks were slower with single copies:
    /// broadcast of 1 MiB 321-340 µs against 176-228; 2 ranks faster from there: broadcast of
    /// 32 KiB 2.5-2.7 against 3.5-7.9, all_gather of 1 MiB 55-68 against 113-117).
    static constexpr std::size_t automatic_single_copy = ~std::size_t{0};
    /// From this many bytes (of the buffer a rank brings: a broadcast's, one all_gather
    /// block) the arena's broadcast and all_gather copy straight from the other ranks' buffers
    /// (process_vm_readv, one copy instead of two through the arena), where every rank may
    /// read every other's memory (probed at set-up). Rank 0's value holds for the group.
    /// 0: never; `automatic_single_copy`: by the group's size.
    std::size_t shm_arena_single_copy_bytes = automatic_single_copy;
    /// A rank that waits on a shared-memory channel and has polled for its busy-poll time
    /// sleeps in its ring on an io_uring futex wait, which the peer ends with one FUTEX_WAKE,
    /// where the kernel has IORING_OP_FUTEX_WAIT (Linux 6.7, probed at run time); false, or
    /// an older kernel: it sleeps on a receive on the pair's socket, which the peer ends by
    /// sending one byte.
    bool shm_futex_wait = true;
    /// How long a large message that arrives before its receive is left in a shared-memory
    /// channel (the sender waiting for room, or for its single copy) before it is buffered
    /// like any early message. Held, it goes straight into the receive when that comes; the
    /// bound keeps a program whose ranks all send before they receive from stalling. 0:
    /// buffer at once.
    std::chrono::microseconds hold{1000};
    /// When the receives of this rank have waited this long without a frame arriving, the
    /// ranks compare notes (see `engine`): a rank that does not answer, or ranks whose calls
    /// differ, fail the group now; a slow but consistent group is reported at WARN and waits
    /// on. Unset: COROCOLL_STALL_S (seconds), 60 s when that is unset too; 0: never.
    std::optional<std::chrono::milliseconds> stall;
    /// How long a rank that compares notes waits for the answers; a rank that has not
    /// answered by then is taken to be stopped. Unset: a quarter of the stall interval,
    /// between 1 and 10 s (3 s without stall checks).
    std::optional<std::chrono::milliseconds> answer_window;
    /// Splits this machine into hosts of the tag's name: ranks whose tags differ count as
    /// different hosts (they talk over TCP, and the group's topology puts them apart), even
    /// with one boot id and network namespace. Ranks never count as one host by their tags
    /// alone. For tests that lay out several hosts on one machine, and for jobs that want
    /// ranks kept apart (one tag per NUMA node). Empty: the boot id and network namespace
    /// decide. Blanks in it are read as '_'.
    inline_name host_tag;
};
static_assert(std::is_trivially_copyable_v<engine_options>,
              "engine_options must stay trivially copyable (see inline_name)");

/// The stall interval that a COROCOLL_STALL_S value `v` asks for (seconds, a number >= 0;
/// 0: no stall checks), 60 s for null or empty. A value that is not such a number is refused,
/// naming the variable.
COROCOLL_DECL std::chrono::milliseconds parse_stall(const char* v);

/// The stall interval from COROCOLL_STALL_S (see `parse_stall`).
inline std::chrono::milliseconds stall_from_env() {
    return parse_stall(std::getenv("COROCOLL_STALL_S"));
}

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
class engine {
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
        if (readers_.pending() != 0) std::terminate();  // close() was not awaited
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

    /// Fails the group from this rank, as the rank to blame, with `text`: every pending and
    /// later operation here ends with it, and every peer gets it in an abort notice, so theirs
    /// do too (std::errc::operation_canceled). Nothing if the group failed already.
    void abandon(const std::string& text) {
        fail_verbatim(rank_, std::make_error_code(std::errc::operation_canceled), text);
    }

    /// Fails the group with peer `p` to blame, its connection closed (what its channel's end
    /// does), because of `detail`: for a peer found gone outside its channel (a copy from its
    /// memory that found no process). Nothing if the group failed already.
    void peer_gone(int p, const std::string& detail) {
        fail(p, make_error_code(corocoll::errc::connection_closed), detail);
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

    std::string spell(const op_label& l) const { return l.spell(describe_); }

    static std::vector<std::unique_ptr<channel>> tcp_channels(std::vector<io::socket> sockets,
                                                              const engine_options& o);

    static std::exception_ptr closed_error();

    task<> send_frame(std::span<const std::byte> data, int dst, frame_header h, op_label what,
                      time_point deadline);

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

    task<> say_goodbyes();

    task<> close_now();

    task<> say_goodbye(int p, time_point deadline);

    // Tells peer `q` which rank made this group fail and why, so that it reports the same
    // cause and does not blame us when our connection closes first. At once where no frame
    // is being sent (the send lock is free): header and text fit the idle socket's buffer, so
    // the non-blocking write does not come up short. `busy` when a frame is in flight: then
    // farewell() tells it once that frame has ended.
    enum class told { nothing, told, busy };

    told tell_abort(int q);

    // The abort notice for peer `q`: fills `h` and returns the text that follows it.
    std::string abort_words(int q, frame_header& h) const;

    // A frame was in flight to `q` when the group failed (a status answer, say): the failure
    // cancelled its send, so the lock comes free at once. Where the frame went out whole, the
    // abort notice follows it; then the connection shuts.
    task<> farewell(int q);

    // A peer's last words name the rank that made its group fail: this group fails with the
    // same cause and text.
    task<> take_abort(peer& ps, int p, const abort_notice& notice);

    // Peer `p`'s stream ended: if it left an abort notice beside the stream (a frame was cut
    // off), that is the cause; true when it did.
    bool take_last_words(int p);

    void apply_abort(int p, const abort_notice& notice, std::string text);

    // A peer said goodbye: receives that can only be satisfied by it fail; the rest go on.
    void depart(int p);

    void check_peer(int r, const op_label& what) const;

    void check_usable(const op_label& what) const;

    // Records the first failure, then ends every pending operation. `detail` adds to what
    // the code says (a protocol problem); socket errors need none.
    void fail(int p, std::error_code code, const std::string& detail);

    // Records the first failure with exactly `text` (every rank gets the same words through
    // the abort frames), then ends every pending operation.
    void fail_verbatim(int p, std::error_code code, const std::string& text);

    // Shuts every connection (pending socket operations end at once), completes the waiting
    // receives with the failure and releases blocked readers.
    void abort_all();

    // Reads peer `p`'s frames until its connection ends: each goes to the receive posted
    // for it, straight into that buffer, or is kept until one is posted.
    task<> read_loop(int p);

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

    void take_answer(int p, std::uint64_t id, const std::string& bytes);

    // Asks every peer what it is doing, waits for the answers (the answer window at most),
    // then judges them: a receive past its deadline fails the group, naming the rank to
    // blame; a stall fails it only when a rank did not answer or the calls differ.
    task<> run_status_round();

    void start_status_round() noexcept;

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
    // The status round this rank runs (one at a time).
    struct status_round {
        bool running = false;
        std::uint64_t id = 0;
        std::vector<std::optional<detail::rank_status>> answers;
        int missing = 0;
        std::stop_source wake;
    } round_;
    std::string failure_text_;
    int failed_peer_ = -1;
    std::stop_source failed_stop_;
    std::error_code failure_code_;
    bool closing_ = false;
    bool goodbyes_said_ = false;
    std::stop_source stop_;
    describer describe_ = &detail::describe_raw;
    async_scope readers_;
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

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace transport {

COROCOLL_DECL std::chrono::milliseconds parse_stall(const char* v) {
    if (v == nullptr || *v == '\0') return std::chrono::seconds(60);
    char* end = nullptr;
    double seconds = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(seconds >= 0) || seconds > 1e9) {
        throw std::invalid_argument(std::string("corocoll: COROCOLL_STALL_S='") + v +
                                    "' is not a number of seconds >= 0 (0 turns stall checks off)");
    }
    return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

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

#endif  // COROCOLL_DEFINE_BODIES
