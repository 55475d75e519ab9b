// The bodies of the non-template functions declared in <corocoll/process_group/process_group.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/broadcast_shm.hpp>
#include <corocoll/collectives/rooted_shm.hpp>
#include <corocoll/process_group/process_group.hpp>

#include <optional>

COROCOLL_BEGIN_NAMESPACE

COROCOLL_DECL process_group::process_group(io::reactor& r, int rank, int size, std::string name,
                                           duration timeout,
                                           std::shared_ptr<rendezvous::store> store,
                                           std::vector<std::unique_ptr<transport::channel>> peers,
                                           transport::engine_options limits,
                                           std::shared_ptr<rendezvous::tcp_store_server> hosted,
                                           io::endpoint listen_on, collectives::topology hosts,
                                           std::unique_ptr<transport::shm_arena> arena)
    : reactor_(r),
      name_(std::move(name)),
      timeout_(timeout),
      store_(std::move(store)),
      hosted_(std::move(hosted)),
      listen_on_(listen_on),
      limits_(limits),
      engine_(r, rank, size, std::move(peers), limits),
      topology_(std::move(hosts)),
      arena_(std::move(arena)) {
    thresholds_ =
        collectives::thresholds::for_l2(arena_ ? arena_->l2_bytes() : machine_cache_sizes().l2);
    engine_.set_describer(&collectives::describe);
    unlock_item_.lock = &collective_lock_;
    unlock_item_.run_ = [](corocoll::detail::work_item* item) noexcept {
        static_cast<unlock_item*>(item)->lock->unlock();
    };
}

COROCOLL_DECL process_group::~process_group() {
    if (!closed_) {
        try {
            sync_wait(close());
        } catch (...) {
        }
    }
}

COROCOLL_DECL std::vector<work<int>> process_group::batch_isend_irecv(
    const std::vector<p2p_op>& ops) {
    check_open("batch_isend_irecv");
    std::vector<work<int>> out;
    out.reserve(ops.size());
    for (const auto& op : ops) {
        if (op.action == p2p_op::kind::isend) {
            out.push_back(start(send_then_peer(op.data, op.peer, op.tag)));
        } else {
            out.push_back(start(engine_.recv<transport::recv_yields::source>(op.data, op.peer,
                                                                             op.tag, deadline())));
        }
    }
    return out;
}

namespace {

// The arena's use of calls of kind `k`; none for the kinds that make no single copies.
std::optional<transport::single_copy_use> single_copy_use_of(
    collectives::collective_kind k) noexcept {
    using collectives::collective_kind;
    using transport::single_copy_use;
    switch (k) {
        case collective_kind::broadcast:
            return single_copy_use::broadcast;
        case collective_kind::all_gather:
            return single_copy_use::all_gather;
        case collective_kind::gather:
            return single_copy_use::gather;
        case collective_kind::scatter:
            return single_copy_use::scatter;
        case collective_kind::all_to_all:
            return single_copy_use::all_to_all;
        case collective_kind::all_reduce:
            return single_copy_use::all_reduce;
        default:
            return std::nullopt;
    }
}

}  // namespace

COROCOLL_DECL std::size_t process_group::arena_single_copy_from(
    collectives::collective_kind k) const noexcept {
    if (!arena_ || !arena_->single_copy_allowed()) return 0;
    const auto u = single_copy_use_of(k);
    return u ? arena_->single_copy_from(*u) : 0;
}

COROCOLL_DECL std::size_t process_group::arena_single_copy_below(
    collectives::collective_kind k) const noexcept {
    if (!arena_ || !arena_->single_copy_allowed()) return 0;
    const auto u = single_copy_use_of(k);
    return u ? arena_->single_copy_below(*u) : 0;
}

COROCOLL_DECL collectives::algorithm process_group::choose(collectives::collective_kind k,
                                                           std::size_t bytes) const {
    // The last choice of this kind, where it was for this size (sizes from 2^55 bytes are
    // not kept).
    std::atomic<std::uint64_t>& last = chosen_[static_cast<std::size_t>(k)];
    const bool keep = bytes < (std::uint64_t{1} << 55);
    if (keep) {
        const std::uint64_t word = last.load(std::memory_order_relaxed);
        if ((word >> 8) == bytes + 1) return static_cast<collectives::algorithm>(word & 0xff);
    }
    auto a =
        collectives::select(k, bytes, size(), algorithms_, thresholds_, &topology_, has_arena(),
                            arena_single_copy_from(k), arena_single_copy_below(k));
    if (a == collectives::algorithm::shm && !has_arena()) {
        throw std::invalid_argument(
            prefix(collectives::kind_name(k)) +
            "the shm algorithm needs a group whose ranks all share one host's memory, and "
            "group '" +
            name_ + "' has no shared-memory arena (COROCOLL_DEBUG=INFO says why at set-up)");
    }
    if (keep)
        last.store(((bytes + 1) << 8) | static_cast<std::uint8_t>(a), std::memory_order_relaxed);
    return a;
}

