#pragma once

// Backend "nccl": process groups whose buffers are CUDA device memory and whose operations
// are NCCL calls on a CUDA stream, awaited without blocking the reactor. This file is the
// face: the options, the group's operations and `gpu::init_process_group`. How an operation
// is enqueued, awaited and failed is in detail/nccl_ops.hpp; the set-up after the rendezvous
// (device, one GPU per rank, unique id, communicator) in detail/nccl_init.hpp. Argument
// errors read as the CPU group's (collectives/checks.hpp).

#include <corocoll/collectives/checks.hpp>
#include <corocoll/collectives/reduce_op.hpp>
#include <corocoll/core/sync_wait.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/core/work.hpp>
#include <corocoll/gpu/cuda.hpp>
#include <corocoll/gpu/detail/nccl_init.hpp>
#include <corocoll/gpu/detail/nccl_ops.hpp>
#include <corocoll/gpu/nccl.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/process_group/process_group.hpp>
#include <corocoll/rendezvous/prefix_store.hpp>
#include <corocoll/rendezvous/tcp_store.hpp>
#include <corocoll/version.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace gpu {

/// How `gpu::init_process_group` sets up an NCCL group, beyond `init_options`.
struct nccl_options {
    /// This rank's CUDA device; -1: the launcher's LOCAL_RANK (else the rank) modulo the
    /// devices this process sees.
    int device = -1;
    /// The stream the group enqueues on; null: a stream of the group's own (an ordinary
    /// stream, so it waits for work on the legacy default stream).
    cudaStream_t stream = nullptr;
};

/// One operation of an NCCL group's `batch_isend_irecv`, like torch's `P2POp`.
struct nccl_p2p_op {
    enum class kind { isend, irecv };
    kind action;
    void* data;
    std::size_t count;
    ncclDataType_t type;
    int peer;

    template <device_memory R>
    static nccl_p2p_op isend(const R& buf, int peer) {
        return {kind::isend, const_cast<void*>(static_cast<const void*>(buf.data())), buf.size(),
                nccl_type_of<element_t<R>>(), peer};
    }
    template <device_memory R>
    static nccl_p2p_op irecv(R& buf, int peer) {
        return {kind::irecv, static_cast<void*>(buf.data()), buf.size(),
                nccl_type_of<element_t<R>>(), peer};
    }
};

/// A process group of backend "nccl": the CPU group's operations (send, recv, isend, irecv,
/// batch_isend_irecv, broadcast, all_reduce, reduce, all_gather(_into), gather(_into),
/// scatter(_from), reduce_scatter(_into), all_to_all(_single), barrier) on CUDA device memory
/// (`device_span`, `device_buffer`). Each is an NCCL call on `stream()`; awaiting it waits for
/// the GPU to finish it without blocking the reactor (detail/nccl_ops.hpp says how). NCCL's
/// limits stay: one rank per GPU, no tags, no receive from any source, no bitwise reduce ops.
/// Bound to the reactor of the thread that created it.
class nccl_group {
public:
    using duration = std::chrono::milliseconds;

    /// `lowest`: the lowest compute capability of the group's devices (fp8 reductions need
    /// 9.0 on every rank).
    nccl_group(io::reactor& r, int rank, int size, int device, std::string name, duration timeout,
               ncclComm_t comm, cudaStream_t stream,
               std::shared_ptr<rendezvous::prefix_store> store,
               std::shared_ptr<rendezvous::tcp_store_server> hosted,
               detail::lowest_capability lowest = {90, 0})
        : size_(size),
          lowest_(lowest),
          name_(std::move(name)),
          store_(std::move(store)),
          hosted_(std::move(hosted)),
          ops_(r, rank, device, timeout, comm, stream) {}
    nccl_group(const nccl_group&) = delete;
    nccl_group& operator=(const nccl_group&) = delete;
    /// Closes the group if `close()` was not awaited (on this thread's reactor).
    ~nccl_group() {
        if (!closing_) {
            try {
                sync_wait(close());
            } catch (...) {
            }
        }
        if (barrier_word_ != nullptr) (void)cudaFree(barrier_word_);
    }

