// The NCCL functions the GPU layer calls, simulated on the host (tests only; see sim.hpp).
// Ranks are threads of one process; the ranks of a communicator meet in a clique keyed by
// the unique id. What is modelled, after nccl.h 2.28.9 and NCCL's source at v2.28.9-1:
//   - a collective or a group of calls is one launch on the stream: a task that waits for
//     every rank's matching call, computes the result from every rank's buffer (every op and
//     type, fp8 and the 16-bit floats through float, rounding at each step as a ring does)
//     and writes this rank's output; sends wait until the receiver took them, so ungrouped
//     send/recv pairs that must progress together hang, as nccl.h (≈ 503-505) warns;
//   - non-blocking communicators (config.blocking = 0): init, finalize and every launch
//     with more than one rank, or with point-to-point calls, return ncclInProgress, and
//     ncclCommGetAsyncError reports it for `in_progress_polls` polls; a world of one
//     completes collectives at once (enqueue.cc ≈ 2570, ncclLaunchOneRank);
//   - a call while the previous one is in progress fails with ncclInvalidArgument
//     (init.cc ≈ 373-389, ncclCommEnsureReady); an argument error on a non-blocking
//     communicator is stored and every later call returns it (enqueue.cc ≈ 2675,
//     ncclCommSetAsyncError);
//   - argument checks of argcheck.cc: root, type, op, a buffer that is not device memory of
//     the communicator's device, fp8 reductions below compute capability 9.0 of the lowest
//     rank (enqueue.cc ≈ 2557), and avg of fp8 on a world of one (onerank.cu's host switch
//     lacks the fp8 types);
//   - "Duplicate GPU detected" (init.cc ≈ 904) when two ranks of a host share a device:
//     ncclInvalidUsage;
//   - ncclCommAbort ends the rank's kernels; peers of a launch that can no longer finish see
//     ncclRemoteError; injected faults (sim.hpp) hang a launch or fail it asynchronously.

#include "sim.hpp"
#include "state.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

using namespace corocoll_sim::detail;

namespace {

enum class func {
    all_reduce,
    broadcast,
    reduce,
    all_gather,
    reduce_scatter,
    all_to_all,
    gather,
    scatter,
    send,
    recv
};

const char* func_name(func f) {
    static const char* names[] = {"AllReduce", "Broadcast", "Reduce",  "AllGather", "ReduceScatter",
                                  "AlltoAll",  "Gather",    "Scatter", "Send",      "Recv"};
    return names[static_cast<int>(f)];
}

// One NCCL call: device addresses as the caller gave them, shadows once launched.
struct call {
    func f;
    const void* send = nullptr;
    void* recv = nullptr;
    std::size_t count = 0;
    ncclDataType_t type = ncclFloat32;
    ncclRedOp_t op = ncclSum;
    int root = 0;  // the peer of send and recv
    const std::byte* send_shadow = nullptr;
    std::byte* recv_shadow = nullptr;
    std::uint64_t seq = 0;  // collectives: the clique's slot
};

struct message {
    const std::byte* data;
    std::size_t bytes;
    bool taken = false;
};

struct clique;

enum class waiting { nothing, init, finalize, launch };

}  // namespace

struct ncclComm {
    clique* cl = nullptr;
    int rank = 0;
    int nranks = 0;
    int device = 0;
    bool blocking = true;
    ncclResult_t async = ncclSuccess;
    waiting in_progress = waiting::nothing;
    int polls_left = 0;
    int min_cc = 90;
    std::uint64_t launches = 0;
    std::uint64_t coll_seq = 0;
    int pending = 0;  // launches not finished
    bool aborted = false;
    bool freed = false;
    std::vector<corocoll_sim::fault> faults;
};

