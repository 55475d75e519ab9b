#pragma once

#include <corocoll/collectives/all_gather_bruck.hpp>
#include <corocoll/collectives/all_gather_ring.hpp>
#include <corocoll/collectives/all_reduce_recursive_doubling.hpp>
#include <corocoll/collectives/all_reduce_ring.hpp>
#include <corocoll/collectives/all_to_all_pairwise.hpp>
#include <corocoll/collectives/barrier_dissemination.hpp>
#include <corocoll/collectives/broadcast_binomial.hpp>
#include <corocoll/collectives/broadcast_chain.hpp>
#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/dtype.hpp>
#include <corocoll/collectives/gather_binomial.hpp>
#include <corocoll/collectives/linear.hpp>
#include <corocoll/collectives/object.hpp>
#include <corocoll/collectives/reduce_binomial.hpp>
#include <corocoll/collectives/reduce_op.hpp>
#include <corocoll/collectives/reduce_scatter_ring.hpp>
#include <corocoll/collectives/reduction.hpp>
#include <corocoll/collectives/scatter_binomial.hpp>
#include <corocoll/collectives/select.hpp>
#include <corocoll/core/async_mutex.hpp>
#include <corocoll/core/error.hpp>
#include <corocoll/core/log.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/core/when_all.hpp>
#include <corocoll/core/work.hpp>
#include <corocoll/io/endpoint.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/rendezvous/file_store.hpp>
#include <corocoll/rendezvous/launch_env.hpp>
#include <corocoll/rendezvous/prefix_store.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/rendezvous/tcp_store.hpp>
#include <corocoll/transport/engine.hpp>
#include <corocoll/transport/mesh.hpp>
#include <corocoll/version.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

/// `recv`/`irecv` from whichever rank sends first.
inline constexpr int any_source = transport::any_source;

/// A contiguous range of trivially copyable elements: what corocoll sends and receives
/// (`std::vector<T>`, `std::array<T, N>`, `std::span<T>`, C arrays).
template <class R>
concept buffer = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
    std::is_trivially_copyable_v<std::ranges::range_value_t<R>>;

namespace detail {

template <buffer R>
std::span<const std::byte> bytes_of(const R& r) {
    return std::as_bytes(std::span(std::ranges::data(r), std::ranges::size(r)));
}

template <buffer R>
std::span<std::byte> writable_bytes_of(R& r) {
    static_assert(!std::is_const_v<std::remove_reference_t<decltype(*std::ranges::data(r))>>,
                  "corocoll: a receive buffer must be writable");
    return std::as_writable_bytes(std::span(std::ranges::data(r), std::ranges::size(r)));
}

}  // namespace detail

/// One operation of `batch_isend_irecv`, like torch's `P2POp`.
struct p2p_op {
    enum class kind { isend, irecv };
    kind op;
    std::span<std::byte> data;  // only read for isend
    int peer;
    std::int64_t tag = 0;

    template <buffer R>
    static p2p_op isend(const R& buf, int peer, std::int64_t tag = 0) {
        auto b = detail::bytes_of(buf);
        return {kind::isend, {const_cast<std::byte*>(b.data()), b.size()}, peer, tag};
    }
    template <buffer R>
    static p2p_op irecv(R& buf, int peer, std::int64_t tag = 0) {
        return {kind::irecv, detail::writable_bytes_of(buf), peer, tag};
    }
};

/// How `init_process_group` sets a group up; every field has torch's default.
struct init_options {
    /// "tcp" (CPU tensors over TCP; "gloo" and "cpu" are accepted as names for it).
    std::string backend = "tcp";
    /// "env://" (launcher variables, MASTER_ADDR/MASTER_PORT), "tcp://host:port" or
    /// "file:///path". Ignored when `store` is given.
    std::string init_method = "env://";
    /// -1: from the launcher's environment.
    int world_size = -1;
    int rank = -1;
    /// Deadline of set-up and default deadline of every operation (c10d's 30 minutes).
    std::chrono::milliseconds timeout = std::chrono::minutes(30);
    /// A store to rendezvous through instead of `init_method` (rank and world_size required).
    std::shared_ptr<rendezvous::store> store;
    /// Groups with different names keep apart in one store.
    std::string group_name = "default";
    transport::engine_options limits;
};

/// A set of ranks that exchange messages, like torch's ProcessGroup: the public face of
/// corocoll. Bound to the reactor of the thread that created it; its operations are
/// coroutines to await there (`isend`/`irecv` start at once and return a `work`). Every
/// operation has a deadline (the group's timeout unless given). A failed peer makes every
/// pending and later operation fail with an error naming it; the group must then be closed.
class process_group {
public:
    using duration = std::chrono::milliseconds;

    process_group(io::reactor& r, int rank, int size, std::string name, duration timeout,
                  std::shared_ptr<rendezvous::store> store, std::vector<io::socket> peers,
                  transport::engine_options limits,
                  std::shared_ptr<rendezvous::tcp_store_server> hosted, io::endpoint listen_on = {})
        : reactor_(r),
          name_(std::move(name)),
          timeout_(timeout),
          store_(std::move(store)),
          hosted_(std::move(hosted)),
          listen_on_(listen_on),
          limits_(limits),
          engine_(r, rank, size, std::move(peers), limits) {
        engine_.set_describer(&collectives::describe);
        unlock_item_.lock = &collective_lock_;
        unlock_item_.run_ = [](corocoll::detail::work_item* item) noexcept {
            static_cast<unlock_item*>(item)->lock->unlock();
        };
    }
    process_group(const process_group&) = delete;
    process_group& operator=(const process_group&) = delete;
    /// Closes the group if `close()` was not awaited (on this thread's reactor).
    ~process_group() {
        if (!closed_) {
            try {
                sync_wait(close());
            } catch (...) {
            }
        }
    }

    int rank() const noexcept { return engine_.rank(); }
    int size() const noexcept { return engine_.size(); }
    const std::string& name() const noexcept { return name_; }
    duration timeout() const noexcept { return timeout_; }
    io::reactor& reactor() const noexcept { return reactor_; }
    /// The group's namespace in the rendezvous store.
    rendezvous::store& store() const noexcept { return *store_; }
    /// The same, shared: another group (the GPU layer's NCCL group) may rendezvous through it.
    std::shared_ptr<rendezvous::store> shared_store() const noexcept { return store_; }