    int rank() const noexcept { return ops_.rank(); }
    int size() const noexcept { return size_; }
    /// The CUDA device of this rank.
    int device() const noexcept { return ops_.device(); }
    const std::string& name() const noexcept { return name_; }
    duration timeout() const noexcept { return ops_.timeout(); }
    io::reactor& reactor() const noexcept { return ops_.reactor(); }
    /// The communicator (null once closed or aborted).
    ncclComm_t comm() const noexcept { return ops_.comm(); }
    /// The stream operations are enqueued on now.
    cudaStream_t stream() const noexcept { return ops_.stream(); }
    /// Enqueues later operations on `s` (work the caller put there before runs first); null
    /// goes back to the group's own stream.
    void set_stream(cudaStream_t s) noexcept { ops_.set_stream(s); }
    /// True once an operation failed and the communicator was aborted.
    bool failed() const noexcept { return !ops_.failure().empty(); }
    /// Why the group failed (the first failed operation, its rank and reason); empty if it
    /// has not.
    const std::string& failure() const noexcept { return ops_.failure(); }

    // ---- point to point ----

    /// Sends `buf` to `dst`; completes once the GPU has sent it. NCCL has no tags: `tag` must
    /// be 0. Sends and receives started in the same reactor turn (`when_all(send, recv)`,
    /// isend then irecv) are one NCCL group: nccl.h (≈ 503-505) requires that of sends and
    /// receives that must progress together, which would otherwise hang.
    template <device_memory R>
    task<> send(const R& buf, int dst, std::int64_t tag = 0) {
        check_peer("send", dst, tag);
        return detail::discard(point_to_point(nccl_p2p_op::isend(buf, dst)));
    }

    /// Receives into `buf` from `src` (a rank: NCCL cannot receive from any source); yields
    /// `src`. The message must have `buf.size()` elements. Fused with the sends and receives
    /// of the same reactor turn, as `send` says.
    template <device_memory R>
    task<int> recv(R& buf, int src, std::int64_t tag = 0) {
        check_peer("recv", src, tag);  // here, not in the coroutine: fails before the await
        return point_to_point(nccl_p2p_op::irecv(buf, src));
    }

    /// Starts a send now; `co_await` the result.
    template <device_memory R>
    work<> isend(const R& buf, int dst, std::int64_t tag = 0) {
        return start(send(buf, dst, tag));
    }
    /// Starts a receive now; the result yields the sender.
    template <device_memory R>
    work<int> irecv(R& buf, int src, std::int64_t tag = 0) {
        return start(recv(buf, src, tag));
    }

    /// Starts every operation of `ops` as one NCCL group (so that pairs of sends and receives
    /// between two ranks cannot deadlock), like torch's `batch_isend_irecv`: one `work` per
    /// operation, in order, each yielding its peer; they complete together.
    std::vector<work<int>> batch_isend_irecv(const std::vector<nccl_p2p_op>& ops) {
        for (const auto& op : ops) {
            check_peer(op.action == nccl_p2p_op::kind::isend ? "batch_isend_irecv (isend)"
                                                             : "batch_isend_irecv (irecv)",
                       op.peer, 0);
        }
        auto batch = std::make_shared<detail::nccl_batch>();
        start_batch("batch_isend_irecv", ops, batch);
        std::vector<work<int>> out;
        out.reserve(ops.size());
        for (const auto& op : ops) out.push_back(start(detail::await_batch(batch, op.peer)));
        return out;
    }

    // ---- collectives ----

    /// Blocks until every rank has called it: an all_reduce of one word on the GPU, as c10d's
    /// NCCL barrier does.
    task<> barrier() {
        if (barrier_word_ == nullptr) {
            device_guard on(device());
            check_cuda(cudaMalloc(reinterpret_cast<void**>(&barrier_word_), sizeof(int)),
                       "cudaMalloc of the barrier word");
        }
        int* w = barrier_word_;
        return ops_.run("barrier", [w](ncclComm_t c, cudaStream_t s) {
            return ncclAllReduce(w, w, 1, ncclInt32, ncclSum, c, s);
        });
    }

    /// Copies `data` of rank `src` into `data` of every rank.
    template <device_memory R>
    task<> broadcast(R& data, int src) {
        collectives::check_root(rank(), size_, "broadcast", src);
        void* p = data.data();
        std::size_t n = data.size();
        ncclDataType_t t = nccl_type_of<element_t<R>>();
        return ops_.run(
            "broadcast",
            [p, n, t, src](ncclComm_t c, cudaStream_t s) {
                return ncclBroadcast(p, p, n, t, src, c, s);
            },
            detail::nccl_call{n, t});
    }

