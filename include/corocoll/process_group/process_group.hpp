#pragma once

// `process_group`, the class users read: point-to-point messages and collectives between the
// ranks of a group, each an awaitable, with torch.distributed's names.

#include <corocoll/collectives/checks.hpp>
#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/dispatch.hpp>
#include <corocoll/collectives/dtype.hpp>
#include <corocoll/collectives/object.hpp>
#include <corocoll/collectives/reduce_op.hpp>
#include <corocoll/collectives/reduction.hpp>
#include <corocoll/collectives/select.hpp>
#include <corocoll/collectives/topology.hpp>
#include <corocoll/core/async_mutex.hpp>
#include <corocoll/core/cache_sizes.hpp>
#include <corocoll/core/error.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/core/work.hpp>
#include <corocoll/io/endpoint.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/process_group/buffer.hpp>
#include <corocoll/process_group/collective_call.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/rendezvous/tcp_store.hpp>
#include <corocoll/transport/engine.hpp>
#include <corocoll/transport/shm/arena.hpp>
#include <corocoll/version.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <ranges>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

/// `recv`/`irecv` from whichever rank sends first.
inline constexpr int any_source = transport::any_source;

/// The ranks of a group to make (`new_group`): a `std::vector<int>`, or a braced list such as
/// `{0, 1}`, torch's `[0, 1]`. The braced list reaches the constructor as separate ints, so no
/// initializer_list array is kept in the caller's coroutine frame, which g++ 12 cannot
/// compile ("array used as initializer") inside `co_await`.
class rank_list {
public:
    /// Takes the ranks of `ranks`.
    rank_list(std::vector<int> ranks) noexcept : ranks_(std::move(ranks)) {}  // NOLINT: implicit
    /// Takes the ranks given one by one: `{0, 1}`.
    template <std::convertible_to<int>... I>
        requires(sizeof...(I) > 0)
    rank_list(I... ranks) : ranks_{static_cast<int>(ranks)...} {}  // NOLINT: implicit
    /// The ranks, moved out.
    std::vector<int> take() && noexcept { return std::move(ranks_); }

private:
    std::vector<int> ranks_;
};

/// What kind of failure ended a group: a rank that failed (ended or stopped), a rank only to
/// blame (it called another collective, broke the protocol, was late), a revoke, a close.
using failure_cause = transport::failure_cause;

/// How a process group ended, as `process_group::failure` and `when_failed` report it: the
/// cause, the rank it names (-1: none), the ranks known to have failed, the error's text.
using group_failure = transport::failure_report;

/// What `process_group::agree` yields, the same on every rank counted in.
struct agreement {
    /// The AND of the flags of the ranks counted in.
    bool value = true;
    /// The group's ranks not counted in: failed, or later than the join window.
    std::vector<int> failed;
};

class process_group;
struct init_options;

namespace detail {
/// What a `shared_ptr<process_group>` made by corocoll does with the group when its last
/// reference goes: see `process_group::dispose`.
struct group_disposer {
    void operator()(process_group* g) const noexcept;
};
COROCOLL_DECL void open_lobby(process_group& g, std::shared_ptr<rendezvous::store> job_store,
                              const std::string& name);

/// The store rank 0 serves (env:// without a launcher's store, tcp://) dies with rank 0, and
/// with it the place where the survivors' `shrink` and `agree` meet. So ranks 1 and 2 of
/// init_process_group's group serve a store each, empty, that stands in for it: a call that
/// follows a failure meets in the first store of `chain` that answers. Shared by the groups of
/// a process that descend from that group (shrink, grow, new_group, split).
struct store_stand_ins {
    /// The store rank 0 serves, then the stand-ins, in the order they are tried.
    std::vector<io::endpoint> chain;
    /// Those this process found dead: a process that died does not come back.
    std::vector<bool> gone;
    /// The stand-in this process serves, if any, and its place in `chain`.
    std::shared_ptr<rendezvous::tcp_store_server> mine;
    std::size_t mine_at = 0;
    /// Proved to the stand-ins (COROCOLL_JOB_TOKEN), as to the store.
    std::string job_token;
    /// "127.0.0.1:4000,127.0.0.1:4001": `chain` as it travels through the lobby.
    std::string encode() const;
    static store_stand_ins decode(const std::string& text);
};
/// How many ranks stand in for the store rank 0 serves (ranks 1 to this).
inline constexpr int store_stand_in_count = 2;
}  // namespace detail

/// A set of ranks that exchange messages, like torch's ProcessGroup: the public face of
/// corocoll. Bound to the reactor of the thread that created it; its operations are
/// coroutines to await there (`isend`/`irecv` start at once and return a `work`). Every
/// operation has a deadline (the group's timeout unless given). A failed peer makes every
/// pending and later operation fail with an error naming it; the group must then be closed.
class process_group {
public:
    /// The unit of timeouts.
    using duration = std::chrono::milliseconds;

    /// Made by `init_process_group` and `new_group`, not by hand.
    process_group(io::reactor& r, int rank, int size, std::string name, duration timeout,
                  std::shared_ptr<rendezvous::store> store,
                  std::vector<std::unique_ptr<transport::channel>> peers,
                  transport::engine_options limits,
                  std::shared_ptr<rendezvous::tcp_store_server> hosted, io::endpoint listen_on = {},
                  collectives::topology hosts = {},
                  std::unique_ptr<transport::shm_arena> arena = nullptr);
    process_group(const process_group&) = delete;
    process_group& operator=(const process_group&) = delete;
    /// Closes the group if `close()` was not awaited, blocking on this thread's reactor. Groups
    /// made by corocoll (shared_ptr) never get here unclosed: see `dispose`.
    ~process_group();