    /// Sends `buf` to `dst` with `tag`; completes once the data is handed to the kernel (the
    /// buffer may then be reused).
    template <buffer R>
    task<> send(const R& buf, int dst, std::int64_t tag = 0) {
        return engine_.send(detail::bytes_of(buf), dst, tag, deadline());
    }

    /// Receives into `buf` from `src` (or `any_source`) with `tag`; yields the sender's rank,
    /// as torch's `recv` returns it. The message may be shorter than `buf`, never longer.
    template <buffer R>
    task<int> recv(R& buf, int src = any_source, std::int64_t tag = 0) {
        return recv_bytes(detail::writable_bytes_of(buf), src, tag);
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
    std::vector<work<int>> batch_isend_irecv(const std::vector<p2p_op>& ops) {
        std::vector<work<int>> out;
        out.reserve(ops.size());
        for (const auto& op : ops) {
            if (op.op == p2p_op::kind::isend) {
                out.push_back(start(send_then_peer(op.data, op.peer, op.tag)));
            } else {
                out.push_back(start(recv_bytes(op.data, op.peer, op.tag)));
            }
        }
        return out;
    }

    // ---- subgroups ----

    /// Like torch's new_group: every rank of this group calls it, in the same order, with the
    /// same `ranks`; the members get a new group (their ranks in it follow the sorted `ranks`),
    /// the others get null. It has its own connections, sequence numbers and lock, so its
    /// collectives run concurrently with this group's.
    task<std::shared_ptr<process_group>> new_group(std::vector<int> ranks);

    /// Splits the group by colour, like MPI_Comm_split: every rank calls it; the ranks that
    /// pass the same colour form a group, ordered by (key, rank). A negative colour joins no
    /// group and gets null.
    task<std::shared_ptr<process_group>> split(int colour, int key = 0);

    // ---- collectives (see include/corocoll/collectives/ for the algorithms) ----

    /// Forces `a` for collective `k` on this group (tests, benchmarks); `automatic` undoes it.
    /// Every rank must force the same, or their calls do not match.
    void set_algorithm(collectives::collective_kind k, collectives::algorithm a) {
        algorithms_.force(k, a);
    }
    /// The size at which large transfers are cut into pieces (default 1 MiB).
    void set_chunk_bytes(std::size_t bytes) noexcept {
        chunk_bytes_ = std::max<std::size_t>(bytes, 1);
    }
    std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }

    /// Blocks until every rank of the group has called it (dissemination).
    task<> barrier() {
        return collective(
            collectives::collective_kind::barrier, {}, 0, 0, 0,
            [](collectives::context& c) { return collectives::barrier_dissemination(c); });
    }

    /// Copies `data` of rank `src` into `data` of every rank.
    template <buffer R>
    task<> broadcast(R& data, int src) {
        auto bytes = detail::writable_bytes_of(data);
        check_root("broadcast", src);
        auto kind = collectives::collective_kind::broadcast;
        auto algo = collectives::select(kind, bytes.size(), size(), algorithms_);
        return collective(
            kind, element_of<R>(), std::ranges::size(data), 0, src,
            [bytes, src, algo](collectives::context& c) -> task<> {
                if (algo == collectives::algorithm::chain) {
                    return collectives::broadcast_chain(c, bytes, src);
                }
                return collectives::broadcast_binomial(c, bytes, src);
            },
            algo);
    }

    /// Reduces `data` over every rank with `op`, in place; every rank gets the result.
    template <buffer R>
    task<> all_reduce(R& data, reduce_op op = reduce_op::sum) {
        auto bytes = detail::writable_bytes_of(data);
        collectives::reduction red{op, element_of<R>()};
        check_op("all_reduce", red);
        auto kind = collectives::collective_kind::all_reduce;
        auto algo = collectives::select(kind, bytes.size(), size(), algorithms_);
        return collective(
            kind, red.type, std::ranges::size(data), static_cast<std::uint8_t>(op), 0,
            [bytes, red, algo](collectives::context& c) -> task<> {
                if (algo == collectives::algorithm::ring) {
                    return collectives::all_reduce_ring(c, bytes, red);
                }
                return collectives::all_reduce_recursive_doubling(c, bytes, red);
            },
            algo);
    }

    /// Reduces `data` over every rank into `data` of rank `dst`; the other ranks' buffers are
    /// left as they were.
    template <buffer R>
    task<> reduce(R& data, int dst, reduce_op op = reduce_op::sum) {
        auto bytes = detail::writable_bytes_of(data);
        collectives::reduction red{op, element_of<R>()};
        check_op("reduce", red);
        check_root("reduce", dst);
        return collective(
            collectives::collective_kind::reduce, red.type, std::ranges::size(data),
            static_cast<std::uint8_t>(op), dst,
            [bytes, red, dst](collectives::context& c) {
                return collectives::reduce_binomial(c, bytes, red, dst);
            },
            collectives::algorithm::binomial);
    }

    /// Gathers every rank's `in` into `out` (size() blocks of in.size() elements, in rank
    /// order) on every rank: torch's all_gather_into_tensor.
    template <buffer O, buffer I>
    task<> all_gather_into(O& out, const I& in) {
        static_assert(std::is_same_v<std::ranges::range_value_t<O>, std::ranges::range_value_t<I>>,
                      "corocoll: all_gather: input and output must hold the same type");
        auto out_bytes = detail::writable_bytes_of(out);
        auto in_bytes = detail::bytes_of(in);
        check_size("all_gather", "output", std::ranges::size(out), std::ranges::size(in) * size());
        auto kind = collectives::collective_kind::all_gather;
        auto algo = collectives::select(kind, out_bytes.size(), size(), algorithms_);
        std::size_t elem = sizeof(std::ranges::range_value_t<I>);
        return collective(
            kind, element_of<I>(), std::ranges::size(in), 0, 0,
            [out_bytes, in_bytes, algo, elem](collectives::context& c) -> task<> {
                if (algo == collectives::algorithm::bruck) {
                    return collectives::all_gather_bruck(c, out_bytes, in_bytes);
                }
                return ring_all_gather(c, out_bytes, in_bytes, elem);
            },
            algo);
    }

