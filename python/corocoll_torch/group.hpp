#pragma once

// The torch backend, part 5 of 7: the process group.
// A private header of backend.cpp, the backend's one translation unit, which includes it after
// torch's and corocoll's headers and the parts before it.

namespace corocoll_torch {

class group;

/// The groups of this process that are alive, for `close_all`.
struct group_registry {
    std::mutex m;
    std::vector<group*> groups;
};
inline group_registry& registry() {
    static group_registry* r = new group_registry;  // never destroyed: groups may outlive statics
    return *r;
}
inline void register_group(group* g) {
    std::lock_guard lock(registry().m);
    registry().groups.push_back(g);
}
inline void unregister_group(group* g) {
    std::lock_guard lock(registry().m);
    std::erase(registry().groups, g);
}
void close_all();

/// What the groups made from one set-up share: the reactor and the threads around it. A
/// group that `shrink` makes lives on the reactor of the group it was made from (its
/// connections are that reactor's), so the two share these, and they stop with the last.
struct runtime {
    cc::thread_pool store_pool{1};
    cc::thread_pool callbacks{1};
    std::shared_ptr<torch_store> adapter;
    // The job's store under torch's prefixes, where joiners meet the groups (see `grow`).
    std::shared_ptr<torch_store> lobby;
    // Last: it stops first, before the pools and the adapter it uses go away.
    progress_thread progress;
};

/// Runs the coroutine `body()` on `rt`'s progress thread and waits until it is over (the
/// caller releases the GIL first, where it holds it). `body` catches what it must report.
template <class Body>
void run_on(runtime& rt, Body body) {
    struct item_t : cc::detail::work_item {
        runtime* rt;
        Body* body;
        std::mutex m;
        std::condition_variable cv;
        bool done = false;
        bool eager = true;
    } item;
    item.rt = &rt;
    item.body = &body;
    item.run_ = [](cc::detail::work_item* i) noexcept {
        auto* s = static_cast<item_t*>(i);
        [](item_t* s) -> detached {
            try {
                co_await (*s->body)();
            } catch (...) {
            }
            s->rt->progress.finished(s->eager);
            std::lock_guard lock(s->m);
            s->done = true;
            s->cv.notify_all();
        }(s);
    };
    rt.progress.submit(item, true);
    std::unique_lock lock(item.m);
    item.cv.wait(lock, [&] { return item.done; });
}

#if COROCOLL_TORCH2
// torch 2.x: a backend, which torch's ProcessGroup dispatches CPU tensors to.
using torch_group_base = c10d::Backend;
#else
using torch_group_base = c10d::ProcessGroup;
#endif

/// The backend "corocoll": a c10d::Backend (torch 2.x) or c10d::ProcessGroup (torch 1.13)
/// whose operations run on a corocoll process_group on the group's own progress thread
/// (shared with the groups shrunk from it).
class group final : public torch_group_base {
public:
    group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, milliseconds timeout)
        : torch_group_base(rank, size), timeout_(timeout), rt_(std::make_shared<runtime>()) {
        // Ranks of this host that outnumber its processors must not busy-poll plainly. One
        // thread per rank drives the reactor at a time (progress_thread), so a rank counts
        // once.
        if (const char* local = std::getenv("LOCAL_WORLD_SIZE")) {
            cc::io::reactor::set_local_processes(std::atoi(local));
        }
        rt_->adapter = std::make_shared<torch_store>(store, rt_->store_pool);
        rt_->adapter->set_timeout(timeout);
        rt_->lobby = std::make_shared<torch_store>(base_store(store), rt_->store_pool);
        rt_->lobby->set_timeout(timeout);
        master_ = store_master(store);
        // Set-up runs on the progress thread; this thread waits, without the GIL.
        std::exception_ptr error;
        {
            without_gil released;
            run_on(*rt_, [&]() -> cc::task<> {
                try {
                    co_await set_up();
                } catch (...) {
                    error = std::current_exception();
                }
            });
        }
        if (error) {
            // The progress thread must not outlive a half-built group: the destructors below
            // (the runtime's progress thread first) stop it.
            std::rethrow_exception(error);
        }
    }

    /// A group that `shrink` made: `pg` on the reactor of `rt`, the one it was shrunk from.
    group(std::shared_ptr<runtime> rt, std::shared_ptr<cc::process_group> pg, milliseconds timeout)
        : torch_group_base(pg->rank(), pg->size()),
          timeout_(timeout),
          rt_(std::move(rt)),
          pg_(std::move(pg)) {}

    ~group() override {
        unregister_group(this);
        shutdown();
    }

    /// The group of this group's live ranks (cc::process_group::shrink), as a new torch
    /// process group on the same progress thread, and the rank in this group of each of its
    /// ranks (its rank r was this group's rank `ranks[r]`). Every live rank calls it, typically
    /// after the group failed; a rank left out, or a failure that leaves no group, raises an
    /// error naming the ranks and the reason. This group stays as it was (close or abort it).
    std::pair<c10::intrusive_ptr<group>, std::vector<int>> shrink(milliseconds join_window) {
        std::shared_ptr<cc::process_group> next;
        std::vector<int> ranks;
        std::exception_ptr error;
        {
            without_gil released;
            if (!pg_) throw std::runtime_error("corocoll_torch.shrink: the group was never set up");
            on_progress([&](group& g) -> cc::task<> {
                try {
                    next = co_await g.pg_->shrink(join_window);
                    // Each member's rank here, from every member: torch maps a group's ranks
                    // to the job's.
                    std::vector<std::int32_t> all(static_cast<std::size_t>(next->size()));
                    std::array<std::int32_t, 1> mine{g.pg_->rank()};
                    co_await next->all_gather_into(all, mine);
                    ranks.assign(all.begin(), all.end());
                } catch (...) {
                    error = std::current_exception();
                }
            });
        }
        if (error) std::rethrow_exception(error);
        auto made = c10::make_intrusive<group>(rt_, std::move(next), timeout_);
        register_group(made.get());
        return {made, std::move(ranks)};
    }