namespace {

struct slot {
    std::vector<const call*> calls;
    int arrived = 0;
    int read = 0;
    int left = 0;
};

struct clique {
    int nranks = 0;
    std::vector<ncclComm*> members;
    int joined = 0;
    bool broken = false;
    std::map<std::uint64_t, slot> slots;
    std::map<std::pair<int, int>, std::deque<message*>> channels;  // (from, to)
};

std::map<std::string, clique*>& cliques() {
    static auto* m = new std::map<std::string, clique*>;
    return *m;
}

std::vector<corocoll_sim::fault>& faults() {
    static auto* f = [] {
        auto* v = new std::vector<corocoll_sim::fault>;
        if (const char* e = std::getenv("COROCOLL_SIM_FAULT")) {
            char kind[16] = {};
            int rank = -1;
            unsigned long long op = 0;
            if (std::sscanf(e, "%15[a-z]:%d:%llu", kind, &rank, &op) == 3) {
                v->push_back({std::string(kind) == "hang" ? corocoll_sim::fault_kind::hang
                                                          : corocoll_sim::fault_kind::async_error,
                              rank, op});
            }
        }
        return v;
    }();
    return *f;
}

char last_error[1024];

// NCCL's WARN: the text ncclGetLastError returns, printed when NCCL_DEBUG asks for it.
void warn(const std::string& text) {
    std::snprintf(last_error, sizeof last_error, "%s", text.c_str());
    const char* debug = std::getenv("NCCL_DEBUG");
    if (debug != nullptr && std::strcmp(debug, "WARN") == 0) {
        std::fprintf(stderr, "NCCL WARN %s\n", text.c_str());
    }
}

std::size_t type_size(ncclDataType_t t) {
    switch (t) {
        case ncclInt8:
        case ncclUint8:
        case ncclFloat8e4m3:
        case ncclFloat8e5m2:
            return 1;
        case ncclFloat16:
        case ncclBfloat16:
            return 2;
        case ncclInt32:
        case ncclUint32:
        case ncclFloat32:
            return 4;
        default:
            return 8;
    }
}

bool is_fp8(ncclDataType_t t) { return t == ncclFloat8e4m3 || t == ncclFloat8e5m2; }

// ---- arithmetic ----

template <class T>
float widen(T v) {
    if constexpr (std::is_same_v<T, __half>) {
        return __half2float(v);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        return __bfloat162float(v);
    } else {
        return static_cast<float>(v);
    }
}

template <class T>
T narrow(float v) {
    if constexpr (std::is_same_v<T, __half>) {
        return __float2half(v);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        return __float2bfloat16(v);
    } else {
        return T(v);
    }
}

template <class T>
constexpr bool narrow_float = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16> ||
                              std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>;

template <class T>
T combine(T a, T b, ncclRedOp_t op) {
    if constexpr (narrow_float<T>) {
        return narrow<T>(static_cast<float>(combine(widen(a), widen(b), op)));
    } else if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;  // wraps, as the GPU's integer units do
        switch (op) {
            case ncclProd:
                return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
            case ncclMin:
                return a < b ? a : b;
            case ncclMax:
                return a < b ? b : a;
            default:
                return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
        }
    } else {
        switch (op) {
            case ncclProd:
                return a * b;
            case ncclMin:
                return a < b ? a : b;
            case ncclMax:
                return a < b ? b : a;
            default:
                return a + b;
        }
    }
}

// out[i] = op over the ranks of in[r][i]; avg divides the sum by the ranks.
template <class T>
void reduce_typed(std::byte* out, const std::vector<const std::byte*>& in, std::size_t count,
                  ncclRedOp_t op) {
    auto* o = reinterpret_cast<T*>(out);
    for (std::size_t i = 0; i < count; ++i) {
        T acc;
        std::memcpy(&acc, in[0] + i * sizeof(T), sizeof(T));
        for (std::size_t r = 1; r < in.size(); ++r) {
            T v;
            std::memcpy(&v, in[r] + i * sizeof(T), sizeof(T));
            acc = combine(acc, v, op);
        }
        if (op == ncclAvg) {
            if constexpr (narrow_float<T>) {
                acc = narrow<T>(widen(acc) / static_cast<float>(in.size()));
            } else {
                acc = static_cast<T>(acc / static_cast<T>(in.size()));
            }
        }
        std::memcpy(o + i, &acc, sizeof(T));
    }
}