    /// Gathers every rank's `in` into `outs[r]` on every rank (torch's all_gather with a list).
    template <buffer R>
    task<> all_gather(std::vector<R>& outs, const R& in) {
        check_size("all_gather", "output list", outs.size(), static_cast<std::size_t>(size()));
        std::vector<std::ranges::range_value_t<R>> flat(std::ranges::size(in) * size());
        co_await all_gather_into(flat, in);
        unflatten(flat, outs, std::ranges::size(in));
    }

    /// Gathers every rank's `in` into `out` (size() blocks, rank order) on rank `dst`; `out`
    /// is only used there.
    template <buffer O, buffer I>
    task<> gather_into(const I& in, O& out, int dst) {
        auto in_bytes = detail::bytes_of(in);
        auto out_bytes = detail::writable_bytes_of(out);
        check_root("gather", dst);
        if (rank() == dst) {
            check_size("gather", "output", std::ranges::size(out), std::ranges::size(in) * size());
        }
        auto kind = collectives::collective_kind::gather;
        auto algo = collectives::select(kind, in_bytes.size(), size(), algorithms_);
        return collective(
            kind, element_of<I>(), std::ranges::size(in), 0, dst,
            [in_bytes, out_bytes, dst, algo](collectives::context& c) -> task<> {
                if (algo == collectives::algorithm::linear) {
                    return collectives::gather_linear(c, in_bytes, out_bytes, dst);
                }
                return collectives::gather_binomial(c, in_bytes, out_bytes, dst);
            },
            algo);
    }

    /// torch's gather: on `dst`, `gather_list[r]` receives rank r's `in`; elsewhere the list is
    /// not used (it may be empty).
    template <buffer R>
    task<> gather(const R& in, std::vector<R>& gather_list, int dst = 0) {
        std::vector<std::ranges::range_value_t<R>> flat(
            rank() == dst ? std::ranges::size(in) * size() : 0);
        if (rank() == dst)
            check_size("gather", "gather_list", gather_list.size(),
                       static_cast<std::size_t>(size()));
        co_await gather_into(in, flat, dst);
        if (rank() == dst) unflatten(flat, gather_list, std::ranges::size(in));
    }

    /// Scatters `in` of rank `src` (size() blocks of out.size() elements) so that rank r gets
    /// block r in `out`; `in` is only used on `src`.
    template <buffer O, buffer I>
    task<> scatter_from(O& out, const I& in, int src) {
        auto in_bytes = detail::bytes_of(in);
        auto out_bytes = detail::writable_bytes_of(out);
        check_root("scatter", src);
        if (rank() == src) {
            check_size("scatter", "input", std::ranges::size(in), std::ranges::size(out) * size());
        }
        auto kind = collectives::collective_kind::scatter;
        auto algo = collectives::select(kind, out_bytes.size(), size(), algorithms_);
        return collective(
            kind, element_of<O>(), std::ranges::size(out), 0, src,
            [in_bytes, out_bytes, src, algo](collectives::context& c) -> task<> {
                if (algo == collectives::algorithm::linear) {
                    return collectives::scatter_linear(c, in_bytes, out_bytes, src);
                }
                return collectives::scatter_binomial(c, in_bytes, out_bytes, src);
            },
            algo);
    }

    /// torch's scatter: rank r gets `scatter_list[r]` of rank `src` in `out`.
    template <buffer R>
    task<> scatter(R& out, const std::vector<R>& scatter_list, int src = 0) {
        std::vector<std::ranges::range_value_t<R>> flat;
        if (rank() == src) {
            check_size("scatter", "scatter_list", scatter_list.size(),
                       static_cast<std::size_t>(size()));
            for (const auto& b : scatter_list) {
                check_size("scatter", "scatter_list entry", std::ranges::size(b),
                           std::ranges::size(out));
                flat.insert(flat.end(), std::ranges::begin(b), std::ranges::end(b));
            }
        }
        co_await scatter_from(out, flat, src);
    }

    /// Reduces `in` (size() blocks of out.size() elements) over every rank with `op`; rank r
    /// gets the reduction of block r in `out` (torch's reduce_scatter_tensor). `in` is read only.
    template <buffer O, buffer I>
    task<> reduce_scatter_into(O& out, const I& in, reduce_op op = reduce_op::sum) {
        static_assert(std::is_same_v<std::ranges::range_value_t<O>, std::ranges::range_value_t<I>>,
                      "corocoll: reduce_scatter: input and output must hold the same type");
        collectives::reduction red{op, element_of<O>()};
        check_op("reduce_scatter", red);
        check_size("reduce_scatter", "input", std::ranges::size(in),
                   std::ranges::size(out) * size());
        auto out_bytes = detail::writable_bytes_of(out);
        auto in_bytes = detail::bytes_of(in);
        int n = size(), r = rank();
        return collective(
            collectives::collective_kind::reduce_scatter, red.type, std::ranges::size(out),
            static_cast<std::uint8_t>(op), 0,
            [out_bytes, in_bytes, red, n, r](collectives::context& c) -> task<> {
                // Equal blocks; work on a copy so the input stays as it was.
                std::span<std::byte> work =
                    c.scratch(collectives::context::group_slot, in_bytes.size());
                if (!in_bytes.empty()) std::memcpy(work.data(), in_bytes.data(), in_bytes.size());
                co_await collectives::reduce_scatter_ring(c, work, red);
                std::size_t count = work.size() / red.elem();
                auto [first, last] = collectives::block_range(count, static_cast<std::size_t>(n),
                                                              static_cast<std::size_t>(r));
                red.finish(work.data() + first * red.elem(), last - first, n);
                if (!out_bytes.empty()) {
                    std::memcpy(out_bytes.data(), work.data() + first * red.elem(),
                                out_bytes.size());
                }
            },
            collectives::algorithm::ring);
    }