    /// The group grown to `new_size` ranks (cc::process_group::grow): this group's ranks keep
    /// their numbers and the processes that joined (`join`) come after them. Every rank of
    /// this group calls it; too few joiners within `join_window` raise the count everywhere
    /// and leave this group as it was.
    c10::intrusive_ptr<group> grow(int new_size, milliseconds join_window) {
        std::shared_ptr<cc::process_group> next;
        std::exception_ptr error;
        {
            without_gil released;
            if (!pg_) throw std::runtime_error("corocoll_torch.grow: the group was never set up");
            on_progress([&](group& g) -> cc::task<> {
                try {
                    next = co_await g.pg_->grow(new_size, join_window);
                } catch (...) {
                    error = std::current_exception();
                }
            });
        }
        if (error) std::rethrow_exception(error);
        auto made = c10::make_intrusive<group>(rt_, std::move(next), timeout_);
        register_group(made.get());
        return made;
    }

    /// A process that joins the job's groups (cc::join_process_group) through `store`, the
    /// job's store (under whatever prefixes: they meet under all of them, in `base_store`): it
    /// waits (up to `timeout`) until the ranks of a group of the job call `grow`, and yields
    /// its place in the grown group.
    static c10::intrusive_ptr<group> join(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                          int size, milliseconds timeout) {
        if (const char* local = std::getenv("LOCAL_WORLD_SIZE")) {
            cc::io::reactor::set_local_processes(std::atoi(local));
        }
        auto rt = std::make_shared<runtime>();
        rt->lobby = std::make_shared<torch_store>(base_store(store), rt->store_pool);
        rt->lobby->set_timeout(timeout);
        cc::init_options o;
        o.store = rt->lobby;
        o.store_address = store_master(store);
        o.rank = rank;
        o.world_size = size;
        o.group_name = lobby_name;
        o.timeout = timeout;
        std::shared_ptr<cc::process_group> pg;
        std::exception_ptr error;
        {
            without_gil released;
            run_on(*rt, [&]() -> cc::task<> {
                try {
                    pg = co_await cc::join_process_group(rt->progress.reactor(), o);
                } catch (...) {
                    error = std::current_exception();
                }
            });
        }
        if (error) std::rethrow_exception(error);
        auto made = c10::make_intrusive<group>(std::move(rt), std::move(pg), timeout);
        register_group(made.get());
        return made;
    }

    /// Closes the group, first waiting (up to `linger()`) until every live peer has closed its
    /// own too: a rank whose program is done must not leave while a peer still needs it (rank
    /// 0's process serves torch's store, which a slower rank may still be polling in the
    /// store-based barrier at the end of init_process_group). Idempotent; operations after it
    /// fail, naming the closed group. Called by destroy_process_group (through the
    /// destructor) and, for every group still open, when the process exits (`close_all`).
    void shutdown()
#if COROCOLL_TORCH2
        override  // torch 2.x's destroy_process_group calls it
#endif
    {
        without_gil released;
        std::lock_guard once(shutdown_m_);
        if (!pg_ || pg_->closed()) return;
        on_progress([](group& g) { return g.pg_->close_after_peers(g.linger()); });
    }

    /// Aborts the group, from any thread (what later torch calls ProcessGroup::abort, and
    /// TorchFT asks of a backend): revokes it, so every Work in flight here and on every live
    /// peer fails with "rank R revoked process group ...: `reason`", then closes it at once,
    /// without waiting for the peers. Idempotent; operations after it fail, naming the closed
    /// group.
    void abort(const std::string& reason) {
        without_gil released;
        std::lock_guard once(shutdown_m_);
        if (!pg_ || pg_->closed()) return;
        on_progress([&reason](group& g) {
            g.pg_->revoke(reason);
            return g.pg_->close();
        });
    }

    /// How the group failed (revoked, a rank that failed, a mismatch, closed), if it has:
    /// the asynchronous error query, read on the reactor's thread.
    std::optional<cc::group_failure> failure() {
        without_gil released;
        std::optional<cc::group_failure> f;
        if (!pg_) return f;
        on_progress([&f](group& g) -> cc::task<> {
            f = g.pg_->failure();
            co_return;
        });
        return f;
    }