void reduce_bytes(std::byte* out, const std::vector<const std::byte*>& in, std::size_t count,
                  ncclDataType_t t, ncclRedOp_t op) {
    switch (t) {
        case ncclInt8:
            return reduce_typed<std::int8_t>(out, in, count, op);
        case ncclUint8:
            return reduce_typed<std::uint8_t>(out, in, count, op);
        case ncclInt32:
            return reduce_typed<std::int32_t>(out, in, count, op);
        case ncclUint32:
            return reduce_typed<std::uint32_t>(out, in, count, op);
        case ncclInt64:
            return reduce_typed<std::int64_t>(out, in, count, op);
        case ncclUint64:
            return reduce_typed<std::uint64_t>(out, in, count, op);
        case ncclFloat16:
            return reduce_typed<__half>(out, in, count, op);
        case ncclFloat32:
            return reduce_typed<float>(out, in, count, op);
        case ncclFloat64:
            return reduce_typed<double>(out, in, count, op);
        case ncclBfloat16:
            return reduce_typed<__nv_bfloat16>(out, in, count, op);
        case ncclFloat8e4m3:
            return reduce_typed<__nv_fp8_e4m3>(out, in, count, op);
        default:
            return reduce_typed<__nv_fp8_e5m2>(out, in, count, op);
    }
}

// This rank's output of collective `cs` (every rank's call), or empty where it writes none.
std::vector<std::byte> compute(int me, const std::vector<const call*>& cs) {
    const call& mine = *cs[static_cast<std::size_t>(me)];
    std::size_t n = cs.size(), count = mine.count, sz = type_size(mine.type);
    std::size_t block = count * sz;
    std::vector<std::byte> out;
    std::vector<const std::byte*> in;
    switch (mine.f) {
        case func::all_reduce:
        case func::reduce:
            if (mine.f == func::reduce && me != mine.root) break;
            out.resize(block);
            for (auto* c : cs) in.push_back(c->send_shadow);
            reduce_bytes(out.data(), in, count, mine.type, mine.op);
            break;
        case func::reduce_scatter:
            out.resize(block);
            for (auto* c : cs) in.push_back(c->send_shadow + static_cast<std::size_t>(me) * block);
            reduce_bytes(out.data(), in, count, mine.type, mine.op);
            break;
        case func::broadcast:
            out.assign(cs[static_cast<std::size_t>(mine.root)]->send_shadow,
                       cs[static_cast<std::size_t>(mine.root)]->send_shadow + block);
            break;
        case func::all_gather:
        case func::gather:
            if (mine.f == func::gather && me != mine.root) break;
            for (auto* c : cs) out.insert(out.end(), c->send_shadow, c->send_shadow + block);
            break;
        case func::all_to_all:
            for (auto* c : cs) {
                const std::byte* b = c->send_shadow + static_cast<std::size_t>(me) * block;
                out.insert(out.end(), b, b + block);
            }
            break;
        case func::scatter: {
            const std::byte* b = cs[static_cast<std::size_t>(mine.root)]->send_shadow +
                                 static_cast<std::size_t>(me) * block;
            out.assign(b, b + block);
            break;
        }
        default:
            break;
    }
    (void)n;
    return out;
}

// ---- communicator state ----

bool stopped(const ncclComm* c) { return c->aborted || c->cl->broken; }

// The launches of the clique that still wait for a peer cannot finish: each rank sees
// ncclRemoteError once one of its launches needs a peer (see wait_for), as a rank's proxy
// notices a peer's connection close.
void break_clique(clique* cl, const std::string& why) {
    cl->broken = true;
    warn(why);
    sim().cv.notify_all();
}

void remote_error(ncclComm* c) {
    if (c->async == ncclSuccess || c->async == ncclInProgress) {
        c->async = ncclRemoteError;
        c->in_progress = waiting::nothing;
    }
}

// What a kernel does once it cannot finish: spin until ncclCommAbort ends it.
void spin_until_abort(std::unique_lock<std::mutex>& lock, ncclComm* c) {
    sim().cv.wait(lock, [c] { return c->aborted; });
}

// Waits for `ready`; false (after the abort that ends the kernel) if the launch cannot finish.
template <class Ready>
bool wait_for(std::unique_lock<std::mutex>& lock, ncclComm* c, Ready ready) {
    sim().cv.wait(lock, [&] { return ready() || stopped(c); });
    if (ready() && !c->aborted) return true;
    if (!c->aborted) remote_error(c);
    spin_until_abort(lock, c);
    return false;
}