    /// torch's reduce_scatter with a list: rank r gets the reduction of every rank's
    /// `in_list[r]` in `out`.
    template <buffer R>
    task<> reduce_scatter(R& out, const std::vector<R>& in_list, reduce_op op = reduce_op::sum) {
        check_size("reduce_scatter", "input list", in_list.size(),
                   static_cast<std::size_t>(size()));
        std::vector<std::ranges::range_value_t<R>> flat;
        for (const auto& b : in_list) {
            check_size("reduce_scatter", "input list entry", std::ranges::size(b),
                       std::ranges::size(out));
            flat.insert(flat.end(), std::ranges::begin(b), std::ranges::end(b));
        }
        co_await reduce_scatter_into(out, flat, op);
    }

    /// Every rank sends block p of `in` to rank p and receives rank p's block into block p of
    /// `out` (torch's all_to_all_single). Without split sizes the blocks are equal; with them,
    /// `in_splits[p]` / `out_splits[p]` elements go to / come from rank p.
    template <buffer O, buffer I>
    task<> all_to_all_single(O& out, const I& in, std::vector<std::size_t> out_splits = {},
                             std::vector<std::size_t> in_splits = {}) {
        static_assert(std::is_same_v<std::ranges::range_value_t<O>, std::ranges::range_value_t<I>>,
                      "corocoll: all_to_all: input and output must hold the same type");
        std::size_t elem = sizeof(std::ranges::range_value_t<I>);
        auto n = static_cast<std::size_t>(size());
        auto offsets = [&](std::vector<std::size_t>& splits, std::size_t total, const char* what) {
            if (splits.empty()) {
                if (total % n != 0) {
                    throw std::invalid_argument(
                        prefix("all_to_all") + std::string(what) + " of " + std::to_string(total) +
                        " elements does not split evenly over " + std::to_string(n) + " ranks");
                }
                splits.assign(n, total / n);
            }
            check_size("all_to_all", (std::string(what) + " splits").c_str(), splits.size(), n);
            std::vector<std::size_t> off(n + 1, 0);
            for (std::size_t p = 0; p < n; ++p) off[p + 1] = off[p] + splits[p] * elem;
            check_size("all_to_all", what, total, off[n] / elem);
            return off;
        };
        auto out_off = offsets(out_splits, std::ranges::size(out), "output");
        auto in_off = offsets(in_splits, std::ranges::size(in), "input");
        bool even = std::adjacent_find(in_splits.begin(), in_splits.end(), std::not_equal_to<>()) ==
                        in_splits.end() &&
                    in_splits == out_splits;
        auto out_bytes = detail::writable_bytes_of(out);
        auto in_bytes = detail::bytes_of(in);
        return collective(
            collectives::collective_kind::all_to_all, element_of<I>(),
            even ? std::ranges::size(in) : 0, 0, 0,
            [out_bytes, in_bytes, out_off, in_off](collectives::context& c) {
                return collectives::all_to_all_pairwise(c, out_bytes, out_off, in_bytes, in_off);
            },
            collectives::algorithm::pairwise);
    }

    /// torch's all_to_all with lists: `outs[p]` receives `ins[rank()]` of rank p.
    template <buffer R>
    task<> all_to_all(std::vector<R>& outs, const std::vector<R>& ins) {
        check_size("all_to_all", "input list", ins.size(), static_cast<std::size_t>(size()));
        check_size("all_to_all", "output list", outs.size(), static_cast<std::size_t>(size()));
        std::vector<std::ranges::range_value_t<R>> in_flat, out_flat;
        std::vector<std::size_t> in_splits, out_splits;
        for (const auto& b : ins) {
            in_splits.push_back(std::ranges::size(b));
            in_flat.insert(in_flat.end(), std::ranges::begin(b), std::ranges::end(b));
        }
        std::size_t total = 0;
        for (const auto& b : outs) {
            out_splits.push_back(std::ranges::size(b));
            total += std::ranges::size(b);
        }
        out_flat.resize(total);
        co_await all_to_all_single(out_flat, in_flat, out_splits, in_splits);
        std::size_t at = 0;
        for (auto& b : outs) {
            std::copy_n(out_flat.begin() + static_cast<std::ptrdiff_t>(at), std::ranges::size(b),
                        std::ranges::begin(b));
            at += std::ranges::size(b);
        }
    }

    /// A barrier that rank 0 watches: every rank reports to rank 0, which waits up to
    /// `timeout` and then names every rank that did not arrive (all of them, not just the
    /// first); every rank that arrived gets the same error. Like torch's monitored_barrier.
    task<> monitored_barrier(std::chrono::milliseconds timeout) {
        return collective(
            collectives::collective_kind::monitored_barrier, {}, 0, 0, 0,
            [this, timeout](collectives::context& c) { return monitored(c, timeout); });
    }

    // ---- object collectives: any serializable type (see collectives/object.hpp) ----

    /// Broadcasts the objects of rank `src`'s list into every rank's list (same length on
    /// every rank, as in torch).
    template <class T>
    task<> broadcast_object_list(std::vector<T>& objects, int src = 0) {
        check_root("broadcast_object_list", src);
        std::string bytes = rank() == src ? to_bytes(objects) : std::string{};
        co_await object_collective(
            collectives::collective_kind::broadcast_object, objects.size(), src,
            [&](collectives::context& c) -> task<> {
                std::int64_t len = static_cast<std::int64_t>(bytes.size());
                auto len_bytes = std::as_writable_bytes(std::span(&len, 1));
                co_await collectives::broadcast_binomial(c, len_bytes, src);
                bytes.resize(static_cast<std::size_t>(len));
                auto body = std::as_writable_bytes(std::span(bytes.data(), bytes.size()));
                co_await broadcast_payload(c, body, src);
            });
        if (rank() != src) {
            auto got = from_bytes<std::vector<T>>(bytes);
            check_size("broadcast_object_list", "object list", objects.size(), got.size());
            objects = std::move(got);
        }
    }