    /// This rank in the group, 0 to `size() - 1` (torch's `get_rank`).
    int rank() const noexcept { return engine_.rank(); }
    /// Ranks in the group (torch's `get_world_size`).
    int size() const noexcept { return engine_.size(); }
    /// The group's name ("default" for the world group).
    const std::string& name() const noexcept { return name_; }
    /// The default deadline of every operation on the group.
    duration timeout() const noexcept { return timeout_; }
    /// The reactor the group's operations run on.
    io::reactor& reactor() const noexcept { return reactor_; }
    /// The channel that carries this rank's messages to and from rank `peer`: "shm" (shared
    /// memory, on this host) or "tcp"; empty for this rank itself, a rank outside the group,
    /// and a rank this one has not talked to yet (connections open on first use unless
    /// COROCOLL_CONNECT=eager). COROCOLL_DEBUG=INFO logs each pair's choice and the reason.
    const char* channel_to(int peer) const noexcept { return engine_.channel_kind(peer); }
    /// Which ranks of the group share a host (learnt at set-up from each rank's boot id,
    /// network namespace and `engine_options::host_tag`). A group that spans hosts with more
    /// than one rank on some host runs all_reduce, broadcast and all_gather hierarchically
    /// (within hosts, then among one leader per host, then within hosts).
    const collectives::topology& topology() const noexcept { return topology_; }
    /// Whether the group has a shared-memory arena: its ranks all share one host and every
    /// pair talks through shared memory, so all_reduce, broadcast and all_gather may run the
    /// shared-memory algorithms (`collectives::algorithm::shm`; see transport/shm/arena.hpp).
    bool has_arena() const noexcept { return arena_ != nullptr; }
    /// From how many bytes of the buffer one rank brings (a broadcast's; one block of an
    /// all_gather, gather, scatter or all_to_all) this group's arena makes calls of kind `k`
    /// copy straight between the ranks' buffers (process_vm_readv); 0: never (no arena, a
    /// kind that makes none, single copies off for it, or some rank may not read another's
    /// memory). See `transport::engine_options::shm_arena_single_copy_bytes`.
    COROCOLL_DECL std::size_t arena_single_copy_from(collectives::collective_kind k) const noexcept;
    /// From how many bytes (as `arena_single_copy_from` counts them) calls of kind `k` copy
    /// through the arena or messages again; 0: no bound (or no single copies). Set where a
    /// process_vm_readv is slow (transport::detail::single_copy_below_for).
    COROCOLL_DECL std::size_t arena_single_copy_below(
        collectives::collective_kind k) const noexcept;
    /// The sizes at which this group's choice of algorithm changes: those that depend on a
    /// core's L2 follow the L2 of rank 0's machine where the group has an arena, of this one
    /// elsewhere (`collectives::thresholds::for_l2`, `machine_cache_sizes`).
    const collectives::thresholds& size_thresholds() const noexcept { return thresholds_; }
    /// The group's namespace in the rendezvous store.
    rendezvous::store& store() const noexcept { return *store_; }
    /// The same, shared: another group (the GPU layer's NCCL group) may rendezvous through it.
    std::shared_ptr<rendezvous::store> shared_store() const noexcept { return store_; }

    /// Sends `buf` to `dst` with `tag`; completes once the data is handed to the kernel (the
    /// buffer may then be reused).
    template <buffer R>
    task<> send(const R& buf, int dst, std::int64_t tag = 0) {
        COROCOLL_CHECK_BUFFER(R);
        check_open("send");
        return engine_.send(detail::bytes_of(buf), dst, tag, deadline());
    }

    /// Receives into `buf` from `src` (or `any_source`) with `tag`; yields the sender's rank,
    /// as torch's `recv` returns it. The message may be shorter than `buf`, never longer. The
    /// result is the receive operation itself (no coroutine frame, no allocation): await it
    /// once, or `start()` it to post the receive before awaiting.
    template <buffer R>
    transport::recv_op<transport::recv_yields::source> recv(R& buf, int src = any_source,
                                                            std::int64_t tag = 0) {
        COROCOLL_CHECK_BUFFER(R);
        check_open("recv");
        return engine_.recv<transport::recv_yields::source>(detail::writable_bytes_of(buf), src,
                                                            tag, deadline());
    }

    /// Starts a send now; `co_await` (or `.wait()`) the result. `buf` must stay alive and
    /// unchanged until then.
    template <buffer R>
    work<> isend(const R& buf, int dst, std::int64_t tag = 0) {
        return start(send(buf, dst, tag));
    }

    /// Starts a receive now; the result yields the sender. `buf` must stay alive until then.
    template <buffer R>
    work<int> irecv(R& buf, int src = any_source, std::int64_t tag = 0) {
        return start(recv(buf, src, tag));
    }

    /// Starts every operation of `ops` at once, like torch's `batch_isend_irecv`; one `work`
    /// per operation, in order (a send's yields its peer).
    std::vector<work<int>> batch_isend_irecv(const std::vector<p2p_op>& ops);