bool collective(std::unique_lock<std::mutex>& lock, ncclComm* c, const call& k) {
    clique* cl = c->cl;
    slot& s = cl->slots[k.seq];
    if (s.calls.empty()) {
        s.calls.assign(static_cast<std::size_t>(cl->nranks), nullptr);
        s.left = cl->nranks;
    }
    s.calls[static_cast<std::size_t>(c->rank)] = &k;
    ++s.arrived;
    sim().cv.notify_all();
    if (!wait_for(lock, c, [&] { return s.arrived == cl->nranks; })) return false;
    for (const call* other : s.calls) {
        if (other->f != k.f || other->count != k.count || other->type != k.type ||
            other->op != k.op || other->root != k.root) {
            c->async = ncclInvalidUsage;
            break_clique(cl,
                         std::string("corocoll-sim: ") + func_name(k.f) +
                             ": ranks disagree on the call (function, count, type, op or root)");
            spin_until_abort(lock, c);
            return false;
        }
    }
    lock.unlock();
    std::vector<std::byte> out = compute(c->rank, s.calls);
    lock.lock();
    ++s.read;
    sim().cv.notify_all();
    if (!wait_for(lock, c, [&] { return s.read == cl->nranks; })) return false;
    if (!out.empty()) std::memcpy(k.recv_shadow, out.data(), out.size());
    if (--s.left == 0) cl->slots.erase(k.seq);
    return true;
}

// One launch: sends posted, collectives in order, receives, then the sends taken.
void execute(ncclComm* c, std::vector<call> calls, std::uint64_t index) {
    auto& st = sim();
    std::unique_lock lock(st.mu);
    clique* cl = c->cl;
    auto finish = [&] {
        --c->pending;
        st.cv.notify_all();
    };
    for (const auto& f : c->faults) {
        if (f.op != index) continue;
        if (f.kind == corocoll_sim::fault_kind::async_error) {
            c->async = ncclSystemError;
            break_clique(cl, "corocoll-sim: injected failure of " +
                                 std::string(func_name(calls.front().f)) + " (launch " +
                                 std::to_string(index) + ") on rank " + std::to_string(c->rank));
        }
        spin_until_abort(lock, c);
        return finish();
    }
    std::vector<message> sent;
    sent.reserve(calls.size());
    for (const auto& k : calls) {
        if (k.f != func::send) continue;
        sent.push_back({k.send_shadow, k.count * type_size(k.type)});
        cl->channels[{c->rank, k.root}].push_back(&sent.back());
    }
    st.cv.notify_all();
    for (const auto& k : calls) {
        if (k.f != func::send && k.f != func::recv && !collective(lock, c, k)) return finish();
    }
    for (const auto& k : calls) {
        if (k.f != func::recv) continue;
        auto& q = cl->channels[{k.root, c->rank}];
        if (!wait_for(lock, c, [&] { return !q.empty(); })) return finish();
        message* m = q.front();
        q.pop_front();
        std::size_t room = k.count * type_size(k.type);
        if (m->bytes > room) {
            c->async = ncclInvalidUsage;
            break_clique(cl, "corocoll-sim: Recv from rank " + std::to_string(k.root) + ": " +
                                 std::to_string(m->bytes) + " bytes sent, room for " +
                                 std::to_string(room));
            spin_until_abort(lock, c);
            return finish();
        }
        if (m->bytes > 0) std::memcpy(k.recv_shadow, m->data, m->bytes);
        m->taken = true;
        st.cv.notify_all();
    }
    wait_for(lock, c, [&] {
        for (const auto& m : sent) {
            if (!m.taken) return false;
        }
        return true;
    });
    finish();
}

// ---- calls and groups ----

struct queued {
    ncclComm* comm;
    cudaStream_t stream;
    call k;
};

thread_local int group_depth = 0;
thread_local std::vector<queued> group_calls;
thread_local ncclResult_t group_error = ncclSuccess;

// A non-blocking communicator keeps an error; every later call returns it.
ncclResult_t fail(ncclComm* c, ncclResult_t rc, const std::string& why) {
    warn(why);
    if (c != nullptr && !c->blocking && !c->freed) {
        c->async = rc;
        c->in_progress = waiting::nothing;
    }
    return rc;
}