    /// Reduces `data` over every rank with `op`, in place; every rank gets the result.
    template <device_memory R>
    task<> all_reduce(R& data, reduce_op op = reduce_op::sum) {
        ncclRedOp_t o = op_of(op, "all_reduce");
        check_fp8<element_t<R>>("all_reduce");
        void* p = data.data();
        std::size_t n = data.size();
        ncclDataType_t t = nccl_type_of<element_t<R>>();
        return ops_.run(
            "all_reduce",
            [p, n, t, o](ncclComm_t c, cudaStream_t s) {
                return ncclAllReduce(p, p, n, t, o, c, s);
            },
            detail::nccl_call{n, t, op});
    }

    /// Reduces `data` over every rank into `data` of rank `dst`; the others' are unchanged.
    template <device_memory R>
    task<> reduce(R& data, int dst, reduce_op op = reduce_op::sum) {
        ncclRedOp_t o = op_of(op, "reduce");
        check_fp8<element_t<R>>("reduce");
        collectives::check_root(rank(), size_, "reduce", dst);
        void* p = data.data();
        std::size_t n = data.size();
        ncclDataType_t t = nccl_type_of<element_t<R>>();
        return ops_.run(
            "reduce",
            [p, n, t, o, dst](ncclComm_t c, cudaStream_t s) {
                return ncclReduce(p, p, n, t, o, dst, c, s);
            },
            detail::nccl_call{n, t, op});
    }

    /// Gathers every rank's `in` into `out` (size() blocks, in rank order) on every rank.
    template <device_memory O, device_memory I>
    task<> all_gather_into(O& out, const I& in) {
        same_type<O, I>();
        collectives::check_size(rank(), "all_gather", "output", out.size(), in.size() * size_);
        const void* src = in.data();
        void* dst = out.data();
        std::size_t n = in.size();
        ncclDataType_t t = nccl_type_of<element_t<I>>();
        return ops_.run(
            "all_gather",
            [src, dst, n, t](ncclComm_t c, cudaStream_t s) {
                return ncclAllGather(src, dst, n, t, c, s);
            },
            detail::nccl_call{n, t});
    }

    /// Every rank's `in` into `outs[rank]` on every rank (`outs` has size() buffers of
    /// in.size() elements).
    template <device_memory R>
    task<> all_gather(std::vector<R>& outs, const R& in) {
        check_list("all_gather", "output list", "output list entry", outs, in.size());
        std::vector<void*> dst;
        for (auto& o : outs) dst.push_back(o.data());
        const void* src = in.data();
        std::size_t n = in.size();
        ncclDataType_t t = nccl_type_of<element_t<R>>();
        return ops_.run(
            "all_gather",
            [dst, src, n, t](ncclComm_t c, cudaStream_t s) {
                return detail::grouped([&] {
                    for (int p = 0; p < static_cast<int>(dst.size()); ++p) {
                        ncclResult_t rc =
                            ncclBroadcast(src, dst[static_cast<std::size_t>(p)], n, t, p, c, s);
                        if (rc != ncclSuccess) return rc;
                    }
                    return ncclSuccess;
                });
            },
            detail::nccl_call{n, t});
    }

    /// Gathers every rank's `in` into `out` of rank `dst` (size() blocks in rank order; `out`
    /// is only used there).
    template <device_memory I, device_memory O>
    task<> gather_into(const I& in, O& out, int dst) {
        same_type<O, I>();
        collectives::check_root(rank(), size_, "gather", dst);
        if (rank() == dst) {
            collectives::check_size(rank(), "gather", "output", out.size(), in.size() * size_);
        }
        const void* src = in.data();
        void* to = out.data();
        std::size_t n = in.size();
        ncclDataType_t t = nccl_type_of<element_t<I>>();
        return ops_.run(
            "gather",
            [src, to, n, t, dst](ncclComm_t c, cudaStream_t s) {
                return ncclGather(src, to, n, t, dst, c, s);
            },
            detail::nccl_call{n, t});
    }

