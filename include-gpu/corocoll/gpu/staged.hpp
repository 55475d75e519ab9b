#pragma once

// CUDA buffers on CPU process groups: each operation copies the device data into page-locked
// host memory, runs the CPU group's operation over TCP there, and copies the result back. The
// copies are enqueued on a CUDA stream and awaited through events the reactor polls, so the
// thread keeps running other coroutines meanwhile. Unlike NCCL, this lets several ranks share
// one GPU.

#include <corocoll/collectives/dtype.hpp>
#include <corocoll/collectives/reduce_op.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/gpu/cuda.hpp>
#include <corocoll/gpu/wait.hpp>
#include <corocoll/process_group/process_group.hpp>
#include <corocoll/version.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace gpu {

namespace detail {

// The host element a CPU group reduces for a device element: CUDA's half types travel as
// corocoll's, which have their layout.
template <class T>
struct host_element {
    using type = T;
};
template <>
struct host_element<__half> {
    using type = float16;
};
template <>
struct host_element<__nv_bfloat16> {
    using type = bfloat16;
};
static_assert(sizeof(__half) == sizeof(float16) && sizeof(__nv_bfloat16) == sizeof(bfloat16));

}  // namespace detail

/// A CPU (tcp) process group's operations on CUDA device memory (`device_span`,
/// `device_buffer`), staged through page-locked host memory: copy in, the CPU operation,
/// copy out, each copy awaited without blocking the reactor. Reductions take the CPU group's
/// element types (int8, uint8, int32, int64, float, double, float16/__half,
/// bfloat16/__nv_bfloat16); moves take any element. Operations may run concurrently (each
/// takes its own staging buffer from a pool). Use it from the group's thread; the device is
/// the one current when it was made, and the caller's current device is left as it was.
///
/// Ordering: the copies out of device memory run on `stream()`, which (unless given) is an
/// ordinary stream: it waits for the legacy default stream only. Data produced on any other
/// stream (a cudaStreamNonBlocking one, or another ordinary stream) must be finished first
/// (`gpu::synchronize`), or that stream passed as `s`, or the copy may read it half-written.
class staged {
public:
    /// `s`: the stream the copies go on, the producer's stream if there is one (null: one of
    /// its own, an ordinary stream that waits for the legacy default stream).
    explicit staged(process_group& pg, cudaStream_t s = nullptr) : pg_(pg) {
        check_cuda(cudaGetDevice(&device_), "staged: cudaGetDevice");
        if (s == nullptr) {
            own_stream_ = std::make_unique<gpu::stream>();
            s = own_stream_->get();
        }
        stream_ = s;
    }
    staged(const staged&) = delete;
    staged& operator=(const staged&) = delete;
    /// A staging buffer that a copy which timed out may still read or write is never freed:
    /// it is left allocated (with its event) rather than freed under the copy.
    ~staged() {
        reclaim();
        if (in_flight_.empty()) return;
        static std::mutex m;
        // Kept reachable for the rest of the process, never freed.
        static auto* abandoned = new std::vector<in_flight>;
        std::lock_guard lock(m);
        for (auto& f : in_flight_) abandoned->push_back(std::move(f));
    }

    process_group& group() const noexcept { return pg_; }
    cudaStream_t stream() const noexcept { return stream_; }

    /// `process_group::all_reduce` on device memory.
    template <device_memory R>
    task<> all_reduce(R& data, reduce_op op = reduce_op::sum) {
        using H = host_t<R>;
        auto h = co_await download<H>("all_reduce", data.data(), data.size());
        auto view = h.template as<H>(data.size());
        co_await pg_.all_reduce(view, op);
        co_await upload("all_reduce", data.data(), h, data.size_bytes());
    }

    /// `process_group::reduce`: only `dst` gets the result copied back.
    template <device_memory R>
    task<> reduce(R& data, int dst, reduce_op op = reduce_op::sum) {
        using H = host_t<R>;
        auto h = co_await download<H>("reduce", data.data(), data.size());
        auto view = h.template as<H>(data.size());
        co_await pg_.reduce(view, dst, op);
        if (pg_.rank() == dst) co_await upload("reduce", data.data(), h, data.size_bytes());
    }

    /// `process_group::broadcast`: `src` copies out, the others copy in.
    template <device_memory R>
    task<> broadcast(R& data, int src) {
        auto h = co_await download<std::uint8_t>("broadcast", data.data(), data.size_bytes(),
                                                 pg_.rank() == src);
        auto view = h.template as<std::uint8_t>(data.size_bytes());
        co_await pg_.broadcast(view, src);
        if (pg_.rank() != src) co_await upload("broadcast", data.data(), h, data.size_bytes());
    }