    /// Gathers one object from every rank into `out` (resized to size()) on rank `dst`.
    template <class T>
    task<> gather_object(const T& object, std::vector<T>& out, int dst = 0) {
        check_root("gather_object", dst);
        std::vector<std::string> all;
        co_await object_exchange(collectives::collective_kind::gather_object, to_bytes(object), dst,
                                 false, all);
        if (rank() == dst) decode_all(all, out);
    }

    /// Gathers one object from every rank into `out` (resized to size()) on every rank.
    template <class T>
    task<> all_gather_object(std::vector<T>& out, const T& object) {
        std::vector<std::string> all;
        co_await object_exchange(collectives::collective_kind::all_gather_object, to_bytes(object),
                                 0, true, all);
        decode_all(all, out);
    }

    /// Rank r gets `in[r]` of rank `src` in `out` (torch's scatter_object_list).
    template <class T>
    task<> scatter_object_list(T& out, const std::vector<T>& in, int src = 0) {
        check_root("scatter_object_list", src);
        if (rank() == src)
            check_size("scatter_object_list", "input list", in.size(),
                       static_cast<std::size_t>(size()));
        std::string mine;
        co_await object_collective(
            collectives::collective_kind::scatter_object, 1, src,
            [&](collectives::context& c) -> task<> {
                if (rank() == src) {
                    std::vector<task<>> sends;
                    std::vector<std::string> parts(in.size());
                    std::vector<std::int64_t> lens(in.size());
                    for (int p = 0; p < size(); ++p) {
                        parts[p] = to_bytes(in[p]);
                        lens[p] = static_cast<std::int64_t>(parts[p].size());
                        if (p == src) {
                            mine = parts[p];
                            continue;
                        }
                        sends.push_back([](collectives::context& cc, const std::int64_t& len,
                                           const std::string& part, int to) -> task<> {
                            co_await cc.send(std::as_bytes(std::span(&len, 1)), to, 0);
                            co_await cc.send(std::as_bytes(std::span(part.data(), part.size())), to,
                                             1);
                        }(c, lens[p], parts[p], p));
                    }
                    co_await when_all(std::move(sends));
                } else {
                    std::int64_t len = 0;
                    co_await c.recv(std::as_writable_bytes(std::span(&len, 1)), src, 0);
                    mine.resize(static_cast<std::size_t>(len));
                    co_await c.recv(std::as_writable_bytes(std::span(mine.data(), mine.size())),
                                    src, 1);
                }
            });
        out = from_bytes<T>(mine);
    }

    /// Says goodbye to the peers, closes the connections and fails whatever is pending.
    /// Idempotent.
    task<> close() {
        if (closed_) co_return;
        closed_ = true;
        // The rank that serves the store keeps it up until the others are gone.
        co_await engine_.close(hosted_ ? deadline() : std::chrono::steady_clock::time_point{});
        // The last collective's lock release (`unlock_item_`) may still wait in the reactor's
        // posted batch that is running now (a reader's cancellation ended the close inside
        // it): let that batch finish before the caller may destroy the group.
        co_await reactor_.schedule();
    }

    /// The transport underneath (for collectives and tests).
    transport::engine& engine() noexcept { return engine_; }

private:
    // ---- collective helpers ----

    template <class R>
    static dtype element_of() {
        using T = std::ranges::range_value_t<R>;
        static_assert(element<T>,
                      "corocoll: collectives take int8, uint8, int32, int64, float, double, "
                      "float16 or bfloat16 elements");
        return dtype_of<T>;
    }

    std::string prefix(const char* what) const {
        return "corocoll: rank " + std::to_string(rank()) + ": " + what + ": ";
    }
    void check_root(const char* what, int root) const {
        if (root < 0 || root >= size()) {
            throw std::invalid_argument(prefix(what) + "root " + std::to_string(root) +
                                        " is outside [0, " + std::to_string(size()) + ")");
        }
    }
    void check_op(const char* what, const collectives::reduction& red) const {
        if (!op_supported(red.op, red.type)) {
            throw std::invalid_argument(prefix(what) + unsupported_reason(red.op, red.type));
        }
    }
    void check_size(const char* what, const char* name, std::size_t got,
                    std::size_t expected) const {
        if (got != expected) {
            throw std::invalid_argument(prefix(what) + name + " has " + std::to_string(got) +
                                        " elements, " + std::to_string(expected) + " expected");
        }
    }