// ncclCommEnsureReady (init.cc ≈ 373-389) and CommCheck. Under the lock.
ncclResult_t usable(ncclComm* c, const char* what) {
    if (c == nullptr) {
        warn(std::string(what) + " : comm argument is NULL");
        return ncclInvalidArgument;
    }
    if (c->freed) {
        ++sim().comm_used_after_free;
        report(std::string(what) + " on a communicator already destroyed or aborted");
        return ncclInvalidArgument;
    }
    if (c->async == ncclInProgress) {
        return fail(c, ncclInvalidArgument,
                    "Attempt to use communicator before the previous operation returned "
                    "ncclSuccess");
    }
    return c->async;
}

// CudaPtrCheck (argcheck.cc): device memory of the communicator's device, `bytes` long.
ncclResult_t check_ptr(ncclComm* c, const void* p, std::size_t bytes, const char* what,
                       const char* name) {
    if (bytes == 0) return ncclSuccess;
    const allocation* a = find_device(p, bytes);
    if (a == nullptr) {
        return fail(c, ncclInvalidArgument,
                    std::string(what) + " : " + name + " " +
                        std::to_string(reinterpret_cast<std::uintptr_t>(p)) +
                        " is not a valid pointer");
    }
    if (a->device != c->device) {
        return fail(c, ncclInvalidArgument,
                    std::string(what) + " : " + name + " allocated on device " +
                        std::to_string(a->device) + " mismatchs with NCCL device " +
                        std::to_string(c->device));
    }
    return ncclSuccess;
}

// ArgsCheck and the fp8 check, then the call joins the open group (or a group of its own).
ncclResult_t check(ncclComm* c, const call& k) {
    const char* what = func_name(k.f);
    ncclResult_t rc = usable(c, what);
    if (rc != ncclSuccess) return rc;
    bool p2p = k.f == func::send || k.f == func::recv;
    if (k.root < 0 || k.root >= c->nranks) {
        return fail(c, ncclInvalidArgument,
                    std::string(what) + " : invalid " + (p2p ? "peer " : "root ") +
                        std::to_string(k.root) + " (root should be in the 0.." +
                        std::to_string(c->nranks - 1) + " range)");
    }
    if (k.type < 0 || k.type >= ncclNumTypes) {
        return fail(c, ncclInvalidArgument,
                    std::string(what) + " : invalid type " + std::to_string(k.type));
    }
    if (k.op < 0 || k.op >= ncclNumOps) {
        return fail(c, ncclInvalidArgument,
                    std::string(what) + " : invalid reduction operation " + std::to_string(k.op));
    }
    bool reduces = k.f == func::all_reduce || k.f == func::reduce || k.f == func::reduce_scatter;
    if (reduces && is_fp8(k.type) && c->min_cc < 90 && k.count > 0) {
        return fail(c, ncclInvalidArgument,
                    "FP8 reduction support begins with sm90 capable devices.");
    }
    // A world of one reduces in ncclLaunchOneRank (device/onerank.cu), whose host-side switch
    // over the types for avg (a pre-multiplied sum) has its fp8 cases under
    // `__CUDA_ARCH__ >= 900`, never defined in host code: avg of fp8 on one rank falls to
    // `default: return ncclInvalidArgument`, without a warning (seen on an H100, NCCL 2.28.9).
    if (reduces && is_fp8(k.type) && k.op == ncclAvg && c->nranks == 1 && k.count > 0) {
        return fail(c, ncclInvalidArgument,
                    "ncclLaunchOneRank: avg of fp8 on one rank has no host-side case");
    }
    std::size_t block = k.count * type_size(k.type);
    std::size_t all = block * static_cast<std::size_t>(c->nranks);
    bool root = c->rank == k.root;
    std::size_t in = 0, out = 0;
    switch (k.f) {
        case func::all_reduce:
        case func::broadcast:
            in = out = block;
            break;
        case func::reduce:
            in = block;
            out = root ? block : 0;
            break;
        case func::all_gather:
            in = block;
            out = all;
            break;
        case func::reduce_scatter:
            in = all;
            out = block;
            break;
        case func::all_to_all:
            in = out = all;
            break;
        case func::gather:
            in = block;
            out = root ? all : 0;
            break;
        case func::scatter:
            in = root ? all : 0;
            out = block;
            break;
        case func::send:
            in = block;
            break;
        case func::recv:
            out = block;
            break;
    }
    if (k.f == func::broadcast && !root) in = 0;
    rc = check_ptr(c, k.send, in, what, "sendbuff");
    if (rc == ncclSuccess) rc = check_ptr(c, k.recv, out, what, "recvbuff");
    return rc;
}