    /// Gathers every rank's `in` into `gather_list[rank]` of rank `dst` (the list is only
    /// used there).
    template <device_memory R>
    task<> gather(const R& in, std::vector<R>& gather_list, int dst = 0) {
        collectives::check_root(rank(), size_, "gather", dst);
        if (rank() == dst) {
            check_list("gather", "gather_list", "gather_list entry", gather_list, in.size());
        }
        std::vector<void*> to;
        if (rank() == dst) {
            for (auto& o : gather_list) to.push_back(o.data());
        }
        const void* src = in.data();
        std::size_t n = in.size();
        ncclDataType_t t = nccl_type_of<element_t<R>>();
        return ops_.run(
            "gather",
            [to, src, n, t, dst](ncclComm_t c, cudaStream_t s) {
                return detail::grouped([&] {
                    ncclResult_t rc = ncclSend(src, n, t, dst, c, s);
                    for (int p = 0; rc == ncclSuccess && p < static_cast<int>(to.size()); ++p) {
                        rc = ncclRecv(to[static_cast<std::size_t>(p)], n, t, p, c, s);
                    }
                    return rc;
                });
            },
            detail::nccl_call{n, t});
    }

    /// Block `rank` of `in` on rank `src` (size() blocks of out.size()) into `out` of every
    /// rank; `in` is only used on `src`.
    template <device_memory O, device_memory I>
    task<> scatter_from(O& out, const I& in, int src) {
        same_type<O, I>();
        collectives::check_root(rank(), size_, "scatter", src);
        if (rank() == src) {
            collectives::check_size(rank(), "scatter", "input", in.size(), out.size() * size_);
        }
        const void* from = in.data();
        void* to = out.data();
        std::size_t n = out.size();
        ncclDataType_t t = nccl_type_of<element_t<O>>();
        return ops_.run(
            "scatter",
            [from, to, n, t, src](ncclComm_t c, cudaStream_t s) {
                return ncclScatter(from, to, n, t, src, c, s);
            },
            detail::nccl_call{n, t});
    }

    /// `scatter_list[rank]` of rank `src` into `out` of every rank.
    template <device_memory R>
    task<> scatter(R& out, const std::vector<R>& scatter_list, int src = 0) {
        collectives::check_root(rank(), size_, "scatter", src);
        if (rank() == src) {
            check_list("scatter", "scatter_list", "scatter_list entry", scatter_list, out.size());
        }
        std::vector<const void*> from;
        if (rank() == src) {
            for (const auto& i : scatter_list) from.push_back(i.data());
        }
        void* to = out.data();
        std::size_t n = out.size();
        ncclDataType_t t = nccl_type_of<element_t<R>>();
        return ops_.run(
            "scatter",
            [from, to, n, t, src](ncclComm_t c, cudaStream_t s) {
                return detail::grouped([&] {
                    ncclResult_t rc = ncclSuccess;
                    for (int p = 0; rc == ncclSuccess && p < static_cast<int>(from.size()); ++p) {
                        rc = ncclSend(from[static_cast<std::size_t>(p)], n, t, p, c, s);
                    }
                    return rc == ncclSuccess ? ncclRecv(to, n, t, src, c, s) : rc;
                });
            },
            detail::nccl_call{n, t});
    }

    /// Reduces `in` (size() blocks of out.size()) over every rank; block `rank` of the result
    /// goes to `out` (torch's reduce_scatter_tensor).
    template <device_memory O, device_memory I>
    task<> reduce_scatter_into(O& out, const I& in, reduce_op op = reduce_op::sum) {
        same_type<O, I>();
        ncclRedOp_t o = op_of(op, "reduce_scatter");
        check_fp8<element_t<I>>("reduce_scatter");
        collectives::check_size(rank(), "reduce_scatter", "input", in.size(), out.size() * size_);
        const void* src = in.data();
        void* dst = out.data();
        std::size_t n = out.size();
        ncclDataType_t t = nccl_type_of<element_t<O>>();
        return ops_.run(
            "reduce_scatter",
            [src, dst, n, t, o](ncclComm_t c, cudaStream_t s) {
                return ncclReduceScatter(src, dst, n, t, o, c, s);
            },
            detail::nccl_call{n, t, op});
    }