    // ---- subgroups ----

    /// Like torch's new_group: every rank of this group calls it, in the same order, with the
    /// same `ranks` (a vector or a braced list: `co_await pg.new_group({0, 1})`); the members
    /// get a new group (their ranks in it follow the sorted `ranks`), the others get null. It
    /// has its own connections, sequence numbers and lock, so its collectives run concurrently
    /// with this group's. Dropping its last reference closes it; closing this group closes
    /// it too.
    task<std::shared_ptr<process_group>> new_group(rank_list ranks);

    /// Splits the group by colour, like MPI_Comm_split: every rank calls it; the ranks that
    /// pass the same colour form a group, ordered by (key, rank). A negative colour joins no
    /// group and gets null.
    task<std::shared_ptr<process_group>> split(int colour, int key = 0);

    /// The group of this group's live ranks, as MPI's MPIX_Comm_shrink: every live rank calls
    /// it, typically after the group failed (`failure()`, `when_failed()`); on a sound group
    /// it makes a copy. The members are the ranks that call it and that nobody knows to have
    /// failed, renumbered in this group's order; the new group has its own connections (shared
    /// memory where the ranks share a host), collectives and p2p, as `new_group`'s. It is not
    /// closed with this group: close this one (its close never waits once it failed) and go on
    /// with the new one, which may be shrunk in turn. How the ranks agree: through the group's
    /// store (docs/architecture.md, "Shrink"), so the store must outlive the failed rank
    /// (corocollrun's agent serves it; a rank that serves it itself must not be the one that
    /// dies). A rank that comes later than `join_window` after the first ones decided, or that
    /// the others took for failed, gets an error saying so. A member that dies while the new
    /// group is set up fails that set-up everywhere; the survivors then agree again without it
    /// (each such try costs up to three times `join_window`: the decision, then the set-up's
    /// two waits, for every member and for the connections), so a failure during shrink is survived
    /// and nothing waits past its deadline.
    task<std::shared_ptr<process_group>> shrink(
        std::chrono::milliseconds join_window = std::chrono::seconds(10));

    /// A larger group: this group's ranks (keeping their numbers) and `new_size - size()`
    /// processes that called `join_process_group` (numbered from size() on, in the order they
    /// came), as NCCL's ncclCommGrow; for a replacement of a rank that died (after `shrink`)
    /// or more ranks at a step boundary. Every rank of this group calls it, and it must be
    /// sound: rank 0 waits up to `join_window` for the joiners that came first and not yet
    /// admitted, hands each its rank, and tells the others through a broadcast; then all set
    /// the new group up, which has its own connections, as `shrink`'s. Joiners meet the group
    /// in the store under the name of the `init_process_group` it descends from, so it works
    /// on groups made by init_process_group, shrink and grow (not new_group or split), one
    /// grow at a time per name. Too few joiners within `join_window`: every rank gets an
    /// error saying how many came, the joiners that came stay for the next grow, and this
    /// group goes on. `new_size` must be larger than size().
    task<std::shared_ptr<process_group>> grow(
        int new_size, std::chrono::milliseconds join_window = std::chrono::seconds(60));

    /// How many processes wait to join (`join_process_group`) and no grow has admitted yet:
    /// collective (rank 0 reads the store, then broadcasts), so every rank gets the same
    /// count, for a `grow(size() + n)` that every rank then calls. For a step boundary of a
    /// program that takes replacements (corocollrun --on_failure=replace). 0 on a group that
    /// cannot grow (made by new_group or split).
    task<int> joiners_waiting();

    /// A fault-tolerant AND over the live ranks, as MPI's MPIX_Comm_agree: every live rank
    /// calls it with its `flag` and every caller gets the same `agreement`: the AND of the
    /// flags of the ranks counted in, and the ranks not counted (failed, or later than
    /// `join_window`). Works on a failed group: it goes through the group's store, as
    /// `shrink` does (docs/architecture.md, "Shrink"), with the same rules for who is counted
    /// and the same error for a rank that was not.
    task<agreement> agree(bool flag,
                          std::chrono::milliseconds join_window = std::chrono::seconds(10));

    // ---- failures (docs/architecture.md, "The failure model") ----

    /// Revokes the group, as MPI's MPIX_Comm_revoke does: every pending and later operation
    /// of the group, on every live rank, fails with "rank R revoked process group 'NAME'" (and
    /// `reason`), std::errc::operation_canceled; nobody is taken for failed. Not collective:
    /// one rank calls it, for instance when it learns of a failure outside corocoll. The word
    /// spreads from every rank that gets it to every other, so it reaches every live rank even
    /// if this one dies right after. Nothing if the group failed already; the group must then
    /// be closed (or shrunk, once that lands).
    void revoke(std::string_view reason = {});

    /// How the group failed, if it has (an asynchronous error query, as torch's
    /// ProcessGroup::getError); nullopt while it is sound.
    std::optional<group_failure> failure() const;

    /// The ranks this rank knows to have failed: a rank whose process ended (its connection
    /// closed without a goodbye, its memory could no longer be read) or stopped (it answered
    /// no status query), as named by the group's failure here or in a peer's abort notice.
    /// Empty while the group is sound, and after a failure of another kind (a revoke, a
    /// mismatch).
    std::vector<int> failed_ranks() const { return engine_.failed_ranks(); }