// Launches the calls of one communicator as one task on `stream`. Under the lock.
ncclResult_t launch(ncclComm* c, cudaStream_t stream, std::vector<call> calls) {
    auto s = stream_of(stream);
    if (!s || s->device != c->device) {
        // NCCL launches on the communicator's device; a stream of another one is refused.
        return fail(c, ncclUnhandledCudaError,
                    "Cuda failure 'invalid resource handle': the stream is not on device " +
                        std::to_string(c->device));
    }
    bool p2p = false;
    for (auto& k : calls) {
        p2p = p2p || k.f == func::send || k.f == func::recv;
        std::size_t block = k.count * type_size(k.type);
        if (const allocation* a = find_device(k.send, 1); a != nullptr && block > 0) {
            k.send_shadow = shadow_of(*a, k.send);
        }
        if (const allocation* a = find_device(k.recv, 1); a != nullptr && block > 0) {
            k.recv_shadow = shadow_of(*a, k.recv);
        }
        if (k.f != func::send && k.f != func::recv) k.seq = c->coll_seq++;
    }
    std::uint64_t index = c->launches++;
    ++c->pending;
    task t;
    t.run = [c, calls = std::move(calls), index]() mutable { execute(c, std::move(calls), index); };
    enqueue(s, std::move(t));
    if (!c->blocking && (c->nranks > 1 || p2p) && sim().in_progress_polls > 0) {
        c->async = ncclInProgress;
        c->in_progress = waiting::launch;
        c->polls_left = sim().in_progress_polls;
        return ncclInProgress;
    }
    return ncclSuccess;
}

ncclResult_t group_end_locked() {
    auto calls = std::move(group_calls);
    group_calls.clear();
    ncclResult_t err = std::exchange(group_error, ncclSuccess);
    if (err != ncclSuccess) {
        // group.cc ≈ 381: every communicator of the group keeps the error.
        for (auto& q : calls) fail(q.comm, err, last_error);
        return err;
    }
    ncclResult_t result = ncclSuccess;
    std::vector<ncclComm*> done;
    for (std::size_t i = 0; i < calls.size(); ++i) {
        ncclComm* c = calls[i].comm;
        if (std::find(done.begin(), done.end(), c) != done.end()) continue;
        done.push_back(c);
        std::vector<call> mine;
        for (std::size_t j = i; j < calls.size(); ++j) {
            if (calls[j].comm == c) mine.push_back(calls[j].k);
        }
        ncclResult_t rc = launch(c, calls[i].stream, std::move(mine));
        if (rc != ncclSuccess && result != ncclInvalidArgument) result = rc;
    }
    return result;
}

ncclResult_t enqueue_call(ncclComm* c, cudaStream_t stream, call k) {
    std::lock_guard lock(sim().mu);
    ncclResult_t rc = check(c, k);
    if (group_depth > 0) {
        if (rc != ncclSuccess && group_error == ncclSuccess) group_error = rc;
        if (rc == ncclSuccess) group_calls.push_back({c, stream, k});
        return rc;
    }
    if (rc != ncclSuccess) return rc;
    // Empty collectives are discarded (enqueue.cc ≈ 2555).
    if (k.count == 0 && k.f != func::send && k.f != func::recv) return ncclSuccess;
    group_calls.push_back({c, stream, k});
    return group_end_locked();
}

// Whether what `c` waits for is done; sets its outcome when it is. Under the lock.
void settle(ncclComm* c) {
    if (c->async != ncclInProgress) return;
    if (c->polls_left > 0) {
        --c->polls_left;
        return;
    }
    clique* cl = c->cl;
    switch (c->in_progress) {
        case waiting::init: {
            if (cl->broken) return remote_error(c);
            if (cl->joined < cl->nranks) return;
            int min_cc = 1000;
            for (ncclComm* m : cl->members) {
                auto [major, minor] = sim().capability.at(static_cast<std::size_t>(m->device));
                min_cc = std::min(min_cc, major * 10 + minor);
            }
            c->min_cc = min_cc;
            for (ncclComm* m : cl->members) {
                if (m != c && m->device == c->device) {
                    c->in_progress = waiting::nothing;
                    char bus[64];
                    std::snprintf(bus, sizeof bus, "%x000", 0x10 + c->device);
                    c->async = ncclInvalidUsage;
                    warn("Duplicate GPU detected : rank " + std::to_string(c->rank) + " and rank " +
                         std::to_string(m->rank) + " both on CUDA device " + bus);
                    return;
                }
            }
            break;
        }
        case waiting::finalize:
            if (c->pending > 0) return;
            break;
        default:
            break;
    }
    c->in_progress = waiting::nothing;
    c->async = ncclSuccess;
}