    /// Reduces `in_list[p]` over every rank into `out` of rank p.
    template <device_memory R>
    task<> reduce_scatter(R& out, const std::vector<R>& in_list, reduce_op op = reduce_op::sum) {
        ncclRedOp_t o = op_of(op, "reduce_scatter");
        check_fp8<element_t<R>>("reduce_scatter");
        check_list("reduce_scatter", "input list", "input list entry", in_list, out.size());
        std::vector<const void*> from;
        for (const auto& i : in_list) from.push_back(i.data());
        void* to = out.data();
        std::size_t n = out.size();
        ncclDataType_t t = nccl_type_of<element_t<R>>();
        return ops_.run(
            "reduce_scatter",
            [from, to, n, t, o](ncclComm_t c, cudaStream_t s) {
                return detail::grouped([&] {
                    for (int p = 0; p < static_cast<int>(from.size()); ++p) {
                        ncclResult_t rc =
                            ncclReduce(from[static_cast<std::size_t>(p)], to, n, t, o, p, c, s);
                        if (rc != ncclSuccess) return rc;
                    }
                    return ncclSuccess;
                });
            },
            detail::nccl_call{n, t, op});
    }

    /// Block p of `in` goes to rank p, which puts it in block `rank` of its `out` (torch's
    /// all_to_all_single). Without split sizes the blocks are equal; with them,
    /// `in_splits[p]` / `out_splits[p]` elements go to / come from rank p.
    template <device_memory O, device_memory I>
    task<> all_to_all_single(O& out, const I& in, std::vector<std::size_t> out_splits = {},
                             std::vector<std::size_t> in_splits = {}) {
        same_type<O, I>();
        using T = element_t<I>;
        bool equal = out_splits.empty() && in_splits.empty();
        // Byte offsets; all_to_all_offsets fills empty splits with equal blocks.
        auto out_off = collectives::all_to_all_offsets(rank(), size_, "output", out_splits,
                                                       out.size(), sizeof(T));
        auto in_off = collectives::all_to_all_offsets(rank(), size_, "input", in_splits, in.size(),
                                                      sizeof(T));
        ncclDataType_t t = nccl_type_of<T>();
        if (equal) {
            collectives::check_size(rank(), "all_to_all", "output", out.size(), in.size());
            const void* src = in.data();
            void* dst = out.data();
            std::size_t block = in.size() / static_cast<std::size_t>(size_);
            return ops_.run("all_to_all", [src, dst, block, t](ncclComm_t c, cudaStream_t s) {
                return ncclAlltoAll(src, dst, block, t, c, s);
            });
        }
        const auto* src = static_cast<const std::byte*>(static_cast<const void*>(in.data()));
        auto* dst = static_cast<std::byte*>(static_cast<void*>(out.data()));
        return ops_.run("all_to_all", [=](ncclComm_t c, cudaStream_t s) {
            return detail::grouped([&] {
                for (std::size_t p = 0; p + 1 < in_off.size(); ++p) {
                    int peer = static_cast<int>(p);
                    ncclResult_t rc = ncclSend(
                        src + in_off[p], (in_off[p + 1] - in_off[p]) / sizeof(T), t, peer, c, s);
                    if (rc == ncclSuccess) {
                        rc = ncclRecv(dst + out_off[p], (out_off[p + 1] - out_off[p]) / sizeof(T),
                                      t, peer, c, s);
                    }
                    if (rc != ncclSuccess) return rc;
                }
                return ncclSuccess;
            });
        });
    }

    /// `ins[p]` goes to rank p, which receives it into `outs[rank]`.
    template <device_memory R>
    task<> all_to_all(std::vector<R>& outs, const std::vector<R>& ins) {
        auto n = static_cast<std::size_t>(size_);
        collectives::check_size(rank(), "all_to_all", "input list", ins.size(), n);
        collectives::check_size(rank(), "all_to_all", "output list", outs.size(), n);
        std::vector<std::pair<const void*, std::size_t>> from;
        std::vector<std::pair<void*, std::size_t>> to;
        for (const auto& i : ins) from.emplace_back(i.data(), i.size());
        for (auto& o : outs) to.emplace_back(o.data(), o.size());
        ncclDataType_t t = nccl_type_of<element_t<R>>();
        return ops_.run("all_to_all", [from, to, t](ncclComm_t c, cudaStream_t s) {
            return detail::grouped([&] {
                for (int p = 0; p < static_cast<int>(from.size()); ++p) {
                    auto q = static_cast<std::size_t>(p);
                    ncclResult_t rc = ncclSend(from[q].first, from[q].second, t, p, c, s);
                    if (rc == ncclSuccess) rc = ncclRecv(to[q].first, to[q].second, t, p, c, s);
                    if (rc != ncclSuccess) return rc;
                }
                return ncclSuccess;
            });
        });
    }