    /// How long a close waits for the peers to close too: the group's timeout, at most 60 s
    /// (a peer that takes longer is stuck or still working, and this rank goes).
    milliseconds linger() const noexcept { return std::min<milliseconds>(timeout_, max_linger); }
    static constexpr milliseconds max_linger{60'000};

    const std::string getBackendName() const override { return "corocoll"; }

#if COROCOLL_TORCH2
    /// torch 2.x's abort (ProcessGroup::abort, destroy_process_group after a failure).
    void abort() override { abort("aborted through torch"); }

    // Coalescing (torch 2.x's _coalescing_manager, batch_isend_irecv): the operations between
    // start and end run as they are called, and end yields one Work that completes when they
    // all have.
    bool supportsCoalescing() const override { return true; }

    void startCoalescing() override {
        if (coalescing_) refuse("startCoalescing", "coalescing has started already");
        coalescing_ = true;
        coalesced_.clear();
    }

    c10::intrusive_ptr<c10d::Work> endCoalescing() override {
        if (!coalescing_) refuse("endCoalescing", "no startCoalescing before it");
        coalescing_ = false;
        return c10::make_intrusive<joined_work>(getRank(), c10d::OpType::COALESCED,
                                                std::exchange(coalesced_, {}));
    }

    /// torch 2.x's entry for sparse tensors (its dispatcher may send them here, not to
    /// allreduce): the same sum as allreduce's.
    c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                    const c10d::AllreduceOptions& opts) override {
        return allreduce(tensors, opts);
    }

    /// torch 2.x's coalesced all_gather_into_tensor: one all_gather per pair, in order.
    c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
        std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::AllgatherOptions& opts) override {
        return pairs("allgather_into_tensor_coalesced", outputs, inputs,
                     [&](at::Tensor& o, at::Tensor& i) { return _allgather_base(o, i, opts); });
    }

    /// torch 2.x's coalesced reduce_scatter_tensor: one reduce_scatter per pair, in order.
    c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
        std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::ReduceScatterOptions& opts) override {
        return pairs(
            "reduce_scatter_tensor_coalesced", outputs, inputs,
            [&](at::Tensor& o, at::Tensor& i) { return _reduce_scatter_base(o, i, opts); });
    }