    /// Completes once the group has failed or was closed (at once if it has), yielding how:
    /// for a supervisor coroutine that reacts to a failure while the rest of the program goes
    /// on. Await it on the group's reactor. A close yields `failure_cause::closed`.
    task<group_failure> when_failed();

    // ---- collectives (see include/corocoll/collectives/ for the algorithms) ----

    /// Forces `a` for collective `k` on this group (tests, benchmarks); `automatic` undoes it.
    /// Every rank must force the same, or their calls do not match.
    void set_algorithm(collectives::collective_kind k, collectives::algorithm a) {
        algorithms_.force(k, a);
        forget_choices();
    }
    /// The size at which large transfers are cut into pieces (default 1 MiB). The broadcast's
    /// choice of the chain counts its pieces of this size (`collectives::thresholds`).
    void set_chunk_bytes(std::size_t bytes) noexcept {
        chunk_bytes_ = std::max<std::size_t>(bytes, 1);
        thresholds_.chain_piece_bytes = chunk_bytes_;
        forget_choices();
    }
    /// Bytes per pipelined chunk of the ring and chain algorithms.
    std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }

    /// Blocks until every rank of the group has called it (dissemination).
    collective_call<> barrier();

    /// Copies `data` of rank `src` into `data` of every rank.
    template <buffer R>
    collective_call<> broadcast(R& data, int src) {
        auto bytes = detail::writable_bytes_of(data);
        check_root("broadcast", src);
        auto kind = collectives::collective_kind::broadcast;
        auto algo = choose(kind, bytes.size());
        return call("broadcast", {},
                    rooted(kind, element_of<R>(), std::ranges::size(data), 0, src, algo, bytes));
    }

    /// Reduces `data` over every rank with `op`, in place; every rank gets the result.
    template <buffer R>
    collective_call<> all_reduce(R& data, reduce_op op = reduce_op::sum) {
        auto bytes = detail::writable_bytes_of(data);
        collectives::reduction red{op, element_of<R>()};
        check_op("all_reduce", red);
        auto kind = collectives::collective_kind::all_reduce;
        auto algo = choose(kind, bytes.size());
        return call("all_reduce",
                    collective(
                        kind, red.type, std::ranges::size(data), static_cast<std::uint8_t>(op), 0,
                        [bytes, red, algo, hosts = &topology_](collectives::context& c) {
                            return collectives::all_reduce(c, algo, *hosts, bytes, red);
                        },
                        algo));
    }

    /// Reduces `data` over every rank into `data` of rank `dst`; the other ranks' buffers are
    /// left as they were.
    template <buffer R>
    collective_call<> reduce(R& data, int dst, reduce_op op = reduce_op::sum) {
        auto bytes = detail::writable_bytes_of(data);
        collectives::reduction red{op, element_of<R>()};
        check_op("reduce", red);
        check_root("reduce", dst);
        auto kind = collectives::collective_kind::reduce;
        auto algo = choose(kind, bytes.size());
        return call("reduce", {},
                    rooted(kind, red.type, std::ranges::size(data), static_cast<std::uint8_t>(op),
                           dst, algo, bytes));
    }

    /// Gathers every rank's `in` into `out` (size() blocks of in.size() elements, in rank
    /// order) on every rank: torch's all_gather_into_tensor.
    template <buffer O, buffer I>
    collective_call<> all_gather_into(O& out, const I& in) {
        static_assert(std::is_same_v<std::ranges::range_value_t<O>, std::ranges::range_value_t<I>>,
                      "corocoll: all_gather: input and output must hold the same type");
        auto out_bytes = detail::writable_bytes_of(out);
        auto in_bytes = detail::bytes_of(in);
        check_size("all_gather", "output", std::ranges::size(out), std::ranges::size(in) * size());
        auto kind = collectives::collective_kind::all_gather;
        auto algo = choose(kind, out_bytes.size());
        std::size_t elem = sizeof(std::ranges::range_value_t<I>);
        return call(
            "all_gather_into",
            collective(
                kind, element_of<I>(), std::ranges::size(in), 0, 0,
                [out_bytes, in_bytes, algo, elem, hosts = &topology_](collectives::context& c) {
                    return collectives::all_gather(c, algo, *hosts, out_bytes, in_bytes, elem);
                },
                algo));
    }

    /// Gathers every rank's `in` into `outs[r]` on every rank (torch's all_gather with a list).
    template <buffer R>
    collective_call<> all_gather(std::vector<R>& outs, const R& in) {
        return call("all_gather", all_gather_run(outs, in));
    }

    /// Gathers every rank's `in` into `out` (size() blocks, rank order) on rank `dst`; `out`
    /// is only used there.
    template <buffer O, buffer I>
    collective_call<> gather_into(const I& in, O& out, int dst) {
        auto in_bytes = detail::bytes_of(in);
        auto out_bytes = detail::writable_bytes_of(out);
        check_root("gather", dst);
        if (rank() == dst) {
            check_size("gather", "output", std::ranges::size(out), std::ranges::size(in) * size());
        }
        auto kind = collectives::collective_kind::gather;
        auto algo = choose(kind, in_bytes.size());
        return call("gather_into", {},
                    rooted(kind, element_of<I>(), std::ranges::size(in), 0, dst, algo, out_bytes,
                           in_bytes));
    }

    /// torch's gather: on `dst`, `gather_list[r]` receives rank r's `in`; elsewhere the list is
    /// not used (it may be empty).
    template <buffer R>
    collective_call<> gather(const R& in, std::vector<R>& gather_list, int dst = 0) {
        return call("gather", gather_run(in, gather_list, dst));
    }

    /// Scatters `in` of rank `src` (size() blocks of out.size() elements) so that rank r gets
    /// block r in `out`; `in` is only used on `src`.
    template <buffer O, buffer I>
    collective_call<> scatter_from(O& out, const I& in, int src) {
        auto in_bytes = detail::bytes_of(in);
        auto out_bytes = detail::writable_bytes_of(out);
        check_root("scatter", src);
        if (rank() == src) {
            check_size("scatter", "input", std::ranges::size(in), std::ranges::size(out) * size());
        }
        auto kind = collectives::collective_kind::scatter;
        auto algo = choose(kind, out_bytes.size());
        return call("scatter_from", {},
                    rooted(kind, element_of<O>(), std::ranges::size(out), 0, src, algo, out_bytes,
                           in_bytes));
    }

    /// torch's scatter: rank r gets `scatter_list[r]` of rank `src` in `out`.
    template <buffer R>
    collective_call<> scatter(R& out, const std::vector<R>& scatter_list, int src = 0) {
        return call("scatter", scatter_run(out, scatter_list, src));
    }

    /// Reduces `in` (size() blocks of out.size() elements) over every rank with `op`; rank r
    /// gets the reduction of block r in `out` (torch's reduce_scatter_tensor). `in` is read only.
    template <buffer O, buffer I>
    collective_call<> reduce_scatter_into(O& out, const I& in, reduce_op op = reduce_op::sum) {
        static_assert(std::is_same_v<std::ranges::range_value_t<O>, std::ranges::range_value_t<I>>,
                      "corocoll: reduce_scatter: input and output must hold the same type");
        collectives::reduction red{op, element_of<O>()};
        check_op("reduce_scatter", red);
        check_size("reduce_scatter", "input", std::ranges::size(in),
                   std::ranges::size(out) * size());
        auto out_bytes = detail::writable_bytes_of(out);
        auto in_bytes = detail::bytes_of(in);
        auto kind = collectives::collective_kind::reduce_scatter;
        auto algo = choose(kind, in_bytes.size());
        return call("reduce_scatter_into",
                    collective(
                        kind, red.type, std::ranges::size(out), static_cast<std::uint8_t>(op), 0,
                        [out_bytes, in_bytes, red, algo](collectives::context& c) {
                            return collectives::reduce_scatter(c, algo, out_bytes, in_bytes, red);
                        },
                        algo));
    }

    /// torch's reduce_scatter with a list: rank r gets the reduction of every rank's
    /// `in_list[r]` in `out`.
    template <buffer R>
    collective_call<> reduce_scatter(R& out, const std::vector<R>& in_list,
                                     reduce_op op = reduce_op::sum) {
        return call("reduce_scatter", reduce_scatter_run(out, in_list, op));
    }

    /// Every rank sends block p of `in` to rank p and receives rank p's block into block p of
    /// `out` (torch's all_to_all_single). Without split sizes the blocks are equal; with them,
    /// `in_splits[p]` / `out_splits[p]` elements go to / come from rank p.
    template <buffer O, buffer I>
    collective_call<> all_to_all_single(O& out, const I& in,
                                        std::vector<std::size_t> out_splits = {},
                                        std::vector<std::size_t> in_splits = {}) {
        static_assert(std::is_same_v<std::ranges::range_value_t<O>, std::ranges::range_value_t<I>>,
                      "corocoll: all_to_all: input and output must hold the same type");
        std::size_t elem = sizeof(std::ranges::range_value_t<I>);
        const std::size_t out_count = std::ranges::size(out), in_count = std::ranges::size(in);
        // Equal blocks without split sizes (the usual call) need no offsets: none are made
        // unless the pairwise exchange runs (collectives::all_to_all).
        std::vector<std::size_t> out_off, in_off;
        bool even = out_splits.empty() && in_splits.empty() && out_count == in_count;
        if (even) {
            collectives::check_even_split(rank(), size(), "output", out_count);
            collectives::check_even_split(rank(), size(), "input", in_count);
        } else {
            out_off = collectives::all_to_all_offsets(rank(), size(), "output", out_splits,
                                                      out_count, elem);
            in_off =
                collectives::all_to_all_offsets(rank(), size(), "input", in_splits, in_count, elem);
            even = std::adjacent_find(in_splits.begin(), in_splits.end(), std::not_equal_to<>()) ==
                       in_splits.end() &&
                   in_splits == out_splits;
            // Equal split sizes go as none do: a rank that gave them and one that did not
            // take the same path (the arena's, or the pairwise exchange of equal blocks).
            if (even) {
                out_off.clear();
                in_off.clear();
            }
        }
        auto out_bytes = detail::writable_bytes_of(out);
        auto in_bytes = detail::bytes_of(in);
        auto kind = collectives::collective_kind::all_to_all;
        // Through the arena only with equal blocks (its readers know where each block is).
        auto algo = even ? choose(kind, in_bytes.size()) : collectives::algorithm::pairwise;
        return call("all_to_all_single",
                    collective(
                        kind, element_of<I>(), even ? in_count : 0, 0, 0,
                        [out_bytes, in_bytes, out_off = std::move(out_off),
                         in_off = std::move(in_off), algo](collectives::context& c) {
                            return collectives::all_to_all(c, algo, out_bytes, out_off, in_bytes,
                                                           in_off);
                        },
                        algo));
    }

    /// torch's all_to_all with lists: `outs[p]` receives `ins[rank()]` of rank p.
    template <buffer R>
    collective_call<> all_to_all(std::vector<R>& outs, const std::vector<R>& ins) {
        return call("all_to_all", all_to_all_run(outs, ins));
    }

    /// A barrier that rank 0 watches: every rank reports to rank 0, which waits up to
    /// `timeout` and then names every rank that did not arrive (all of them, not just the
    /// first); every rank that arrived gets the same error. Like torch's monitored_barrier.
    collective_call<> monitored_barrier(std::chrono::milliseconds timeout);

    // ---- object collectives: any serializable type (see collectives/object.hpp) ----

    /// Broadcasts the objects of rank `src`'s list into every rank's list (same length on
    /// every rank, as in torch).
    template <class T>
    collective_call<> broadcast_object_list(std::vector<T>& objects, int src = 0) {
        return call("broadcast_object_list", broadcast_object_list_run(objects, src));
    }

    /// Gathers one object from every rank into `out` (resized to size()) on rank `dst`.
    template <class T>
    collective_call<> gather_object(const T& object, std::vector<T>& out, int dst = 0) {
        return call("gather_object", gather_object_run(object, out, dst));
    }

    /// Gathers one object from every rank into `out` (resized to size()) on every rank.
    template <class T>
    collective_call<> all_gather_object(std::vector<T>& out, const T& object) {
        return call("all_gather_object", all_gather_object_run(out, object));
    }

    /// Rank r gets `in[r]` of rank `src` in `out` (torch's scatter_object_list).
    template <class T>
    collective_call<> scatter_object_list(T& out, const std::vector<T>& in, int src = 0) {
        return call("scatter_object_list", scatter_object_list_run(out, in, src));
    }

    /// Says goodbye to the peers, closes the connections and fails whatever is pending; first
    /// closes every group made from this one (`new_group`, `split`) that is still alive, as
    /// torch's destroy_process_group tears down every group. Operations called afterwards
    /// throw `std::logic_error` naming the call and the group. Idempotent: a second call
    /// completes when the first has.
    task<> close();

    /// Closes as `close()` does, but first waits, up to `at_most`, until every peer still
    /// connected has closed its group too (said goodbye) or ended. For a rank about to leave
    /// the job: what the others may still need of its process (a store it serves, which a
    /// peer may be polling in a barrier of its own) stays until they are done with it. The
    /// rank that serves corocoll's own store always waits so, up to the group's timeout, and
    /// also until the other processes' store connections have closed (the ranks it never
    /// connected to, on first use).
    task<> close_after_peers(std::chrono::milliseconds at_most);

    /// True once `close()` has begun (or finished).
    bool closed() const noexcept { return closed_; }

    /// The transport underneath (for collectives and tests).
    transport::engine& engine() noexcept { return engine_; }
    /// Collectives of this rank on the group that ran at once when awaited, without their
    /// task: small broadcasts, reduces, gathers and scatters through the arena's lines where
    /// nothing in them had to wait.
    std::uint64_t calls_run_at_once() const noexcept { return calls_at_once_; }