    /// Aborts the communicator (ncclCommAbort): every pending and later operation fails with
    /// `why`. Idempotent; the first reason stays.
    void abort(const std::string& why) noexcept { ops_.abort(why); }

    /// Finishes the communicator (ncclCommFinalize, polled, then ncclCommDestroy; an aborted
    /// one is already gone) after the operations queued before, and leaves the rendezvous: the
    /// rank that serves the store keeps it up until every rank has left. Idempotent.
    task<> close() {
        if (closing_) co_return;
        closing_ = true;
        std::exception_ptr error;
        try {
            co_await ops_.close();
        } catch (...) {
            error = std::current_exception();
        }
        if (store_) {
            try {
                if (co_await store_->add("close/left", 1) == size_) {
                    co_await store_->set("close/all", "1");
                }
                if (hosted_) {
                    std::vector<std::string> all{"close/all"};
                    co_await store_->wait(std::move(all), timeout());
                }
            } catch (...) {
                if (!error) error = std::current_exception();
            }
        }
        if (error) std::rethrow_exception(error);
    }

private:
    // The sends and receives started in one reactor turn, enqueued together when the turn's
    // work is done (a work item posted at the first).
    struct p2p_turn : corocoll::detail::work_item {
        nccl_group* group = nullptr;
        std::vector<nccl_p2p_op> ops;
        std::shared_ptr<detail::nccl_batch> batch = std::make_shared<detail::nccl_batch>();
    };

    task<int> point_to_point(nccl_p2p_op op) {
        if (!turn_) {
            turn_ = std::make_unique<p2p_turn>();
            turn_->group = this;
            turn_->run_ = &flush_turn;
            reactor().post(*turn_);
        }
        auto batch = turn_->batch;
        turn_->ops.push_back(op);
        co_return co_await detail::await_batch(std::move(batch), op.peer);
    }

    static void flush_turn(corocoll::detail::work_item* item) noexcept {
        auto* self = static_cast<p2p_turn*>(item)->group;
        std::unique_ptr<p2p_turn> turn = std::move(self->turn_);
        bool sends = false, recvs = false;
        for (const auto& op : turn->ops) {
            (op.action == nccl_p2p_op::kind::isend ? sends : recvs) = true;
        }
        self->start_batch(sends && recvs ? "send/recv"
                          : sends        ? "send"
                                         : "recv",
                          turn->ops, turn->batch);
    }

    // `ops` as one NCCL group; `batch` completes when the GPU has run them.
    void start_batch(const char* label, const std::vector<nccl_p2p_op>& ops,
                     const std::shared_ptr<detail::nccl_batch>& batch) noexcept {
        try {
            batch->run = start(detail::finish_batch(
                ops_.run(label,
                         [ops](ncclComm_t c, cudaStream_t s) {
                             return detail::grouped([&] {
                                 for (const auto& op : ops) {
                                     ncclResult_t rc =
                                         op.action == nccl_p2p_op::kind::isend
                                             ? ncclSend(op.data, op.count, op.type, op.peer, c, s)
                                             : ncclRecv(op.data, op.count, op.type, op.peer, c, s);
                                     if (rc != ncclSuccess) return rc;
                                 }
                                 return ncclSuccess;
                             });
                         }),
                batch));
        } catch (...) {
            detail::fail_batch(*batch, std::current_exception());
        }
    }

    // NCCL reduces fp8 only where every rank's device has compute capability 9.0 or more
    // (enqueue.cc ≈ 2557 at v2.28.9-1 checks comm->minCompCap): refused here, before the
    // call, so that the group stays usable.
    template <class T>
    void check_fp8(const char* what) const {
        if constexpr (std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>) {
            if (lowest_.value < 90) {
                throw std::invalid_argument(
                    ops_.prefix(what) +
                    "NCCL reduces fp8 from compute capability 9.0 (sm90) and rank " +
                    std::to_string(lowest_.rank) + " has " + std::to_string(lowest_.value / 10) +
                    "." + std::to_string(lowest_.value % 10) + " (fp8 moves work everywhere)");
            }
        }
    }