#endif

    progress_thread& progress() noexcept { return rt_->progress; }
    cc::thread_pool& callbacks() noexcept { return rt_->callbacks; }
    cc::process_group& pg() noexcept { return *pg_; }

    // ---- point-to-point ----

    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                        int tag) override {
        auto t = one_input("send", tensors);
        check_peer("send", dst);
        return start(c10d::OpType::SEND, {"send to rank", dst}, {}, {},
                     [t, dst, tag](auto& pg) -> cc::task<int> {
                         co_await pg.send(bytes_of(t), dst, tag);
                         co_return -1;
                     });
    }

    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                        int tag) override {
        check_peer("recv", src);
        return receive(c10d::OpType::RECV, {"recv from rank", src}, tensors, src, tag);
    }

    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                                 int tag) override {
        return receive(c10d::OpType::RECVANYSOURCE, "recv from any source", tensors, cc::any_source,
                       tag);
    }

    // ---- collectives ----

    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
        return start(c10d::OpType::BARRIER, "barrier", {}, {}, [](auto& pg) -> cc::task<int> {
            co_await pg.barrier();
            co_return -1;
        });
    }

    void monitoredBarrier(const c10d::BarrierOptions& opts, bool /*wait_all_ranks*/) override {
        // corocoll's names every rank that did not arrive, as wait_all_ranks=True does.
        auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
        auto w = start(c10d::OpType::BARRIER, "monitored_barrier", {}, {},
                       [timeout](auto& pg) -> cc::task<int> {
                           co_await pg.monitored_barrier(timeout);
                           co_return -1;
                       });
        w->wait(::kNoTimeout);
    }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const c10d::BroadcastOptions& opts) override {
        auto a = one_inout("broadcast", tensors);
        int root = root_of("broadcast", opts.rootRank, opts.rootTensor);
        return typed(c10d::OpType::BROADCAST, "broadcast", a.dense, tensors, {a},
                     [root](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                         auto s = span_of<decltype(elem)>(t);
                         co_await pg.broadcast(s, root);
                         co_return -1;
                     });
    }

    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const c10d::AllreduceOptions& opts) override {
        if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse()) {
            return sparse_allreduce(tensors[0], opts.reduceOp);
        }
        auto a = one_inout("allreduce", tensors);
        auto op = op_of("allreduce", opts.reduceOp);
        return reducing(c10d::OpType::ALLREDUCE, "allreduce", a.dense, tensors, {a},
                        [op](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                            auto s = span_of<decltype(elem)>(t);
                            co_await pg.all_reduce(s, op);
                            co_return -1;
                        });
    }

    /// all_reduce of a sparse (COO) tensor, summed as Gloo sums one (embedding layers with
    /// sparse gradients need it): every rank's coalesced indices and values are gathered, each
    /// rank's padded to the largest count, and the entries of all ranks are laid end to end
    /// and summed by coalesce(). Three all_gathers: the counts, the indices, the values;
    /// bytes on the wire per rank: (size - 1) x the largest rank's entries.
    c10::intrusive_ptr<c10d::Work> sparse_allreduce(at::Tensor& t, const c10d::ReduceOp& op) {
        const char* what = "allreduce";
        if (!t.device().is_cpu()) {
            refuse(what,
                   "a tensor on " + t.device().str() + " (the corocoll backend takes CPU tensors)");
        }
        if (t.layout() != at::kSparse) refuse(what, "a sparse layout other than COO");
        if (op != c10d::ReduceOp::SUM) {
            refuse(what, "a sparse tensor with an op other than SUM (sparse tensors are summed)");
        }
        at::Tensor in = t.coalesce();
        std::int64_t nnz = in._nnz();
        // One row per entry: its indices, then its values (the dense dimensions flattened).
        at::Tensor indices = in._indices().t().contiguous();
        std::int64_t row = 1;
        for (std::int64_t d = in.sparse_dim(); d < in.dim(); ++d) row *= in.size(d);
        at::Tensor values = in._values().reshape({nnz, row}).contiguous();
        auto body = [t, in, indices, values, nnz, row](cc::process_group& pg) -> cc::task<int> {
            auto n = static_cast<std::int64_t>(pg.size());
            std::vector<std::int64_t> mine{nnz}, counts(static_cast<std::size_t>(n));
            co_await pg.all_gather_into(counts, mine);
            std::int64_t most = *std::max_element(counts.begin(), counts.end());
            auto sparse_dim = indices.size(1);
            at::Tensor my_idx = at::zeros({most, sparse_dim}, indices.options());
            at::Tensor my_val = at::zeros({most, row}, in._values().options());
            if (nnz > 0) {
                my_idx.narrow(0, 0, nnz).copy_(indices);
                my_val.narrow(0, 0, nnz).copy_(values);
            }
            at::Tensor all_idx = at::empty({n * most, sparse_dim}, indices.options());
            at::Tensor all_val = at::empty({n * most, row}, my_val.options());
            auto out_idx = span_of<std::uint8_t>(all_idx);
            auto out_val = span_of<std::uint8_t>(all_val);
            co_await pg.all_gather_into(out_idx, span_of<std::uint8_t>(my_idx));
            co_await pg.all_gather_into(out_val, span_of<std::uint8_t>(my_val));
            std::vector<at::Tensor> idx_parts, val_parts;
            for (std::int64_t r = 0; r < n; ++r) {
                idx_parts.push_back(all_idx.narrow(0, r * most, counts[r]));
                val_parts.push_back(all_val.narrow(0, r * most, counts[r]));
            }
            std::vector<std::int64_t> value_shape{-1};
            for (std::int64_t d = in.sparse_dim(); d < in.dim(); ++d) {
                value_shape.push_back(in.size(d));
            }
            at::Tensor sum = at::sparse_coo_tensor(at::cat(idx_parts).t(),
                                                   at::cat(val_parts).reshape(value_shape),
                                                   in.sizes(), in.options())
                                 .coalesce();
            at::Tensor out = t;
            out.copy_(sum);
            co_return -1;
        };
        return start(c10d::OpType::ALLREDUCE, what, {t}, {}, std::move(body));
    }

    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
        std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
        if (tensors.empty()) refuse("allreduce_coalesced", "an empty tensor list");
        for (auto& t : tensors) {
            check_cpu("allreduce_coalesced", t);
            if (t.scalar_type() != tensors[0].scalar_type()) {
                refuse("allreduce_coalesced", "tensors of different dtypes");
            }
        }
        auto op = op_of("allreduce_coalesced", opts.reduceOp);
        // One all_reduce over the tensors laid end to end; copied back on success.
        std::vector<at::Tensor> flat_parts;
        for (auto& t : tensors) flat_parts.push_back(t.reshape({-1}));
        at::Tensor flat = at::cat(flat_parts);
        std::vector<tensor_arg> back;
        std::int64_t at_elem = 0;
        for (auto& t : tensors) {
            back.push_back({t, flat.narrow(0, at_elem, t.numel()).view(t.sizes())});
            at_elem += t.numel();
        }
        return reducing(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", flat, tensors,
                        std::move(back),
                        [op](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                            auto s = span_of<decltype(elem)>(t);
                            co_await pg.all_reduce(s, op);
                            co_return -1;
                        });
    }

    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                          const c10d::ReduceOptions& opts) override {
        auto a = one_inout("reduce", tensors);
        auto op = op_of("reduce", opts.reduceOp);
        int root = root_of("reduce", opts.rootRank, opts.rootTensor);
        return reducing(c10d::OpType::REDUCE, "reduce", a.dense, tensors, {a},
                        [op, root](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                            auto s = span_of<decltype(elem)>(t);
                            co_await pg.reduce(s, root, op);
                            co_return -1;
                        });
    }

    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                   const c10d::AllgatherOptions&) override {
        check_cpu("_allgather_base", in);
        check_cpu("_allgather_base", out);
        same_dtype("_allgather_base", in, out);
        if (out.numel() != in.numel() * getSize()) {
            refuse("_allgather_base",
                   "an output of " + std::to_string(out.numel()) + " elements for an input of " +
                       std::to_string(in.numel()) + " on " + std::to_string(getSize()) +
                       " ranks (needs " + std::to_string(in.numel() * getSize()) + ")");
        }
        tensor_arg o = dense_arg(out);
        at::Tensor i = in.contiguous();
        std::vector<at::Tensor> outs{out};
        return typed(c10d::OpType::_ALLGATHER_BASE, "_allgather_base", i, outs, {o},
                     [o = o.dense](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                         using T = decltype(elem);
                         auto os = span_of<T>(o);
                         co_await pg.all_gather_into(os, span_of<T>(t));
                         co_return -1;
                     });
    }

    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const c10d::AllgatherOptions&) override {
        at::Tensor in = one_input("allgather", inputs);
        if (outputs.size() != 1) refuse("allgather", multi(outputs.size(), "output lists"));
        auto list = gathered_list("allgather", outputs[0], in);
        std::vector<at::Tensor> outs = outputs[0];
        return typed(c10d::OpType::ALLGATHER, "allgather", in, outs, std::move(list.back),
                     [flat = list.flat](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                         using T = decltype(elem);
                         auto os = span_of<T>(flat);
                         co_await pg.all_gather_into(os, span_of<T>(t));
                         co_return -1;
                     });
    }

    /// torch's all_gather_coalesced: `outputs[r][i]` gets rank r's `inputs[i]`. The inputs
    /// (one dtype, any shapes, the same on every rank) are laid end to end and go as one
    /// all_gather; each rank's block is then copied into its outputs.
    c10::intrusive_ptr<c10d::Work> allgather_coalesced(
        std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::AllgatherOptions&) override {
        const char* what = "allgather_coalesced";
        if (inputs.empty()) refuse(what, "an empty input list");
        for (auto& t : inputs) {
            check_cpu(what, t);
            same_dtype(what, inputs[0], t);
        }
        if (outputs.size() != static_cast<std::size_t>(getSize())) {
            refuse(what, std::to_string(outputs.size()) + " output lists in a group of " +
                             std::to_string(getSize()));
        }
        std::vector<at::Tensor> parts;
        std::int64_t total = 0;
        for (auto& t : inputs) {
            parts.push_back(t.reshape({-1}));
            total += t.numel();
        }
        at::Tensor in = at::cat(parts);
        at::Tensor flat = at::empty({total * getSize()}, in.options());
        std::vector<tensor_arg> back;
        std::vector<at::Tensor> outs;
        for (std::size_t r = 0; r < outputs.size(); ++r) {
            if (outputs[r].size() != inputs.size()) {
                refuse(what, "output list " + std::to_string(r) + " has " +
                                 std::to_string(outputs[r].size()) + " tensors, the input list " +
                                 std::to_string(inputs.size()));
            }
            std::int64_t at_elem = static_cast<std::int64_t>(r) * total;
            for (std::size_t i = 0; i < inputs.size(); ++i) {
                const at::Tensor& o = outputs[r][i];
                check_cpu(what, o);
                same_dtype(what, inputs[0], o);
                if (o.numel() != inputs[i].numel()) {
                    refuse(what, "output " + std::to_string(i) + " of rank " + std::to_string(r) +
                                     " has " + std::to_string(o.numel()) + " elements, input " +
                                     std::to_string(i) + " " + std::to_string(inputs[i].numel()));
                }
                back.push_back({o, flat.narrow(0, at_elem, o.numel()).view(o.sizes())});
                outs.push_back(o);
                at_elem += o.numel();
            }
        }
        return typed(c10d::OpType::ALLGATHER_COALESCED, what, in, outs, std::move(back),
                     [flat](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                         using T = decltype(elem);
                         auto os = span_of<T>(flat);
                         co_await pg.all_gather_into(os, span_of<T>(t));
                         co_return -1;
                     });
    }

    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::GatherOptions& opts) override {
        at::Tensor in = one_input("gather", inputs);
        int root = root_of("gather", opts.rootRank, 0);
        flat_list list;
        std::vector<at::Tensor> outs;
        if (getRank() == root) {
            if (outputs.size() != 1) refuse("gather", multi(outputs.size(), "output lists"));
            list = gathered_list("gather", outputs[0], in);
            outs = outputs[0];
        } else if (!outputs.empty()) {
            refuse("gather", "an output list on rank " + std::to_string(getRank()) +
                                 ", which is not the root (" + std::to_string(root) + ")");
        } else {
            list.flat = at::empty({0}, in.options());
        }
        return typed(
            c10d::OpType::GATHER, "gather", in, outs, std::move(list.back),
            [flat = list.flat, root](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                using T = decltype(elem);
                auto os = span_of<T>(flat);
                co_await pg.gather_into(span_of<T>(t), os, root);
                co_return -1;
            });
    }

    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const c10d::ScatterOptions& opts) override {
        auto a = one_inout("scatter", outputs);
        int root = root_of("scatter", opts.rootRank, 0);
        at::Tensor flat;
        if (getRank() == root) {
            if (inputs.size() != 1) refuse("scatter", multi(inputs.size(), "input lists"));
            flat = concat("scatter", inputs[0], a.dense);
        } else if (!inputs.empty()) {
            refuse("scatter", "an input list on rank " + std::to_string(getRank()) +
                                  ", which is not the root (" + std::to_string(root) + ")");
        } else {
            flat = at::empty({0}, a.dense.options());
        }
        return typed(c10d::OpType::SCATTER, "scatter", a.dense, outputs, {a},
                     [flat, root](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                         using T = decltype(elem);
                         auto os = span_of<T>(t);
                         co_await pg.scatter_from(os, span_of<T>(flat), root);
                         co_return -1;
                     });
    }

    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const c10d::ReduceScatterOptions& opts) override {
        auto a = one_inout("reduce_scatter", outputs);
        if (inputs.size() != 1) refuse("reduce_scatter", multi(inputs.size(), "input lists"));
        auto op = op_of("reduce_scatter", opts.reduceOp);
        at::Tensor flat = concat("reduce_scatter", inputs[0], a.dense);
        return reducing(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", a.dense, outputs, {a},
                        [flat, op](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                            using T = decltype(elem);
                            auto os = span_of<T>(t);
                            co_await pg.reduce_scatter_into(os, span_of<T>(flat), op);
                            co_return -1;
                        });
    }

    c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
        at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) override {
        check_cpu("_reduce_scatter_base", in);
        check_cpu("_reduce_scatter_base", out);
        same_dtype("_reduce_scatter_base", in, out);
        auto op = op_of("_reduce_scatter_base", opts.reduceOp);
        tensor_arg o = dense_arg(out);
        at::Tensor i = in.contiguous();
        std::vector<at::Tensor> outs{out};
        return reducing(c10d::OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", o.dense, outs,
                        {o}, [i, op](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                            using T = decltype(elem);
                            auto os = span_of<T>(t);
                            co_await pg.reduce_scatter_into(os, span_of<T>(i), op);
                            co_return -1;
                        });
    }

    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in,
                                                 std::vector<int64_t>& out_splits,
                                                 std::vector<int64_t>& in_splits,
                                                 const c10d::AllToAllOptions&) override {
        check_cpu("alltoall_base", in);
        check_cpu("alltoall_base", out);
        same_dtype("alltoall_base", in, out);
        // torch's splits count rows (the first dimension); corocoll's count elements.
        auto elements = [&](const char* name, const at::Tensor& t,
                            const std::vector<int64_t>& rows) {
            std::vector<std::size_t> out_counts;
            if (rows.empty()) return out_counts;
            if (rows.size() != static_cast<std::size_t>(getSize())) {
                refuse("alltoall_base", std::string(name) + " split sizes for " +
                                            std::to_string(rows.size()) + " ranks in a group of " +
                                            std::to_string(getSize()));
            }
            std::int64_t row = t.dim() == 0 || t.size(0) == 0 ? 0 : t.numel() / t.size(0);
            for (auto r : rows) {
                if (r < 0) refuse("alltoall_base", std::string("a negative ") + name + " split");
                out_counts.push_back(static_cast<std::size_t>(r * row) * raw_scale(t));
            }
            return out_counts;
        };
        auto os = elements("output", out, out_splits);
        auto is = elements("input", in, in_splits);
        if (os.empty() != is.empty()) {
            // One side even: spell it out, as torch does.
            auto even = [&](const at::Tensor& t) {
                std::vector<std::size_t> v(
                    static_cast<std::size_t>(getSize()),
                    static_cast<std::size_t>(t.numel() / getSize()) * raw_scale(t));
                return v;
            };
            if (os.empty()) os = even(out);
            if (is.empty()) is = even(in);
        }
        tensor_arg o = dense_arg(out);
        at::Tensor i = in.contiguous();
        std::vector<at::Tensor> outs{out};
        return typed(
            c10d::OpType::ALLTOALL_BASE, "alltoall_base", i, outs, {o},
            [o = o.dense, os, is](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                using T = decltype(elem);
                auto out_span = span_of<T>(o);
                co_await pg.all_to_all_single(out_span, span_of<T>(t), os, is);
                co_return -1;
            });
    }

    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                            std::vector<at::Tensor>& inputs,
                                            const c10d::AllToAllOptions&) override {
        auto n = static_cast<std::size_t>(getSize());
        if (inputs.size() != n || outputs.size() != n) {
            refuse("alltoall", "lists of " + std::to_string(inputs.size()) + " inputs and " +
                                   std::to_string(outputs.size()) + " outputs in a group of " +
                                   std::to_string(getSize()) + " (one per rank)");
        }
        for (auto& t : inputs) {
            check_cpu("alltoall", t);
            same_dtype("alltoall", inputs[0], t);
        }
        for (auto& t : outputs) {
            check_cpu("alltoall", t);
            same_dtype("alltoall", inputs[0], t);
        }
        std::vector<std::size_t> is, os;
        std::vector<at::Tensor> in_parts;
        for (auto& t : inputs) {
            is.push_back(static_cast<std::size_t>(t.numel()) * raw_scale(t));
            in_parts.push_back(t.reshape({-1}));
        }
        at::Tensor in_flat = at::cat(in_parts);
        std::int64_t total = 0;
        for (auto& t : outputs) {
            os.push_back(static_cast<std::size_t>(t.numel()) * raw_scale(t));
            total += t.numel();
        }
        at::Tensor out_flat = at::empty({total}, in_flat.options());
        std::vector<tensor_arg> back;
        std::int64_t at_elem = 0;
        for (auto& t : outputs) {
            back.push_back({t, out_flat.narrow(0, at_elem, t.numel()).view(t.sizes())});
            at_elem += t.numel();
        }
        return typed(c10d::OpType::ALLTOALL, "alltoall", in_flat, outputs, std::move(back),
                     [out_flat, os, is](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                         using T = decltype(elem);
                         auto out_span = span_of<T>(out_flat);
                         co_await pg.all_to_all_single(out_span, span_of<T>(t), os, is);
                         co_return -1;
                     });
    }