    /// `process_group::all_gather_into`.
    template <device_memory O, device_memory I>
    task<> all_gather_into(O& out, const I& in) {
        same_type<O, I>();
        auto hi = co_await download<std::uint8_t>("all_gather", in.data(), in.size_bytes());
        auto ho = take(out.size_bytes());
        auto vi = hi.template as<std::uint8_t>(in.size_bytes());
        auto vo = ho.template as<std::uint8_t>(out.size_bytes());
        co_await pg_.all_gather_into(vo, vi);
        co_await upload("all_gather", out.data(), ho, out.size_bytes());
    }

    /// `process_group::reduce_scatter_into`.
    template <device_memory O, device_memory I>
    task<> reduce_scatter_into(O& out, const I& in, reduce_op op = reduce_op::sum) {
        same_type<O, I>();
        using H = host_t<I>;
        auto hi = co_await download<H>("reduce_scatter", in.data(), in.size());
        auto ho = take(out.size_bytes());
        auto vi = hi.template as<H>(in.size());
        auto vo = ho.template as<H>(out.size());
        co_await pg_.reduce_scatter_into(vo, vi, op);
        co_await upload("reduce_scatter", out.data(), ho, out.size_bytes());
    }

    /// `process_group::all_to_all_single` (split sizes in elements).
    template <device_memory O, device_memory I>
    task<> all_to_all_single(O& out, const I& in, std::vector<std::size_t> out_splits = {},
                             std::vector<std::size_t> in_splits = {}) {
        same_type<O, I>();
        // Moved as bytes: any element type, splits scaled to bytes.
        for (auto& x : out_splits) x *= sizeof(element_t<O>);
        for (auto& x : in_splits) x *= sizeof(element_t<I>);
        auto hi = co_await download<std::uint8_t>("all_to_all", in.data(), in.size_bytes());
        auto ho = take(out.size_bytes());
        auto vi = hi.template as<std::uint8_t>(in.size_bytes());
        auto vo = ho.template as<std::uint8_t>(out.size_bytes());
        co_await pg_.all_to_all_single(vo, vi, std::move(out_splits), std::move(in_splits));
        co_await upload("all_to_all", out.data(), ho, out.size_bytes());
    }

    /// `process_group::gather_into`: `out` is only written on `dst`.
    template <device_memory I, device_memory O>
    task<> gather_into(const I& in, O& out, int dst) {
        same_type<O, I>();
        auto hi = co_await download<std::uint8_t>("gather", in.data(), in.size_bytes());
        bool root = pg_.rank() == dst;
        auto ho = take(root ? out.size_bytes() : 0);
        auto vi = hi.template as<std::uint8_t>(in.size_bytes());
        auto vo = ho.template as<std::uint8_t>(root ? out.size_bytes() : 0);
        co_await pg_.gather_into(vi, vo, dst);
        if (root) co_await upload("gather", out.data(), ho, out.size_bytes());
    }

    /// `process_group::scatter_from`: `in` is only read on `src`.
    template <device_memory O, device_memory I>
    task<> scatter_from(O& out, const I& in, int src) {
        same_type<O, I>();
        bool root = pg_.rank() == src;
        auto hi = co_await download<std::uint8_t>("scatter", in.data(), root ? in.size_bytes() : 0);
        auto ho = take(out.size_bytes());
        auto vi = hi.template as<std::uint8_t>(root ? in.size_bytes() : 0);
        auto vo = ho.template as<std::uint8_t>(out.size_bytes());
        co_await pg_.scatter_from(vo, vi, src);
        co_await upload("scatter", out.data(), ho, out.size_bytes());
    }

    /// `process_group::send` of device memory.
    template <device_memory R>
    task<> send(const R& buf, int dst, std::int64_t tag = 0) {
        auto h = co_await download<std::uint8_t>("send", buf.data(), buf.size_bytes());
        auto view = h.template as<std::uint8_t>(buf.size_bytes());
        co_await pg_.send(view, dst, tag);
    }

    /// `process_group::recv` into device memory; yields the sender. A shorter message leaves
    /// the rest of `buf` as it was (the staging copy starts from `buf`'s contents).
    template <device_memory R>
    task<int> recv(R& buf, int src = any_source, std::int64_t tag = 0) {
        auto h = co_await download<std::uint8_t>("recv", buf.data(), buf.size_bytes());
        auto view = h.template as<std::uint8_t>(buf.size_bytes());
        int from = co_await pg_.recv(view, src, tag);
        co_await upload("recv", buf.data(), h, buf.size_bytes());
        co_return from;
    }