    template <class T>
    static void unflatten(const std::vector<T>& flat, auto& outs, std::size_t count) {
        for (std::size_t p = 0; p < outs.size(); ++p) {
            if (std::ranges::size(outs[p]) != count) {
                throw std::invalid_argument("corocoll: an output list entry has " +
                                            std::to_string(std::ranges::size(outs[p])) +
                                            " elements, " + std::to_string(count) + " expected");
            }
            std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(p * count), count,
                        std::ranges::begin(outs[p]));
        }
    }

    // Runs one collective: in issue order on this group (a FIFO lock), numbered, with the
    // metadata every rank must agree on.
    template <class Body>
    task<> collective(collectives::collective_kind kind, dtype type, std::size_t count,
                      std::uint8_t redop, int root, Body body,
                      collectives::algorithm algo = collectives::algorithm::automatic) {
        co_await collective_lock_.lock();
        // The next collective gets the lock through the reactor's queue, after our caller
        // has resumed: so collectives complete in issue order even when the next one could
        // finish at once from buffered data.
        struct release {
            process_group& g;
            ~release() {
                g.engine_.end_collective();
                g.reactor_.post(g.unlock_item_);
            }
        } release_at_end{*this};
        transport::collective_meta meta;
        meta.collective = static_cast<std::uint8_t>(kind);
        meta.redop = redop;
        meta.dtype = static_cast<std::uint8_t>(type);
        meta.algorithm = static_cast<std::uint8_t>(algo);
        meta.root = static_cast<std::uint32_t>(root);
        meta.count = count;
        meta.seq = ++collective_seq_;
        collectives::context c{engine_, meta, deadline(), chunk_bytes_, &scratch_};
        engine_.begin_collective(meta);
        co_await body(c);
        scratch_.trim();
    }

    template <class Body>
    task<> object_collective(collectives::collective_kind kind, std::size_t count, int root,
                             Body body) {
        return collective(kind, dtype::uint8, count, 0, root, std::move(body));
    }

    static task<> ring_all_gather(collectives::context& c, std::span<std::byte> out,
                                  std::span<const std::byte> in, std::size_t elem) {
        if (!in.empty()) {
            std::memcpy(out.data() + in.size() * static_cast<std::size_t>(c.rank()), in.data(),
                        in.size());
        }
        return collectives::all_gather_ring(c, out, elem);
    }

    // Broadcasts an object payload after its length went out in round 0.
    task<> broadcast_payload(collectives::context& c, std::span<std::byte> body, int src) {
        if (body.size() >= collectives::thresholds{}.broadcast_chain_bytes && size() > 2) {
            return collectives::broadcast_chain(c, body, src, 1);
        }
        return collectives::broadcast_binomial(c, body, src, 1);
    }

    // Gathers one byte string per rank: to `root` only, or to everyone (`all`). Lengths go
    // in round 0, payloads in round 1.
    task<> object_exchange(collectives::collective_kind kind, std::string mine, int root, bool all,
                           std::vector<std::string>& out) {
        out.assign(static_cast<std::size_t>(size()), {});
        co_await object_collective(kind, 1, root, [&](collectives::context& c) -> task<> {
            int me = rank();
            bool receives = all || me == root;
            std::int64_t my_len = static_cast<std::int64_t>(mine.size());
            std::vector<task<>> ops;
            for (int p = 0; p < size(); ++p) {
                if (p == me) continue;
                if (all || p == root) {
                    ops.push_back([](collectives::context& cc, const std::int64_t& len,
                                     const std::string& s, int to) -> task<> {
                        co_await cc.send(std::as_bytes(std::span(&len, 1)), to, 0);
                        co_await cc.send(std::as_bytes(std::span(s.data(), s.size())), to, 1);
                    }(c, my_len, mine, p));
                }
                if (receives) {
                    ops.push_back([](collectives::context& cc, std::string& into,
                                     int from) -> task<> {
                        std::int64_t len = 0;
                        co_await cc.recv(std::as_writable_bytes(std::span(&len, 1)), from, 0);
                        into.resize(static_cast<std::size_t>(len));
                        co_await cc.recv(
                            std::as_writable_bytes(std::span(into.data(), into.size())), from, 1);
                    }(c, out[static_cast<std::size_t>(p)], p));
                }
            }
            co_await when_all(std::move(ops));
        });
        out[static_cast<std::size_t>(rank())] = std::move(mine);
    }

    template <class T>
    static void decode_all(const std::vector<std::string>& all, std::vector<T>& out) {
        out.clear();
        out.reserve(all.size());
        for (const auto& bytes : all) out.push_back(from_bytes<T>(bytes));
    }

    // Rank 0 waits up to `timeout` for every other rank's report, then sends each its verdict
    // (empty: pass; otherwise the error text naming the missing ranks).
    task<> monitored(collectives::context& c, std::chrono::milliseconds timeout) {
        int n = size();
        if (rank() != 0) {
            // The verdict may already be here (a late rank's rank 0 may have left meanwhile):
            // post its receive first, and let a failed report not hide it.
            std::int64_t len = 0;
            auto verdict = start(c.recv(std::as_writable_bytes(std::span(&len, 1)), 0, 1));
            try {
                co_await c.send({}, 0, 0);
            } catch (const std::system_error&) {
                if (!verdict.is_completed()) throw;
            }
            co_await verdict;
            if (len == 0) co_return;
            std::string text(static_cast<std::size_t>(len), '\0');
            co_await c.recv(std::as_writable_bytes(std::span(text.data(), text.size())), 0, 2);
            corocoll::detail::throw_error(std::make_error_code(std::errc::timed_out), text);
        }
        collectives::context watch = c;
        watch.deadline = std::min(c.deadline, io::deadline_after(timeout));
        std::vector<char> arrived(static_cast<std::size_t>(n), 0);
        arrived[0] = 1;
        std::vector<task<>> reports;
        for (int p = 1; p < n; ++p) {
            reports.push_back([](collectives::context& w, char& flag, int from) -> task<> {
                try {
                    co_await w.recv({}, from, 0);
                    flag = 1;
                } catch (const std::system_error& e) {
                    if (e.code() != std::errc::timed_out) throw;
                }
            }(watch, arrived[static_cast<std::size_t>(p)], p));
        }
        co_await when_all(std::move(reports));
        std::string missing;
        for (int p = 1; p < n; ++p) {
            if (!arrived[static_cast<std::size_t>(p)])
                missing += (missing.empty() ? "" : ", ") + std::to_string(p);
        }
        std::string text;
        if (!missing.empty()) {
            text = "corocoll: monitored_barrier: rank(s) " + missing + " did not arrive within " +
                   std::to_string(timeout.count()) + " ms";
        }
        std::int64_t len = static_cast<std::int64_t>(text.size());
        std::vector<task<>> verdicts;
        for (int p = 1; p < n; ++p) {
            // Late ranks get the verdict when they arrive (it waits in their buffers).
            verdicts.push_back([](collectives::context& cc, const std::int64_t& l,
                                  const std::string& t, int to) -> task<> {
                co_await cc.send(std::as_bytes(std::span(&l, 1)), to, 1);
                if (l > 0) co_await cc.send(std::as_bytes(std::span(t.data(), t.size())), to, 2);
            }(c, len, text, p));
        }
        co_await when_all(std::move(verdicts));
        if (!text.empty())
            corocoll::detail::throw_error(std::make_error_code(std::errc::timed_out), text);
    }

    std::chrono::steady_clock::time_point deadline() const { return io::deadline_after(timeout_); }

    task<int> recv_bytes(std::span<std::byte> buf, int src, std::int64_t tag) {
        auto r = co_await engine_.recv(buf, src, tag, deadline());
        co_return r.source;
    }
    task<int> send_then_peer(std::span<const std::byte> buf, int dst, std::int64_t tag) {
        co_await engine_.send(buf, dst, tag, deadline());
        co_return dst;
    }

    io::reactor& reactor_;
    std::string name_;
    duration timeout_;
    std::shared_ptr<rendezvous::store> store_;
    std::shared_ptr<rendezvous::tcp_store_server> hosted_;  // rank 0's store server, if any
    io::endpoint listen_on_;
    transport::engine_options limits_;
    int subgroups_ = 0;
    transport::engine engine_;
    bool closed_ = false;
    async_mutex collective_lock_;
    struct unlock_item : corocoll::detail::work_item {
        async_mutex* lock = nullptr;
    } unlock_item_;
    std::uint64_t collective_seq_ = 0;
    collectives::algorithm_choice algorithms_ = collectives::algorithm_choice::from_env();
    std::size_t chunk_bytes_ = std::size_t{1} << 20;
    collectives::scratch_buffers scratch_;
};