COROCOLL_DECL collective_call<> process_group::barrier() {
    return call("barrier",
                collective(collectives::collective_kind::barrier, {}, 0, 0, 0,
                           [](collectives::context& c) { return collectives::barrier(c); }));
}

COROCOLL_DECL collective_call<> process_group::monitored_barrier(
    std::chrono::milliseconds timeout) {
    return call("monitored_barrier", collective(collectives::collective_kind::monitored_barrier, {},
                                                0, 0, 0, [timeout](collectives::context& c) {
                                                    return collectives::monitored_barrier(c,
                                                                                          timeout);
                                                }));
}

COROCOLL_DECL task<> process_group::close() {
    return close_lingering(hosted_ ? deadline() : std::chrono::steady_clock::time_point{});
}

COROCOLL_DECL task<> process_group::close_after_peers(std::chrono::milliseconds at_most) {
    auto until = std::chrono::steady_clock::now() + at_most;
    return close_lingering(hosted_ ? std::max(until, deadline()) : until);
}

COROCOLL_DECL task<> process_group::close_lingering(std::chrono::steady_clock::time_point until) {
    if (closed_) {
        while (!close_finished_) co_await reactor_.sleep_for(std::chrono::milliseconds(1));
        co_return;
    }
    closed_ = true;
    for (auto& weak : made_) {
        if (auto g = weak.lock()) {
            try {
                co_await g->close();
            } catch (...) {
                // Its own close goes on whatever a subgroup's did.
            }
        }
    }
    made_.clear();
    // The rank that serves the store keeps it up until the others are gone (`until`): those
    // it is connected to say goodbye; the others (never connected, on first use) leave the
    // store.
    const bool sound = !engine_.failed();
    co_await engine_.close(until);
    if (hosted_ && sound) co_await keep_store_until_clients_leave(until);
    // A futex wait of the arena's still in the ring must end before the arena goes.
    if (arena_) co_await arena_->close();
    // The last collective's lock release (`unlock_item_`) may still wait in the reactor's
    // posted batch that is running now (a reader's cancellation ended the close inside
    // it): let that batch finish before the caller may destroy the group.
    co_await reactor_.schedule();
    close_finished_ = true;
}

COROCOLL_DECL task<> process_group::keep_store_until_clients_leave(
    std::chrono::steady_clock::time_point until) {
    // A server another group holds too (a shrink's) stays with that group.
    if (hosted_.use_count() > 1) co_return;
    // Those connected now; a process that connects later (a job set up again on the same
    // port) is not waited for.
    auto elsewhere = hosted_->clients_elsewhere();
    std::multiset<std::string> waiting(elsewhere.begin(), elsewhere.end());
    while (!waiting.empty()) {
        std::multiset<std::string> still;
        for (auto& c : hosted_->clients_elsewhere()) {
            if (waiting.count(c) != 0) still.insert(std::move(c));
        }
        waiting = std::move(still);
        if (waiting.empty()) break;
        if (std::chrono::steady_clock::now() >= until) {
            COROCOLL_LOG(warn, "P2P", "rank ", rank(), " of group '", name_,
                         "' stops serving the store with ", waiting.size(),
                         " client(s) of other processes still connected (", *waiting.begin(),
                         waiting.size() > 1 ? ", ..." : "", ")");
            break;
        }
        co_await reactor_.sleep_for(std::chrono::milliseconds(2));
    }
}