ncclResult_t init(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, bool blocking) {
    if (out == nullptr) return ncclInvalidArgument;
    *out = nullptr;
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        warn("rank " + std::to_string(rank) + " exceeds ndev=" + std::to_string(nranks));
        return ncclInvalidArgument;
    }
    auto& st = sim();
    std::unique_lock lock(st.mu);
    std::string key(id.internal, sizeof id.internal);
    clique*& cl = cliques()[key];
    if (cl == nullptr) {
        cl = new clique;
        cl->nranks = nranks;
        cl->members.assign(static_cast<std::size_t>(nranks), nullptr);
    }
    if (cl->nranks != nranks || cl->members[static_cast<std::size_t>(rank)] != nullptr) {
        warn("corocoll-sim: rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
             " joins a clique of " + std::to_string(cl->nranks) + " twice or with another size");
        return ncclInvalidUsage;
    }
    auto* c = new ncclComm;
    c->cl = cl;
    c->rank = rank;
    c->nranks = nranks;
    c->device = current_device();
    c->blocking = blocking;
    for (const auto& f : faults()) {
        if (f.rank < 0 || f.rank == rank) c->faults.push_back(f);
    }
    cl->members[static_cast<std::size_t>(rank)] = c;
    ++cl->joined;
    st.cv.notify_all();
    *out = c;
    c->async = ncclInProgress;
    c->in_progress = waiting::init;
    c->polls_left = blocking ? 0 : st.in_progress_polls;
    if (!blocking) return ncclInProgress;
    st.cv.wait(lock, [cl] { return cl->joined == cl->nranks; });
    settle(c);
    return c->async;
}

}  // namespace

// ---- the test-only API (sim.hpp) ----

namespace corocoll_sim {

void inject(fault f) {
    std::lock_guard lock(sim().mu);
    faults().push_back(f);
}

void clear_faults() {
    std::lock_guard lock(sim().mu);
    faults().clear();
}

}  // namespace corocoll_sim

// ---- NCCL ----