namespace detail {

inline std::string init_error(const std::string& what) {
    return "corocoll: init_process_group: " + what;
}

struct init_store {
    std::shared_ptr<rendezvous::store> store;
    std::shared_ptr<rendezvous::tcp_store_server> hosted;
    std::optional<io::endpoint> master;
};

// Rank 0 serves the store at host:port; everyone connects to it.
inline task<init_store> tcp_rendezvous(io::reactor& r, const std::string& host, std::uint16_t port,
                                       int rank, std::chrono::milliseconds timeout) {
    init_store out;
    io::endpoint master = io::endpoint::resolve(host, port);
    out.master = master;
    if (rank == 0) {
        try {
            out.hosted = std::make_shared<rendezvous::tcp_store_server>(master);
        } catch (const std::system_error& e) {
            corocoll::detail::throw_error(
                e.code(), init_error("rank 0 cannot serve the store on " + master.to_string() +
                                     (e.code() == std::errc::address_in_use
                                          ? " (port " + std::to_string(port) +
                                                " is already in use: pick another MASTER_PORT)"
                                          : "") +
                                     ": " + corocoll::detail::context_of(e)));
        }
    }
    out.store = co_await rendezvous::tcp_store::connect(r, master, timeout);
    co_return out;
}

}  // namespace detail

namespace detail {

// The part of set-up every group shares, the world and subgroups alike: the mesh under the
// group's own store namespace, then a store-based barrier, as torch's init ends with: nobody
// returns (and perhaps finishes and exits, taking a hosted store along) before every rank
// has its connections.
inline task<std::shared_ptr<process_group>> build_group(
    io::reactor& r, std::shared_ptr<rendezvous::prefix_store> group_store, int rank, int size,
    std::string name, std::chrono::milliseconds timeout, transport::engine_options limits,
    io::endpoint listen_on, std::shared_ptr<rendezvous::tcp_store_server> hosted) {
    auto deadline = io::deadline_after(timeout);
    transport::mesh_options mesh;
    mesh.deadline = deadline;
    mesh.group_name = name;
    if (const char* token = std::getenv("COROCOLL_JOB_TOKEN")) mesh.job_token = token;
    mesh.listen_on = listen_on;
    auto peers = co_await transport::connect_mesh(r, *group_store, rank, size, mesh);
    if (co_await group_store->add("init/arrived", 1) == size) {
        co_await group_store->set("init/complete", "1");
    }
    std::vector<std::string> complete{"init/complete"};
    try {
        co_await group_store->wait(complete,
                                   std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::max(deadline - std::chrono::steady_clock::now(),
                                                std::chrono::steady_clock::duration{})));
    } catch (const std::system_error& e) {
        corocoll::detail::throw_error(
            e.code(), init_error("rank " + std::to_string(rank) + " of group '" + name +
                                 "' connected, but not every rank finished set-up in time: " +
                                 corocoll::detail::context_of(e)));
    }
    COROCOLL_LOG(info, "INIT", "group '", name, "' ready: rank ", rank, " of ", size);
    co_return std::make_shared<process_group>(r, rank, size, std::move(name), timeout,
                                              std::move(group_store), std::move(peers), limits,
                                              std::move(hosted), listen_on);
}

}  // namespace detail