COROCOLL_DECL void process_group::dispose(process_group* g) noexcept {
    if (g->closed_ && g->close_finished_) {
        delete g;
        return;
    }
    io::reactor& r = g->reactor_;
    if (io::reactor::current() == &r) {
        if (!r.running() && !g->closed_) {
            delete g;
            return;
        }
        r.adopt(close_then_delete(g));
        return;
    }
    struct handover : corocoll::detail::work_item {
        process_group* group = nullptr;
    };
    auto* item = new handover;
    item->group = g;
    item->run_ = [](corocoll::detail::work_item* self) noexcept {
        auto* h = static_cast<handover*>(self);
        h->group->reactor_.adopt(close_then_delete(h->group));
        delete h;
    };
    r.post(*item);
}

COROCOLL_DECL task<> process_group::close_then_delete(process_group* g) {
    // Out of whatever coroutine dropped the reference first.
    co_await g->reactor_.schedule();
    try {
        co_await g->close();
    } catch (...) {
    }
    delete g;
}

COROCOLL_DECL transport::collective_meta process_group::begin_call(std::uint8_t kind, dtype type,
                                                                   std::size_t count,
                                                                   std::uint8_t redop, int root,
                                                                   std::uint8_t algo) {
    transport::collective_meta meta;
    meta.collective = kind;
    meta.redop = redop;
    meta.dtype = static_cast<std::uint8_t>(type);
    meta.algorithm = algo;
    meta.root = static_cast<std::uint32_t>(root);
    meta.count = count;
    meta.seq = ++collective_seq_;
    // A call on a failed group fails here, before it shows itself to the others: announced in
    // the arena, it would be a mismatch to a rank still waiting in its own call of that number
    // that has not read the failure yet (a barrier after a revoke, against the others'
    // all_reduce), and that rank would report the mismatch instead of the revoke.
    engine_.raise_if_failed(meta);
    engine_.begin_collective(meta);
    // A frame a peer sent ahead for another call of this number failed the group just now:
    // the call fails before it shows itself here too.
    engine_.raise_if_failed(meta);
    if (arena_) arena_->announce(meta);
    return meta;
}

COROCOLL_DECL small_call process_group::rooted(collectives::collective_kind kind, dtype type,
                                               std::size_t count, std::uint8_t redop, int root,
                                               collectives::algorithm algo,
                                               std::span<std::byte> data,
                                               std::span<const std::byte> in) noexcept {
    using collective_kind = collectives::collective_kind;
    small_call p;
    p.make = &make_rooted;
    p.group = this;
    p.data = data;
    p.in = in;
    p.count = count;
    p.root = root;
    p.kind = static_cast<std::uint8_t>(kind);
    p.type = static_cast<std::uint8_t>(type);
    p.redop = redop;
    p.algorithm = static_cast<std::uint8_t>(algo);
    if (!arena_ || algo != collectives::algorithm::shm) return p;
    // Where the algorithm's own small path would carry the call (its test, the same here).
    const transport::shm_arena& a = *arena_;
    bool in_lines = false;
    switch (kind) {
        case collective_kind::broadcast:
            in_lines = collectives::broadcast_shm_in_lines(a, data.size());
            break;
        case collective_kind::reduce:
            in_lines = collectives::rooted_shm_fits(data.size());
            break;
        case collective_kind::gather:
            in_lines = collectives::gather_shm_in_lines(a, in.size());
            break;
        case collective_kind::scatter:
            in_lines = collectives::scatter_shm_in_lines(a, data.size());
            break;
        default:
            break;
    }
    if (in_lines) p.run = &run_at_once;
    return p;
}

COROCOLL_DECL task<> process_group::make_rooted(const small_call& p) {
    using collective_kind = collectives::collective_kind;
    auto& g = *static_cast<process_group*>(p.group);
    const auto kind = static_cast<collective_kind>(p.kind);
    return g.collective(
        kind, static_cast<dtype>(p.type), p.count, p.redop, p.root,
        // The reduction lives here: the algorithms keep a reference to it.
        [p, hosts = &g.topology_,
         red = collectives::reduction{static_cast<reduce_op>(p.redop), static_cast<dtype>(p.type)}](
            collectives::context& c) {
            const auto algo = static_cast<collectives::algorithm>(p.algorithm);
            switch (static_cast<collective_kind>(p.kind)) {
                case collective_kind::broadcast:
                    return collectives::broadcast(c, algo, *hosts, p.data, p.root);
                case collective_kind::reduce:
                    return collectives::reduce(c, algo, p.data, red, p.root);
                case collective_kind::gather:
                    return collectives::gather(c, algo, p.in, p.data, p.root);
                default:
                    return collectives::scatter(c, algo, p.in, p.data, p.root);
            }
        },
        static_cast<collectives::algorithm>(p.algorithm));
}