    /// `process_group::barrier` (no device memory involved).
    task<> barrier() { return pg_.barrier(); }

private:
    template <class R>
    using host_t = typename detail::host_element<element_t<R>>::type;

    // A page-locked buffer lent from the pool; it goes back when the lease ends, or, while a
    // copy that failed to finish may still use it, to the buffers in flight.
    class lease {
    public:
        lease(staged* owner, std::unique_ptr<pinned_buffer> b) : owner_(owner), b_(std::move(b)) {}
        lease(lease&& o) noexcept = default;
        lease& operator=(lease&&) = delete;
        ~lease() {
            if (!b_) return;
            if (copying_ != nullptr) {
                owner_->in_flight_.push_back({std::move(b_), copying_});
            } else {
                owner_->pool_.push_back(std::move(b_));
            }
        }
        std::byte* data() const noexcept { return b_->data(); }
        template <class T>
        std::span<T> as(std::size_t count) const noexcept {
            return {reinterpret_cast<T*>(data()), count};
        }
        // A copy that uses the buffer may run until `done` has completed.
        void in_flight_until(cudaEvent_t done) noexcept { copying_ = done; }

    private:
        staged* owner_;
        std::unique_ptr<pinned_buffer> b_;
        cudaEvent_t copying_ = nullptr;
    };

    struct in_flight {
        std::unique_ptr<pinned_buffer> buffer;
        cudaEvent_t done;
    };

    // Buffers whose copy has finished go back to the pool, their events too.
    void reclaim() noexcept {
        for (std::size_t i = 0; i < in_flight_.size();) {
            if (cudaEventQuery(in_flight_[i].done) != cudaSuccess) {
                ++i;
                continue;
            }
            pool_.push_back(std::move(in_flight_[i].buffer));
            events_.give(in_flight_[i].done);
            in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
        }
        (void)cudaGetLastError();
    }

    lease take(std::size_t bytes) {
        reclaim();
        std::unique_ptr<pinned_buffer> b;
        if (!pool_.empty()) {
            b = std::move(pool_.back());
            pool_.pop_back();
        } else {
            b = std::make_unique<pinned_buffer>();
        }
        b->reserve(std::max<std::size_t>(bytes, 1));
        return lease(this, std::move(b));
    }

    // A fresh lease of `count` elements, with the device memory at `from` copied in when
    // `fill`.
    template <class H>
    task<lease> download(const char* op, const void* from, std::size_t count, bool fill = true) {
        std::size_t bytes = count * sizeof(H);
        lease h = take(bytes);
        if (fill) co_await copy(op, h.data(), from, bytes, cudaMemcpyDeviceToHost, h);
        co_return h;
    }

    task<> upload(const char* op, void* to, lease& h, std::size_t bytes) {
        return copy(op, to, h.data(), bytes, cudaMemcpyHostToDevice, h);
    }

    // One copy between device memory and `h`'s buffer, awaited. If the wait fails (a
    // deadline), the copy may still run: `h` then keeps its buffer out of the pool until the
    // copy's event has completed.
    task<> copy(const char* op, void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind,
                lease& h) {
        if (bytes == 0) co_return;
        wait_label label{op, pg_.rank()};
        cudaEvent_t done = nullptr;
        {
            device_guard on(device_);
            check_cuda(cudaMemcpyAsync(to, from, bytes, kind, stream_),
                       kind == cudaMemcpyDeviceToHost ? "staged: cudaMemcpyAsync to the host"
                                                      : "staged: cudaMemcpyAsync to the device");
            done = events_.take();
            cudaError_t rc = cudaEventRecord(done, stream_);
            if (rc != cudaSuccess) {
                // Nothing marks the copy's end: wait for it here, on this rare path, so that
                // the buffer can go back to the pool.
                events_.give(done);
                (void)cudaStreamSynchronize(stream_);
                check_cuda(rc, "staged: cudaEventRecord");
            }
        }
        try {
            co_await until(
                pg_.reactor(), [done](std::string& why) noexcept { return query_event(done, why); },
                io::deadline_after(pg_.timeout()), label);
        } catch (...) {
            h.in_flight_until(done);
            throw;
        }
        events_.give(done);
    }

    template <class O, class I>
    static void same_type() {
        static_assert(std::is_same_v<element_t<O>, element_t<I>>,
                      "corocoll: input and output must hold the same element type");
    }

    process_group& pg_;
    int device_ = 0;
    std::unique_ptr<gpu::stream> own_stream_;
    cudaStream_t stream_ = nullptr;
    std::vector<std::unique_ptr<pinned_buffer>> pool_;
    std::vector<in_flight> in_flight_;
    event_pool events_;
};

}  // namespace gpu

COROCOLL_END_NAMESPACE