private:
    friend class work;

    cc::task<> set_up() {
        auto scoped = std::make_shared<cc::rendezvous::prefix_store>("corocoll", rt_->adapter);
        pg_ = co_await cc::detail::build_group(
            progress().reactor(), std::move(scoped), getRank(), getSize(), lobby_name, timeout_, {},
            cc::transport::choose_listen_address(master_), nullptr);
        // Where processes that `join` through the job's store meet it (see `grow`).
        cc::detail::open_lobby(*pg_, rt_->lobby, lobby_name);
    }

    // The name of the groups set up on torch's store, and of their lobby.
    static constexpr const char* lobby_name = "torch";

    std::string who() const {
        return "rank " + std::to_string(getRank()) + " of " + std::to_string(getSize());
    }

    [[noreturn]] void refuse(const std::string& op, const std::string& why) const {
        throw std::invalid_argument("corocoll backend: " + op + " on " + who() + ": " + why);
    }
    static std::string multi(std::size_t n, const char* what) {
        return std::to_string(n) + " " + what +
               " (one tensor per rank and call; lists of several tensors per rank are not "
               "supported)";
    }

    void check_cpu(const char* op, const at::Tensor& t) const {
        if (!t.defined()) refuse(op, "an undefined tensor");
        if (!t.device().is_cpu()) {
            refuse(op,
                   "a tensor on " + t.device().str() + " (the corocoll backend takes CPU tensors)");
        }
        if (t.layout() != at::kStrided) refuse(op, "a sparse tensor (only dense tensors)");
    }
    void same_dtype(const char* op, const at::Tensor& a, const at::Tensor& b) const {
        if (a.scalar_type() != b.scalar_type()) {
            refuse(op, std::string("tensors of different dtypes (") +
                           c10::toString(a.scalar_type()) + " and " +
                           c10::toString(b.scalar_type()) + ")");
        }
    }
    void check_peer(const char* op, int peer) const {
        if (peer < 0 || peer >= getSize()) {
            refuse(op, "rank " + std::to_string(peer) + " is outside [0, " +
                           std::to_string(getSize()) + ")");
        }
        if (peer == getRank()) refuse(op, "a message to or from itself");
    }
    int root_of(const char* op, std::int64_t root, std::int64_t root_tensor) const {
        if (root_tensor != 0)
            refuse(op, "rootTensor " + std::to_string(root_tensor) + " (one tensor per rank)");
        if (root < 0 || root >= getSize()) {
            refuse(op, "root " + std::to_string(root) + " is outside [0, " +
                           std::to_string(getSize()) + ")");
        }
        return static_cast<int>(root);
    }
    cc::reduce_op op_of(const char* op, const c10d::ReduceOp& r) const {
        switch (r.op_) {
            case c10d::ReduceOp::SUM:
                return cc::reduce_op::sum;
            case c10d::ReduceOp::AVG:
                return cc::reduce_op::avg;
            case c10d::ReduceOp::PRODUCT:
                return cc::reduce_op::product;
            case c10d::ReduceOp::MIN:
                return cc::reduce_op::min;
            case c10d::ReduceOp::MAX:
                return cc::reduce_op::max;
            case c10d::ReduceOp::BAND:
                return cc::reduce_op::band;
            case c10d::ReduceOp::BOR:
                return cc::reduce_op::bor;
            case c10d::ReduceOp::BXOR:
                return cc::reduce_op::bxor;
            default:
                refuse(op, "ReduceOp " + std::to_string(static_cast<int>(r.op_)) +
                               " (PREMUL_SUM is NCCL's)");
        }
    }

    at::Tensor one_input(const char* op, const std::vector<at::Tensor>& tensors) const {
        if (tensors.size() != 1) refuse(op, multi(tensors.size(), "tensors"));
        check_cpu(op, tensors[0]);
        return tensors[0].contiguous();
    }
    tensor_arg dense_arg(const at::Tensor& t) const {
        return {t, t.is_contiguous() ? t : t.contiguous()};
    }
    tensor_arg one_inout(const char* op, const std::vector<at::Tensor>& tensors) const {
        if (tensors.size() != 1) refuse(op, multi(tensors.size(), "tensors"));
        check_cpu(op, tensors[0]);
        return dense_arg(tensors[0]);
    }

    struct flat_list {
        at::Tensor flat;
        std::vector<tensor_arg> back;
    };
    // The output list of a gathering collective as one flat tensor: the list's own memory when
    // its tensors lie end to end in it (views of one tensor, as torch's chunk makes), else a
    // new tensor whose pieces are copied into the list on success.
    flat_list gathered_list(const char* op, const std::vector<at::Tensor>& list,
                            const at::Tensor& in) const {
        if (list.size() != static_cast<std::size_t>(getSize())) {
            refuse(op, "an output list of " + std::to_string(list.size()) +
                           " tensors in a group of " + std::to_string(getSize()));
        }
        bool adjacent = true;
        auto bytes = static_cast<std::size_t>(in.nbytes());
        for (std::size_t r = 0; r < list.size(); ++r) {
            const auto& t = list[r];
            check_cpu(op, t);
            same_dtype(op, in, t);
            if (t.numel() != in.numel()) {
                refuse(op, "output " + std::to_string(r) + " has " + std::to_string(t.numel()) +
                               " elements, the input " + std::to_string(in.numel()));
            }
            adjacent = adjacent && t.is_contiguous() &&
                       static_cast<char*>(t.data_ptr()) ==
                           static_cast<char*>(list[0].data_ptr()) + r * bytes;
        }
        flat_list out;
        if (adjacent && bytes > 0) {
            // The list's own memory, from the first tensor's place on, without a call through
            // torch's dispatcher (from_blob makes the tensor directly; it owns nothing: the
            // Work keeps the list's tensors, and so their storage, until the operation ends).
            out.flat = at::from_blob(list[0].data_ptr(), {in.numel() * getSize()}, in.options());
            return out;
        }
        out.flat = at::empty({in.numel() * getSize()}, in.options());
        for (std::size_t r = 0; r < list.size(); ++r) {
            out.back.push_back(
                {list[r], out.flat.narrow(0, static_cast<std::int64_t>(r) * in.numel(), in.numel())
                              .view(list[r].sizes())});
        }
        return out;
    }

    // The input list of a scattering collective laid end to end.
    at::Tensor concat(const char* op, const std::vector<at::Tensor>& list,
                      const at::Tensor& out) const {
        if (list.size() != static_cast<std::size_t>(getSize())) {
            refuse(op, "an input list of " + std::to_string(list.size()) +
                           " tensors in a group of " + std::to_string(getSize()));
        }
        std::vector<at::Tensor> parts;
        for (std::size_t r = 0; r < list.size(); ++r) {
            check_cpu(op, list[r]);
            same_dtype(op, out, list[r]);
            if (list[r].numel() != out.numel()) {
                refuse(op, "input " + std::to_string(r) + " has " +
                               std::to_string(list[r].numel()) + " elements, the output " +
                               std::to_string(out.numel()));
            }
            parts.push_back(list[r].reshape({-1}));
        }
        return at::cat(parts);
    }

    c10::intrusive_ptr<c10d::Work> receive(c10d::OpType type, op_label what,
                                           std::vector<at::Tensor>& tensors, int src, int tag) {
        auto a = one_inout("recv", tensors);
        at::Tensor t = a.dense;
        return start(type, what, tensors, {a}, [t, src, tag](auto& pg) -> cc::task<int> {
            auto b = writable_bytes_of(t);
            co_return co_await pg.recv(b, src, tag);
        });
    }

    static std::span<const std::byte> bytes_of(const at::Tensor& t) {
        return {static_cast<const std::byte*>(t.data_ptr()), t.nbytes()};
    }
    static std::span<std::byte> writable_bytes_of(const at::Tensor& t) {
        return {static_cast<std::byte*>(t.data_ptr()), t.nbytes()};
    }

    template <class Body>
    c10::intrusive_ptr<c10d::Work> start(c10d::OpType type, op_label what,
                                         std::vector<at::Tensor> outputs,
                                         std::vector<tensor_arg> args, Body body) {
        auto w = c10::make_intrusive<op_work<Body>>(
            getRank(), getSize(), type, what, std::move(outputs), std::move(args), std::move(body));
        w->submit(*this);
#if COROCOLL_TORCH2
        if (coalescing_) coalesced_.push_back(w);
#endif
        return w;
    }

    // An operation on the elements of `t` as corocoll's type for its dtype. A dtype corocoll
    // has no type for moves its bytes as uint8 (all ranks do the same), unless the operation
    // `reduces`: a reduction needs corocoll's type, so that dtype is refused.
    template <class Body>
    c10::intrusive_ptr<c10d::Work> typed(c10d::OpType type, const char* what, at::Tensor t,
                                         std::vector<at::Tensor> outputs,
                                         std::vector<tensor_arg> args, Body body,
                                         bool reduces = false) {
        c10::intrusive_ptr<c10d::Work> w;
        bool known = with_element(t.scalar_type(), [&](auto elem) {
            // Called at most once, and then `outputs` and `args` are not used again.
            w = start(type, what, std::move(outputs), std::move(args),
                      [t, body = std::move(body), elem](cc::process_group& pg) {
                          return body(pg, elem, t);
                      });
        });
        if (known) return w;
        if (reduces) {
            refuse(what, std::string("dtype ") + c10::toString(t.scalar_type()) +
                             " cannot be reduced (corocoll reduces int8, uint8, int32, int64, "
                             "float16, bfloat16, float32, float64)");
        }
        at::Tensor raw = t.view({-1}).view(at::kByte);
        return start(type, what, std::move(outputs), std::move(args),
                     [raw, body](cc::process_group& pg) { return body(pg, std::uint8_t{}, raw); });
    }

    // `typed` for a reduction.
    template <class Body>
    c10::intrusive_ptr<c10d::Work> reducing(c10d::OpType type, const char* what, at::Tensor t,
                                            std::vector<at::Tensor> outputs,
                                            std::vector<tensor_arg> args, Body body) {
        return typed(type, what, std::move(t), std::move(outputs), std::move(args), std::move(body),
                     true);
    }