private:
    friend struct detail::group_disposer;

    // The last reference to a group made by corocoll went. A closed group is deleted at once,
    // without its reactor (which destroy_process_group may have destroyed). Plain code on the
    // group's thread, outside the loop, closes it blocking, as the destructor always did.
    // Anywhere else the close must not block: from a coroutine the reactor resumed (perhaps
    // this group's own reader, which the close waits for) a blocking close would run the loop
    // nested inside that coroutine and wait on itself. There the reactor adopts a task that
    // closes the group from its own queue and then deletes it; the reactor finishes that task
    // before it is destroyed. From another thread the group's reactor is asked to do the same.
    static void dispose(process_group* g) noexcept;

    static task<> close_then_delete(process_group* g);

    // `close()`, waiting for the peers to close too until `until` (see `close_after_peers`).
    task<> close_lingering(std::chrono::steady_clock::time_point until);
    // Where this group alone holds the store this process serves: waits, up to `until`,
    // until the other processes' clients connected to it now have left (the ranks a group
    // that connects on first use never connected to say no goodbye).
    task<> keep_store_until_clients_leave(std::chrono::steady_clock::time_point until);

    friend task<std::shared_ptr<process_group>> join_process_group(io::reactor&, init_options);
    friend task<std::shared_ptr<process_group>> init_process_group(io::reactor&, init_options);
    friend void detail::open_lobby(process_group&, std::shared_ptr<rendezvous::store>,
                                   const std::string&);

    // Where processes that join (`join_process_group`) meet this group's lineage in the store,
    // and the name of the init_process_group group it descends from; null and empty for
    // new_group's and split's groups.
    void set_lobby(std::shared_ptr<rendezvous::store> lobby, std::string name) {
        lobby_ = std::move(lobby);
        lobby_name_ = std::move(name);
    }
    // Rank 0's part of `grow`: waits for `need` joiners not yet admitted, hands each a rank
    // from size() on in a group of `new_size`, and yields the grow's number (its keys' prefix).
    task<std::int64_t> admit(int need, int new_size, std::chrono::milliseconds join_window);

    // The store a subgroup's set-up (`call`: "new_group", "split"; `name`: the subgroup's)
    // goes through: this group's, watched for this group's failure (a rank that died).
    std::shared_ptr<rendezvous::store> watched_store(const char* call, const std::string& name);
    // Ranks 1 and 2 start their stand-ins for the store rank 0 serves at `primary`, and every
    // rank learns their addresses (see detail::store_stand_ins). Collective, at set-up.
    task<> set_up_stand_ins(io::endpoint primary);
    // Where a decision of `call` (shrink, agree) is made: this group's store, unless a rank
    // of it failed and the process serving it is gone; then the first stand-in that answers
    // (`at`, its place in the chain; `hosted`, its server where this process serves it).
    struct decision_place {
        std::shared_ptr<rendezvous::store> store;
        std::size_t at = 0;
        std::shared_ptr<rendezvous::tcp_store_server> hosted;
    };
    task<decision_place> decision_place_for(const char* call);
    // The lobby's store is gone with the process that served it: `call` (grow,
    // joiners_waiting) cannot work; says so at once instead of waiting for it.
    void check_lobby(const char* call) const;
    // What the callers of one `decide` agreed on: who came, and the AND of their flags.
    struct decision {
        std::vector<int> members;
        bool all_true = true;
    };
    // How long a proposer's read of the flags of the ranks that came waits before it looks
    // whether the decision was made meanwhile (see `decide`).
    static constexpr std::chrono::milliseconds flag_read_wait{100};
    // One decision through this group's store, under `base` (a try of a shrink, an agree):
    // publishes this rank as come, with `flag`, and yields what every caller agrees on (a
    // compare_set of `base` "members" that the first proposal wins): `candidates`, once all
    // of them came, or, after `join_window`, those that had; and the AND of their flags.
    task<decision> decide(std::shared_ptr<rendezvous::store> store, std::string base,
                          std::vector<int> candidates, std::chrono::milliseconds join_window,
                          bool flag);
    // This group's ranks less those known to have failed.
    std::vector<int> live_candidates() const;
    // The error of a rank that `call` (shrink, agree) did not count in.
    std::string left_out(const char* call, const std::vector<int>& members,
                         std::chrono::milliseconds join_window) const;
    // Awaits a subgroup's `set_up`; if it fails because a rank of this group died, the error
    // says so, naming the rank.
    task<std::shared_ptr<process_group>> set_up_subgroup(
        task<std::shared_ptr<process_group>> set_up, const char* call, std::string name);

    // Operations on a closed group are refused before they touch its reactor (gone after
    // destroy_process_group).
    void check_open(const char* what) const;

    // ---- collective helpers ----

    // The collectives that are coroutines of their own (lists, objects); their public faces
    // above wrap them in a collective_call.

    template <buffer R>
    task<> all_gather_run(std::vector<R>& outs, const R& in);

    template <buffer R>
    task<> gather_run(const R& in, std::vector<R>& gather_list, int dst);

    template <buffer R>
    task<> scatter_run(R& out, const std::vector<R>& scatter_list, int src);

    template <buffer R>
    task<> reduce_scatter_run(R& out, const std::vector<R>& in_list, reduce_op op);

    template <buffer R>
    task<> all_to_all_run(std::vector<R>& outs, const std::vector<R>& ins);

    template <class T>
    task<> broadcast_object_list_run(std::vector<T>& objects, int src);

    template <class T>
    task<> gather_object_run(const T& object, std::vector<T>& out, int dst);

    template <class T>
    task<> all_gather_object_run(std::vector<T>& out, const T& object);

    template <class T>
    task<> scatter_object_list_run(T& out, const std::vector<T>& in, int src);

    collective_call<> call(const char* what, task<> body, small_call small = {}) noexcept {
        return {std::move(body), this, &forgotten, what, small};
    }

    // The next collective's metadata, numbered, shown to the engine (begin_collective) and
    // the arena (announce): what every call does once it holds the lock (`collective`,
    // `run_at_once`). A call on a failed group throws here first.
    COROCOLL_DECL transport::collective_meta begin_call(std::uint8_t kind, dtype type,
                                                        std::size_t count, std::uint8_t redop,
                                                        int root, std::uint8_t algo);
    // The rooted call (broadcast, reduce, gather, scatter) of `kind` that writes `data` and
    // reads `in`, described whole: its task is built from it when needed (`make_rooted`), and
    // it may run at once when awaited (`run_at_once`) where its algorithm has a path for that
    // (in the arena's lines).
    small_call rooted(collectives::collective_kind kind, dtype type, std::size_t count,
                      std::uint8_t redop, int root, collectives::algorithm algo,
                      std::span<std::byte> data, std::span<const std::byte> in = {}) noexcept;
    // The task of the rooted call `p` (`collective` with the call's algorithm), not started.
    static task<> make_rooted(const small_call& p);
    // Runs the small call `p` to its end now, as `collective` would run its task, where no
    // part of it would wait: the group open and sound, no collective of its before this one
    // (the lock free), nothing to catch up on, and the algorithm ready (see
    // collectives::broadcast_shm_ready). True when done (or thrown: the call's error); false
    // having done nothing, and the task runs the call.
    static bool run_at_once(const small_call& p);

    // A collective_call of this group was dropped without being awaited: the collective never
    // ran, and the other ranks wait in it. The group fails from this rank, with words that
    // say why, so that every rank learns it instead of hanging or going on silently.
    static void forgotten(void* self, const char* what) noexcept;

    template <class R>
    static dtype element_of() {
        using T = std::ranges::range_value_t<R>;
        COROCOLL_CHECK_BUFFER(R);
        static_assert(!std::is_trivially_copyable_v<T> || element<T>,
                      "corocoll: collectives take integers of 1-8 bytes, bool, float, double, "
                      "float16, bfloat16, std::complex<float> or std::complex<double> elements; "
                      "for other types use the object collectives (broadcast_object_list, "
                      "all_gather_object, gather_object, scatter_object_list)");
        if constexpr (element<T>) {
            return dtype_of<T>;
        } else {
            return dtype{};
        }
    }

    std::string prefix(const char* what) const { return collectives::error_prefix(rank(), what); }
    // The algorithm of collective `k` for `bytes`: forced, hierarchical across hosts, or by size.
    collectives::algorithm choose(collectives::collective_kind k, std::size_t bytes) const;
    void check_root(const char* what, int root) const {
        collectives::check_root(rank(), size(), what, root);
    }
    void check_op(const char* what, const collectives::reduction& red) const {
        collectives::check_op(rank(), what, red.op, red.type);
    }
    void check_size(const char* what, const char* name, std::size_t got,
                    std::size_t expected) const {
        collectives::check_size(rank(), what, name, got, expected);
    }

    // Runs one collective: in issue order on this group (a FIFO lock), numbered, with the
    // metadata every rank must agree on (impl/collectives.hpp).
    template <class Body>
    task<> collective(collectives::collective_kind kind, dtype type, std::size_t count,
                      std::uint8_t redop, int root, Body body,
                      collectives::algorithm algo = collectives::algorithm::automatic);

    template <class Body>
    task<> object_collective(collectives::collective_kind kind, std::size_t count, int root,
                             Body body) {
        return collective(kind, dtype::uint8, count, 0, root, std::move(body));
    }

    // Coarse: every operation computes one, and the timeout is counted in seconds.
    std::chrono::steady_clock::time_point deadline() const {
        return io::coarse_deadline_after(timeout_);
    }

    task<int> send_then_peer(std::span<const std::byte> buf, int dst, std::int64_t tag);

    io::reactor& reactor_;
    std::string name_;
    duration timeout_;
    std::shared_ptr<rendezvous::store> store_;
    std::shared_ptr<rendezvous::tcp_store_server> hosted_;  // rank 0's store server, if any
    std::shared_ptr<rendezvous::store> lobby_;              // see set_lobby
    std::string lobby_name_;
    std::shared_ptr<detail::store_stand_ins> stand_ins_;  // see set_up_stand_ins
    std::size_t store_at_ = 0;                            // store_'s place in stand_ins_->chain
    io::endpoint listen_on_;
    transport::engine_options limits_;
    int subgroups_ = 0;
    int shrinks_ = 0;
    int agreements_ = 0;
    // Before engine_: a bad COROCOLL_ALGORITHM throws before any reader starts.
    collectives::algorithm_choice algorithms_ = collectives::algorithm_choice::from_env();
    collectives::thresholds thresholds_;
    // The last choice of each kind (`choose`), as (bytes + 1) << 8 | algorithm, 0 where none:
    // a loop of calls of one size chooses once. One word each, so that a call made on
    // another thread reads a whole choice or none. What the choice reads changes only in
    // set_algorithm and set_chunk_bytes, which forget them.
    mutable std::array<std::atomic<std::uint64_t>, collectives::collective_kinds> chosen_{};
    void forget_choices() noexcept {
        for (auto& c : chosen_) c.store(0, std::memory_order_relaxed);
    }
    transport::engine engine_;
    bool closed_ = false;
    bool close_finished_ = false;
    // Groups made from this one, closed with it.
    std::vector<std::weak_ptr<process_group>> made_;
    local_async_mutex collective_lock_;
    struct unlock_item : corocoll::detail::work_item {
        local_async_mutex* lock = nullptr;
    } unlock_item_;
    std::uint64_t collective_seq_ = 0;
    std::uint64_t calls_at_once_ = 0;
    std::size_t chunk_bytes_ = std::size_t{1} << 20;
    collectives::scratch_buffers scratch_;
    collectives::topology topology_;
    std::unique_ptr<transport::shm_arena> arena_;
};

inline void detail::group_disposer::operator()(process_group* g) const noexcept {
    process_group::dispose(g);
}

COROCOLL_END_NAMESPACE

// The templates of impl/collectives.hpp, and set-up (init_process_group, new_group,
// split), need the class complete.
#include <corocoll/process_group/impl/collectives.hpp>
#include <corocoll/process_group/init.hpp>

#if COROCOLL_DEFINE_BODIES
#include <corocoll/process_group/impl/process_group.ipp>
#endif