namespace detail {

/// What every backend's set-up starts from: rank, world size and local rank worked out, and
/// the group's own namespace in the rendezvous store.
struct rendezvous_result {
    int rank = -1;
    int world_size = -1;
    int local_rank = -1;  ///< -1 when neither the options nor the launcher say
    std::shared_ptr<rendezvous::prefix_store> group_store;
    std::shared_ptr<rendezvous::tcp_store_server> hosted;
    std::optional<io::endpoint> master;
};

/// The part of `init_process_group` that does not depend on the backend: works out rank and
/// world size (explicit, else from the launcher's environment), reaches the store, and opens
/// a fresh namespace in it for this set-up of `o.group_name`.
inline task<rendezvous_result> rendezvous_for(io::reactor& r, init_options& o) {
    std::optional<rendezvous::launch_info> env;
    if (o.rank < 0 || o.world_size < 0) {
        if (o.store) {
            throw std::invalid_argument(
                detail::init_error("rank and world_size must be given with an explicit store"));
        }
        env = rendezvous::read_launch_env();
        if (o.rank < 0) o.rank = env->rank;
        if (o.world_size < 0) o.world_size = env->world_size;
        // Ranks of this host that outnumber its processors must not busy-poll.
        if (env->local_world_size > 0) io::reactor::set_local_processes(env->local_world_size);
    }
    if (o.world_size <= 0 || o.rank < 0 || o.rank >= o.world_size) {
        throw std::invalid_argument(
            detail::init_error("rank " + std::to_string(o.rank) +
                               " is outside [0, world_size=" + std::to_string(o.world_size) + ")"));
    }
    detail::log_rank() = o.rank;

    detail::init_store s;
    if (o.store) {
        s.store = o.store;
    } else if (o.init_method == "env://") {
        if (!env) {
            env.emplace();
            rendezvous::read_master_env(*env);
        }
        if (!env->master_addr || !env->master_port) {
            throw std::invalid_argument(
                detail::init_error(std::string("env:// needs MASTER_ADDR and MASTER_PORT; ") +
                                   (env->master_addr ? "" : "MASTER_ADDR is not set") +
                                   (!env->master_addr && !env->master_port ? ", " : "") +
                                   (env->master_port ? "" : "MASTER_PORT is not set")));
        }
        if (env->agent_store) {
            io::endpoint master = io::endpoint::resolve(*env->master_addr, *env->master_port);
            s.master = master;
            auto agent = co_await rendezvous::tcp_store::connect(r, master, o.timeout);
            s.store = std::make_shared<rendezvous::prefix_store>(env->agent_store_prefix(),
                                                                 std::move(agent));
        } else {
            s = co_await detail::tcp_rendezvous(r, *env->master_addr, *env->master_port, o.rank,
                                                o.timeout);
        }
    } else if (o.init_method.rfind("tcp://", 0) == 0) {
        std::string hostport = o.init_method.substr(6);
        auto colon = hostport.rfind(':');
        if (colon == std::string::npos) {
            throw std::invalid_argument(
                detail::init_error("init_method '" + o.init_method + "' lacks a port"));
        }
        std::string host = hostport.substr(0, colon);
        if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
        int port = std::atoi(hostport.c_str() + colon + 1);
        if (port <= 0 || port > 65535) {
            throw std::invalid_argument(
                detail::init_error("init_method '" + o.init_method + "' has a bad port"));
        }
        s = co_await detail::tcp_rendezvous(r, host, static_cast<std::uint16_t>(port), o.rank,
                                            o.timeout);
    } else if (o.init_method.rfind("file://", 0) == 0) {
        s.store = std::make_shared<rendezvous::file_store>(o.init_method.substr(7), o.timeout);
    } else {
        throw std::invalid_argument(detail::init_error(
            "init_method '" + o.init_method + "' is none of env://, tcp://host:port, file://path"));
    }
    s.store->set_timeout(o.timeout);

    // Every set-up of a group name gets fresh keys: ranks set groups up in the same order (as
    // torch requires too), so they agree on this count without asking each other. Per thread,
    // because ranks may be threads.
    thread_local std::map<std::string, int> generations;
    int generation = generations[o.group_name]++;
    rendezvous_result out;
    out.rank = o.rank;
    out.world_size = o.world_size;
    if (env) out.local_rank = env->local_rank;
    out.group_store = std::make_shared<rendezvous::prefix_store>(
        "corocoll/" + o.group_name + "/" + std::to_string(generation), s.store);
    out.hosted = std::move(s.hosted);
    out.master = s.master;
    co_return out;
}

}  // namespace detail

/// Sets up a process group, like torch's `init_process_group`: works out rank and world size
/// (explicit, else from the launcher's environment, see `rendezvous::read_launch_env`),
/// reaches the rendezvous store (given; `env://` at MASTER_ADDR:MASTER_PORT, where rank 0
/// serves it unless torchrun's agent already does (TORCHELASTIC_USE_AGENT_STORE); `tcp://`;
/// `file://`), then connects the mesh. Everything is bounded by `o.timeout`; errors name what
/// was missing or what failed. CUDA buffers: `corocoll::gpu::init_process_group` (the
/// include-gpu root) sets up backend "nccl".
inline task<std::shared_ptr<process_group>> init_process_group(io::reactor& r,
                                                               init_options o = {}) {
    if (o.backend != "tcp" && o.backend != "gloo" && o.backend != "cpu") {
        throw std::invalid_argument(detail::init_error(
            "backend '" + o.backend + "' is not available (CPU groups use \"tcp\"" +
            (o.backend == "nccl" ? "; NCCL groups come from corocoll::gpu::init_process_group in "
                                   "<corocoll/gpu/nccl_group.hpp>, a build with -Dnccl=enabled"
                                 : "") +
            ")"));
    }
    auto rv = co_await detail::rendezvous_for(r, o);
    co_return co_await detail::build_group(
        r, std::move(rv.group_store), rv.rank, rv.world_size, o.group_name, o.timeout, o.limits,
        transport::choose_listen_address(rv.master), std::move(rv.hosted));
}

inline task<std::shared_ptr<process_group>> process_group::new_group(std::vector<int> ranks) {
    std::sort(ranks.begin(), ranks.end());
    if (ranks.empty() || std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end() ||
        ranks.front() < 0 || ranks.back() >= size()) {
        throw std::invalid_argument(prefix("new_group") + "ranks must be distinct and within [0, " +
                                    std::to_string(size()) + ")");
    }
    int k = ++subgroups_;
    auto me = std::find(ranks.begin(), ranks.end(), rank());
    if (me == ranks.end()) co_return nullptr;
    auto store = std::make_shared<rendezvous::prefix_store>("sub/" + std::to_string(k), store_);
    co_return co_await detail::build_group(
        reactor_, std::move(store), static_cast<int>(me - ranks.begin()),
        static_cast<int>(ranks.size()), name_ + "/sub" + std::to_string(k), timeout_, limits_,
        listen_on_, nullptr);
}

inline task<std::shared_ptr<process_group>> process_group::split(int colour, int key) {
    std::vector<std::pair<int, int>> all;
    co_await all_gather_object(all, std::pair<int, int>{colour, key});
    int k = ++subgroups_;
    if (colour < 0) co_return nullptr;
    std::vector<std::pair<int, int>> members;  // (key, rank) of my colour
    for (int p = 0; p < size(); ++p) {
        if (all[static_cast<std::size_t>(p)].first == colour) {
            members.emplace_back(all[static_cast<std::size_t>(p)].second, p);
        }
    }
    std::sort(members.begin(), members.end());
    int index = 0;
    while (members[static_cast<std::size_t>(index)].second != rank()) ++index;
    auto store = std::make_shared<rendezvous::prefix_store>(
        "split/" + std::to_string(k) + "/" + std::to_string(colour), store_);
    co_return co_await detail::build_group(
        reactor_, std::move(store), index, static_cast<int>(members.size()),
        name_ + "/split" + std::to_string(k) + "." + std::to_string(colour), timeout_, limits_,
        listen_on_, nullptr);
}

COROCOLL_END_NAMESPACE