COROCOLL_DECL bool process_group::run_at_once(const small_call& p) {
    using collectives::collective_kind;
    auto& g = *static_cast<process_group*>(p.group);
    transport::shm_arena& a = *g.arena_;
    const auto kind = static_cast<collective_kind>(p.kind);
    const bool root_writes = kind == collective_kind::broadcast || kind == collective_kind::scatter;
    // What this rank reads of the lines of those it waits for: a broadcast's or reduce's
    // buffer, a gather's block, a scatter's block where the root's lines hold it.
    const std::size_t reads =
        kind == collective_kind::gather ? p.in.size()
        : kind == collective_kind::scatter
            ? collectives::scatter_shm_offset(g.rank(), p.root, p.data.size()) + p.data.size()
            : p.data.size();
    // What `collective` does, less its frame, its context's deadline and its waits. A call
    // that would wait anywhere goes by its task, and so does one on a closed or failed group
    // (whose task throws the words for that) or one that must catch up first.
    if (g.closed_ || g.engine_.failed() || g.engine_.must_catch_up() ||
        !collectives::rooted_shm_ready(a, p.root, root_writes, reads) ||
        !g.collective_lock_.try_lock()) {
        return false;
    }
    // Nobody waited for the lock (it was free) and nobody can meanwhile: nothing here
    // suspends, so it comes free at once, without the reactor's queue.
    struct release {
        process_group& g;
        ~release() {
            g.engine_.end_collective();
            g.collective_lock_.unlock();
        }
    } release_at_end{g};
    const transport::collective_meta meta =
        g.begin_call(p.kind, static_cast<dtype>(p.type), p.count, p.redop, p.root, p.algorithm);
    // Nothing here waits, so the deadline is never read.
    collectives::context c{g.engine_, meta, std::chrono::steady_clock::time_point::max(),
                           g.chunk_bytes_, &g.scratch_};
    c.arena = &a;
    switch (kind) {
        case collective_kind::broadcast:
            collectives::broadcast_shm_now(c, p.data, p.root);
            break;
        case collective_kind::reduce:
            collectives::reduce_shm_now(
                c, p.data,
                collectives::reduction{static_cast<reduce_op>(p.redop), static_cast<dtype>(p.type)},
                p.root);
            break;
        case collective_kind::gather:
            collectives::gather_shm_now(c, p.in, p.data, p.root);
            break;
        default:
            collectives::scatter_shm_now(c, p.in, p.data, p.root);
            break;
    }
    g.engine_.raise_if_failed(meta);
    ++g.calls_at_once_;
    return true;
}

COROCOLL_DECL void process_group::check_open(const char* what) const {
    if (!closed_) return;
    throw std::logic_error(prefix(what) + "process group '" + name_ +
                           "' is closed (by close(), destroy_process_group() or the close "
                           "of the group it was made from)");
}

COROCOLL_DECL void process_group::revoke(std::string_view reason) {
    check_open("revoke");
    std::string text = "rank " + std::to_string(rank()) + " revoked process group '" + name_ + "'";
    if (!reason.empty()) text += ": " + std::string(reason);
    engine_.revoke(text);
}

COROCOLL_DECL std::optional<group_failure> process_group::failure() const {
    if (!engine_.failed()) return std::nullopt;
    return engine_.report();
}

COROCOLL_DECL task<group_failure> process_group::when_failed() {
    // The report is taken when the failure is known: the group may be gone when this resumes.
    co_return co_await engine_.until_failed();
}

COROCOLL_DECL void process_group::forgotten(void* self, const char* what) noexcept {
    auto& g = *static_cast<process_group*>(self);
    if (g.closed_) return;
    try {
        g.engine_.abandon("rank " + std::to_string(g.rank()) + " called " + what + " on group '" +
                          g.name_ +
                          "' but never awaited it (a forgotten co_await?): the collective "
                          "never ran");
    } catch (...) {
        std::terminate();  // out of memory for the words: still no silent skip
    }
}

COROCOLL_DECL task<int> process_group::send_then_peer(std::span<const std::byte> buf, int dst,
                                                      std::int64_t tag) {
    co_await engine_.send(buf, dst, tag, deadline());
    co_return dst;
}

COROCOLL_END_NAMESPACE