#if COROCOLL_TORCH2
    // `each(outputs[i], inputs[i])` for every pair, as one Work.
    template <class Each>
    c10::intrusive_ptr<c10d::Work> pairs(const char* op, std::vector<at::Tensor>& outputs,
                                         std::vector<at::Tensor>& inputs, Each each) const {
        if (outputs.size() != inputs.size()) {
            refuse(op, std::to_string(outputs.size()) + " outputs for " +
                           std::to_string(inputs.size()) + " inputs (one output per input)");
        }
        std::vector<c10::intrusive_ptr<c10d::Work>> parts;
        for (std::size_t i = 0; i < inputs.size(); ++i)
            parts.push_back(each(outputs[i], inputs[i]));
        return c10::make_intrusive<joined_work>(getRank(), c10d::OpType::COALESCED,
                                                std::move(parts));
    }

    // The Works started between startCoalescing and endCoalescing (the caller's thread).
    bool coalescing_ = false;
    std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
#endif

    milliseconds timeout_;
    // Runs `body(*this)` (a task) on the reactor, as the progress thread drives it, and waits
    // for it without the GIL; what it throws is dropped (closing never fails the caller).
    template <class Body>
    void on_progress(Body body) {
        run_on(*rt_, [&]() -> cc::task<> { co_await body(*this); });
    }

    std::mutex shutdown_m_;
    std::optional<cc::io::endpoint> master_;
    // Before the group: the group goes first, then (with the last group made from the same
    // set-up) the progress thread, the pools and the adapter.
    std::shared_ptr<runtime> rt_;
    std::shared_ptr<cc::process_group> pg_;
};

}  // namespace corocoll_torch