extern "C" {

const char* ncclGetErrorString(ncclResult_t code) {
    switch (code) {
        case ncclSuccess:
            return "no error";
        case ncclUnhandledCudaError:
            return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
        case ncclSystemError:
            return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
        case ncclInternalError:
            return "internal error - please report this issue to the NCCL developers";
        case ncclInvalidArgument:
            return "invalid argument (run with NCCL_DEBUG=WARN for details)";
        case ncclInvalidUsage:
            return "invalid usage (run with NCCL_DEBUG=WARN for details)";
        case ncclRemoteError:
            return "remote process exited or there was a network error";
        case ncclInProgress:
            return "NCCL operation in progress";
        default:
            return "unknown result code";
    }
}

const char* ncclGetLastError(ncclComm_t) { return last_error; }

ncclResult_t ncclGetVersion(int* version) {
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    static std::mt19937_64 rng(std::random_device{}());
    std::lock_guard lock(sim().mu);
    std::memset(id->internal, 0, sizeof id->internal);
    std::uint64_t words[3] = {rng(), rng(), static_cast<std::uint64_t>(::getpid())};
    std::memcpy(id->internal, words, sizeof words);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
    bool blocking = true;
    if (config != nullptr) {
        if (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t)) {
            warn("ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
            return ncclInvalidArgument;
        }
        blocking = config->blocking != 0;  // NCCL_CONFIG_UNDEF_INT: blocking, the default
    }
    return init(comm, nranks, id, rank, blocking);
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    return init(comm, nranks, id, rank, true);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* state) {
    std::lock_guard lock(sim().mu);
    if (c == nullptr || c->freed) {
        if (c != nullptr) {
            ++sim().comm_used_after_free;
            report("ncclCommGetAsyncError on a communicator already destroyed or aborted");
        }
        return ncclInvalidArgument;
    }
    settle(c);
    *state = c->async;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int* count) {
    *count = c->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int* rank) {
    *rank = c->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t c, int* device) {
    *device = c->device;
    return ncclSuccess;
}

// Waits (polled, on a non-blocking communicator) until every launch has finished.
ncclResult_t ncclCommFinalize(ncclComm_t c) {
    auto& st = sim();
    std::unique_lock lock(st.mu);
    ncclResult_t rc = usable(c, "ncclCommFinalize");
    if (rc != ncclSuccess) return rc;
    c->async = ncclInProgress;
    c->in_progress = waiting::finalize;
    c->polls_left = c->blocking ? 0 : st.in_progress_polls;
    if (!c->blocking) return ncclInProgress;
    st.cv.wait(lock, [c] { return c->pending == 0 || stopped(c); });
    settle(c);
    return c->async == ncclInProgress ? ncclSuccess : c->async;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    std::lock_guard lock(sim().mu);
    if (c == nullptr) return ncclInvalidArgument;
    if (c->freed) {
        ++sim().comm_used_after_free;
        report("ncclCommDestroy of a communicator already destroyed or aborted");
        return ncclInvalidArgument;
    }
    c->freed = true;  // kept: its launches may still refer to it
    return ncclSuccess;
}

// Ends this rank's kernels; launches of peers that needed this rank fail with ncclRemoteError.
ncclResult_t ncclCommAbort(ncclComm_t c) {
    std::lock_guard lock(sim().mu);
    if (c == nullptr) return ncclSuccess;
    if (c->freed) {
        ++sim().comm_used_after_free;
        report("ncclCommAbort of a communicator already destroyed or aborted");
        return ncclInvalidArgument;
    }
    c->aborted = true;
    c->freed = true;
    clique* cl = c->cl;
    bool peers_wait = cl->joined < cl->nranks || c->pending > 0;
    for (auto& [seq, s] : cl->slots) peers_wait = peers_wait || s.arrived > 0;
    for (auto& [ends, q] : cl->channels) {
        peers_wait =
            peers_wait || ((ends.first == c->rank || ends.second == c->rank) && !q.empty());
    }
    if (peers_wait && !cl->broken) {
        break_clique(cl, "corocoll-sim: rank " + std::to_string(c->rank) + " aborted");
    }
    sim().cv.notify_all();
    return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
    ++group_depth;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
    if (group_depth == 0) {
        warn("ncclGroupEnd: not in a group call.");
        return ncclInvalidUsage;
    }
    if (--group_depth > 0) return ncclSuccess;
    std::lock_guard lock(sim().mu);
    return group_end_locked();
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
    return enqueue_call(c, s, {func::all_reduce, send, recv, count, type, op, 0});
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t c, cudaStream_t s) {
    return enqueue_call(c, s, {func::broadcast, send, recv, count, type, ncclSum, root});
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t s) {
    return enqueue_call(c, s, {func::reduce, send, recv, count, type, op, root});
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t c, cudaStream_t s) {
    return enqueue_call(c, s, {func::all_gather, send, recv, count, type, ncclSum, 0});
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
    return enqueue_call(c, s, {func::reduce_scatter, send, recv, count, type, op, 0});
}

ncclResult_t ncclAlltoAll(const void* send, void* recv, size_t count, ncclDataType_t type,
                          ncclComm_t c, cudaStream_t s) {
    return enqueue_call(c, s, {func::all_to_all, send, recv, count, type, ncclSum, 0});
}

ncclResult_t ncclGather(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                        ncclComm_t c, cudaStream_t s) {
    return enqueue_call(c, s, {func::gather, send, recv, count, type, ncclSum, root});
}

ncclResult_t ncclScatter(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                         ncclComm_t c, cudaStream_t s) {
    return enqueue_call(c, s, {func::scatter, send, recv, count, type, ncclSum, root});
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t c,
                      cudaStream_t s) {
    return enqueue_call(c, s, {func::send, send, nullptr, count, type, ncclSum, peer});
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t c,
                      cudaStream_t s) {
    return enqueue_call(c, s, {func::recv, nullptr, recv, count, type, ncclSum, peer});
}

}  // extern "C"