    // NCCL's op; the error text (which allocates) only for the ops NCCL lacks. On a world of
    // one, avg is sum (both leave the value as it is): NCCL 2.28 refuses avg of fp8 there
    // (ncclLaunchOneRank's host-side switch has no fp8 case), which a GPU showed.
    ncclRedOp_t op_of(reduce_op op, const char* what) const {
        if (op == reduce_op::avg && size_ == 1) return ncclSum;
        return nccl_has(op) ? nccl_op_of(op, std::string()) : nccl_op_of(op, ops_.prefix(what));
    }

    template <class O, class I>
    static void same_type() {
        static_assert(std::is_same_v<element_t<O>, element_t<I>>,
                      "corocoll: input and output must hold the same element type");
    }

    // NCCL's limits on a peer: a rank (no receive from any source), and no tags.
    void check_peer(const char* what, int peer, std::int64_t tag) const {
        if (peer < 0 || peer >= size_) {
            throw std::invalid_argument(
                ops_.prefix(what) + "peer " + std::to_string(peer) + " is outside [0, " +
                std::to_string(size_) + ")" +
                (peer < 0 ? " (NCCL cannot receive from any source: name the rank)" : ""));
        }
        if (tag != 0) {
            throw std::invalid_argument(ops_.prefix(what) + "tag " + std::to_string(tag) +
                                        ": NCCL has no tags (messages between two ranks match "
                                        "in the order they are posted); pass 0");
        }
    }

    // A list of size() buffers of `each` elements (`name`, and `entry` for one of them).
    template <class R>
    void check_list(const char* what, const char* name, const char* entry,
                    const std::vector<R>& list, std::size_t each) const {
        collectives::check_size(rank(), what, name, list.size(), static_cast<std::size_t>(size_));
        for (const auto& b : list) collectives::check_size(rank(), what, entry, b.size(), each);
    }

    int size_;
    detail::lowest_capability lowest_;
    std::string name_;
    std::shared_ptr<rendezvous::prefix_store> store_;
    std::shared_ptr<rendezvous::tcp_store_server> hosted_;
    int* barrier_word_ = nullptr;
    bool closing_ = false;
    std::unique_ptr<p2p_turn> turn_;
    // Last: its events and own stream go before the store, as they did when they were members
    // of this class.
    detail::nccl_ops ops_;
};

/// Sets up a group of backend "nccl" (`o.backend` must say so), like torch's
/// `init_process_group("nccl")`: the rendezvous of `corocoll::init_process_group` (rank,
/// world size, store; bounded by `o.timeout`), then one CUDA device per rank (`g.device`,
/// else LOCAL_RANK, else rank modulo the devices seen), checked through the store so that two
/// ranks on one GPU fail at once with both named; rank 0 publishes `ncclGetUniqueId` in the
/// store, the others fetch it, and every rank creates a non-blocking communicator
/// (`config.blocking = 0`) whose set-up the reactor polls. On return the rank's device is the
/// thread's current one. The steps: detail/nccl_init.hpp.
inline task<std::shared_ptr<nccl_group>> init_process_group(io::reactor& r, init_options o,
                                                            nccl_options g = {}) {
    using corocoll::detail::init_error;
    if (o.backend != "nccl") {
        throw std::invalid_argument(init_error(
            "corocoll::gpu::init_process_group sets up backend \"nccl\", not '" + o.backend +
            "' (CPU groups: corocoll::init_process_group; CUDA buffers over them: "
            "gpu::staged)"));
    }
    int count = device_count();
    if (count == 0) {
        throw std::runtime_error(
            init_error("backend \"nccl\" needs a CUDA device and this process sees none: " +
                       no_device_reason() +
                       " (backend \"tcp\" with gpu::staged moves CUDA buffers without NCCL)"));
    }
    detail::nccl_setup s = co_await detail::nccl_setup_for(r, o, g.device, count);
    std::shared_ptr<nccl_group> group;
    try {
        group = std::make_shared<nccl_group>(
            r, s.rank, s.size, s.device, o.group_name,
            std::chrono::duration_cast<nccl_group::duration>(o.timeout), s.comm, g.stream,
            std::move(s.store), std::move(s.hosted), s.capability);
    } catch (...) {
        (void)ncclCommAbort(s.comm);  // the group never owned it
        throw;
    }
    // The rank's device is current on return, for the buffers the caller makes next: set
    // here, after the last suspension, so that no other coroutine of the thread can undo it.
    check_cuda(cudaSetDevice(s.device), "init_process_group: cudaSetDevice");
    co_return group;
}

}  // namespace gpu

COROCOLL_END_NAMESPACE
