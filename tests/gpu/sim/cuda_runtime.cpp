// The CUDA runtime functions the GPU layer calls, simulated on the host (tests only; see
// sim.hpp). Semantics follow the CUDA Runtime API reference (cuda_runtime_api.h of CUDA 13)
// and the Programming Guide's "Stream and Event Behavior":
//   - a stream runs its work in order, asynchronously to the host: here, a worker thread per
//     stream;
//   - an ordinary stream (cudaStreamDefault) waits for work on the legacy default stream,
//     and work on the legacy stream waits for every ordinary stream of its device; a
//     cudaStreamNonBlocking stream does neither ("Default Stream" in the guide);
//   - cudaEventRecord captures the work enqueued so far; cudaEventQuery returns
//     cudaErrorNotReady until the stream has run it, cudaSuccess for an event never recorded;
//     "cudaEventRecord() will fail if the input event and input stream are associated to
//     different devices" (guide, "Stream and Event Behavior");
//   - the current device is per host thread (cudaSetDevice); streams, events and memory
//     belong to the device current when they are made;
//   - device memory is not host memory: here a PROT_NONE mapping of a memfd whose second,
//     writable mapping only the simulator's copy engine uses, so a host access to a device
//     pointer dies with SIGSEGV;
//   - cudaFree synchronizes the device ("cudaFree() ... implicit synchronization" in the
//     guide's "Implicit Synchronization"); cudaMemcpy and cudaMemset are synchronous and go
//     on the legacy default stream.

#include "sim.hpp"
#include "state.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace corocoll_sim::detail {

namespace {

void parse_env(state& s) {
    if (const char* v = std::getenv("COROCOLL_SIM_DEVICES")) s.device_count = std::atoi(v);
    if (const char* v = std::getenv("COROCOLL_SIM_CC")) {
        int major = 0, minor = 0;
        if (std::sscanf(v, "%d.%d", &major, &minor) >= 1) {
            for (auto& c : s.capability) c = {major, minor};
        }
    }
    if (const char* v = std::getenv("COROCOLL_SIM_IN_PROGRESS")) {
        s.in_progress_polls = std::atoi(v);
    }
}

// The worker of one stream: runs its tasks in order, each once what it waits for is done.
void worker(std::shared_ptr<stream_rec> s) {
    auto& st = sim();
    std::unique_lock lock(st.mu);
    for (;;) {
        st.cv.wait(lock, [&] {
            if (s->queue.empty()) return s->destroyed;
            for (auto& [other, seq] : s->queue.front().after) {
                if (other->completed < seq) return false;
            }
            return true;
        });
        if (s->queue.empty()) {  // destroyed and drained: only now off the device's streams
            auto& all = st.streams;
            all.erase(std::find(all.begin(), all.end(), s));
            st.cv.notify_all();
            return;
        }
        auto run = std::move(s->queue.front().run);
        lock.unlock();
        run();
        lock.lock();
        s->queue.pop_front();
        ++s->completed;
        st.cv.notify_all();
    }
}

std::shared_ptr<stream_rec> make_stream(int device, bool legacy, bool blocking) {
    auto s = std::make_shared<stream_rec>();
    s->device = device;
    s->legacy = legacy;
    s->blocking = blocking;
    std::thread(worker, s).detach();
    return s;
}

bool is_pinned(const void* p, std::size_t bytes) {
    auto& st = sim();
    auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = st.pinned.upper_bound(a);
    if (it == st.pinned.begin()) return false;
    --it;
    return a + bytes <= it->first + it->second;
}

thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
    last_error = e;
    return e;
}

// A copy of `bytes` from `src` to `dst` (device or host addresses, as `kind` says), checked
// now and done by `s`'s worker. Under the lock.
cudaError_t enqueue_copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                         const std::shared_ptr<stream_rec>& s) {
    if (bytes == 0) return cudaSuccess;
    const allocation* d = find_device(dst, bytes);
    const allocation* from = find_device(src, bytes);
    if (kind == cudaMemcpyDefault) {
        kind = d != nullptr ? (from != nullptr ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                            : (from != nullptr ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    }
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    // A device side that is not (wholly) device memory, or a host side that is.
    if (dst_dev != (d != nullptr) || src_dev != (from != nullptr) || dst == nullptr ||
        src == nullptr) {
        return fail(cudaErrorInvalidValue);
    }
    auto* to = dst_dev ? shadow_of(*d, dst) : static_cast<std::byte*>(dst);
    auto* in = src_dev ? shadow_of(*from, src) : static_cast<const std::byte*>(src);
    task t;
    t.run = [to, in, bytes] { std::memmove(to, in, bytes); };
    if (!dst_dev && is_pinned(dst, bytes)) t.pinned.emplace_back(to, bytes);
    if (!src_dev && is_pinned(src, bytes)) t.pinned.emplace_back(in, bytes);
    enqueue(s, std::move(t));
    return cudaSuccess;
}

// Waits until every stream of `device` has run what it has now.
void sync_device(std::unique_lock<std::mutex>& lock, int device) {
    auto& st = sim();
    std::vector<std::pair<std::shared_ptr<stream_rec>, std::uint64_t>> marks;
    for (auto& s : st.streams) {
        if (s->device == device) marks.emplace_back(s, s->enqueued);
    }
    if (auto it = st.legacy.find(device); it != st.legacy.end()) {
        marks.emplace_back(it->second, it->second->enqueued);
    }
    for (auto& [s, seq] : marks) wait_stream(lock, *s, seq);
}

}  // namespace

state& sim() {
    static state* s = [] {
        auto* p = new state;
        parse_env(*p);
        return p;
    }();
    return *s;
}

int& current_device() {
    thread_local int device = 0;
    return device;
}

std::shared_ptr<stream_rec> stream_of(cudaStream_t s) {
    auto& st = sim();
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) {
        auto& l = st.legacy[current_device()];
        if (!l) l = make_stream(current_device(), true, true);
        return l;
    }
    auto* raw = reinterpret_cast<stream_rec*>(s);
    for (auto& p : st.streams) {
        if (p.get() == raw && !p->destroyed) return p;
    }
    return nullptr;
}

void enqueue(const std::shared_ptr<stream_rec>& s, task t) {
    auto& st = sim();
    if (s->legacy) {
        for (auto& o : st.streams) {
            if (o->device == s->device && o->blocking) t.after.emplace_back(o, o->enqueued);
        }
    } else if (s->blocking) {
        auto l = st.legacy.find(s->device);
        if (l != st.legacy.end()) t.after.emplace_back(l->second, l->second->enqueued);
    }
    s->queue.push_back(std::move(t));
    ++s->enqueued;
    st.cv.notify_all();
}

const allocation* find_device(const void* p, std::size_t bytes) {
    auto& st = sim();
    auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = st.memory.upper_bound(a);
    if (it == st.memory.begin()) return nullptr;
    --it;
    if (a + bytes > it->first + it->second.size) return nullptr;
    return &it->second;
}

std::byte* shadow_of(const allocation& a, const void* p) {
    return a.shadow + (static_cast<const std::byte*>(p) - a.device_ptr);
}

void wait_stream(std::unique_lock<std::mutex>& lock, stream_rec& s, std::uint64_t seq) {
    sim().cv.wait(lock, [&] { return s.completed >= seq; });
}

void report(const std::string& what) { std::fprintf(stderr, "corocoll-sim: %s\n", what.c_str()); }

}  // namespace corocoll_sim::detail

using namespace corocoll_sim::detail;

// ---- the test-only API (sim.hpp) ----

namespace corocoll_sim {

void set_device_count(int n) {
    std::lock_guard lock(sim().mu);
    sim().device_count = n;
}

void set_compute_capability(int device, int major, int minor) {
    std::lock_guard lock(sim().mu);
    sim().capability.at(static_cast<std::size_t>(device)) = {major, minor};
}

void set_in_progress_polls(int n) {
    std::lock_guard lock(sim().mu);
    sim().in_progress_polls = n;
}

struct gate {
    bool open = false;
};

gate* hold(cudaStream_t s) {
    auto& st = sim();
    std::lock_guard lock(st.mu);
    auto* g = new gate;
    task t;
    t.run = [g] {
        std::unique_lock l(sim().mu);
        sim().cv.wait(l, [g] { return g->open; });
        delete g;  // release() set it open under the lock and does not touch it again
    };
    enqueue(stream_of(s), std::move(t));
    return g;
}

void release(gate* g) {
    std::lock_guard lock(sim().mu);
    g->open = true;
    sim().cv.notify_all();
}

void busy(cudaStream_t s, std::chrono::microseconds d) {
    std::lock_guard lock(sim().mu);
    task t;
    t.run = [d] { std::this_thread::sleep_for(d); };
    enqueue(stream_of(s), std::move(t));
}

std::size_t pending(cudaStream_t s) {
    std::lock_guard lock(sim().mu);
    auto r = stream_of(s);
    return r ? r->queue.size() : 0;
}

violations seen() {
    std::lock_guard lock(sim().mu);
    return {sim().pinned_freed_in_flight, sim().comm_used_after_free};
}

}  // namespace corocoll_sim

// ---- the CUDA runtime ----

extern "C" {

const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess:
            return "cudaSuccess";
        case cudaErrorInvalidValue:
            return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation:
            return "cudaErrorMemoryAllocation";
        case cudaErrorNoDevice:
            return "cudaErrorNoDevice";
        case cudaErrorInvalidDevice:
            return "cudaErrorInvalidDevice";
        case cudaErrorInvalidResourceHandle:
            return "cudaErrorInvalidResourceHandle";
        case cudaErrorNotReady:
            return "cudaErrorNotReady";
        default:
            return "cudaErrorUnknown";
    }
}

// The texts of cuda_runtime_api.h's error documentation (driver_types.h).
const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess:
            return "no error";
        case cudaErrorInvalidValue:
            return "invalid argument";
        case cudaErrorMemoryAllocation:
            return "out of memory";
        case cudaErrorNoDevice:
            return "no CUDA-capable device is detected";
        case cudaErrorInvalidDevice:
            return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle:
            return "invalid resource handle";
        case cudaErrorNotReady:
            return "device not ready";
        default:
            return "unknown error";
    }
}

cudaError_t cudaGetLastError() { return std::exchange(last_error, cudaSuccess); }

cudaError_t cudaGetDeviceCount(int* count) {
    std::lock_guard lock(sim().mu);
    *count = sim().device_count;
    return *count > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
    std::lock_guard lock(sim().mu);
    if (device < 0 || device >= sim().device_count) return fail(cudaErrorInvalidDevice);
    current_device() = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
    *device = current_device();
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    std::lock_guard lock(sim().mu);
    if (device < 0 || device >= sim().device_count) return fail(cudaErrorInvalidDevice);
    auto [major, minor] = sim().capability.at(static_cast<std::size_t>(device));
    switch (attr) {
        case cudaDevAttrComputeCapabilityMajor:
            *value = major;
            return cudaSuccess;
        case cudaDevAttrComputeCapabilityMinor:
            *value = minor;
            return cudaSuccess;
        case cudaDevAttrMultiProcessorCount:
            *value = 132;
            return cudaSuccess;
        default:
            return fail(cudaErrorInvalidValue);
    }
}

// One bus per device: "0000:XX:00.0", as nvidia-smi prints it.
cudaError_t cudaDeviceGetPCIBusId(char* bus, int len, int device) {
    std::lock_guard lock(sim().mu);
    if (device < 0 || device >= sim().device_count) return fail(cudaErrorInvalidDevice);
    if (std::snprintf(bus, static_cast<std::size_t>(len), "0000:%02X:00.0", 0x10 + device) >= len) {
        return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
    std::lock_guard lock(sim().mu);
    auto r = make_stream(current_device(), false, (flags & cudaStreamNonBlocking) == 0);
    sim().streams.push_back(r);
    *s = reinterpret_cast<cudaStream_t>(r.get());
    return cudaSuccess;
}

// "In case the device is still doing work in the stream stream when cudaStreamDestroy() is
// called, the function will return immediately and the resources ... released automatically
// once the device has completed all work in stream."
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    auto& st = sim();
    std::lock_guard lock(st.mu);
    auto r = stream_of(s);
    if (!r || r->legacy) return fail(cudaErrorInvalidResourceHandle);
    r->destroyed = true;  // its worker drains it, then leaves (device syncs wait for that)
    st.cv.notify_all();
    return cudaSuccess;
}

// The device of `s`; the legacy and per-thread streams are the current device's.
cudaError_t cudaStreamGetDevice(cudaStream_t s, int* device) {
    std::lock_guard lock(sim().mu);
    auto r = stream_of(s);
    if (!r) return fail(cudaErrorInvalidResourceHandle);
    *device = r->device;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    std::unique_lock lock(sim().mu);
    auto r = stream_of(s);
    if (!r) return fail(cudaErrorInvalidResourceHandle);
    wait_stream(lock, *r, r->enqueued);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
    std::unique_lock lock(sim().mu);
    sync_device(lock, current_device());
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
    auto* r = new event_rec;
    r->device = current_device();
    *e = reinterpret_cast<cudaEvent_t>(r);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(sim().mu);
    delete reinterpret_cast<event_rec*>(e);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(sim().mu);
    auto* r = reinterpret_cast<event_rec*>(e);
    auto stream = stream_of(s);
    if (!stream || stream->device != r->device) return fail(cudaErrorInvalidResourceHandle);
    r->stream = stream;
    r->seq = stream->enqueued;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(sim().mu);
    auto* r = reinterpret_cast<event_rec*>(e);
    // cudaErrorNotReady is not an error that sticks: cudaGetLastError does not report it.
    return !r->stream || r->stream->completed >= r->seq ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
    std::unique_lock lock(sim().mu);
    auto* r = reinterpret_cast<event_rec*>(e);
    if (r->stream) wait_stream(lock, *r->stream, r->seq);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
    if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(sim().mu);
    auto* r = reinterpret_cast<event_rec*>(e);
    auto stream = stream_of(s);
    if (!stream) return fail(cudaErrorInvalidResourceHandle);
    task t;
    t.run = [] {};
    if (r->stream) t.after.emplace_back(r->stream, r->seq);
    enqueue(stream, std::move(t));
    return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
    if (p == nullptr) return fail(cudaErrorInvalidValue);
    *p = nullptr;
    if (bytes == 0) return cudaSuccess;
    std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::size_t size = (bytes + page - 1) / page * page;
    int fd = ::memfd_create("corocoll-sim-device", MFD_CLOEXEC);
    if (fd < 0) return fail(cudaErrorMemoryAllocation);
    void* shadow = MAP_FAILED;
    void* dev = MAP_FAILED;
    if (::ftruncate(fd, static_cast<off_t>(size)) == 0) {
        shadow = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        dev = ::mmap(nullptr, size, PROT_NONE, MAP_SHARED, fd, 0);
    }
    ::close(fd);
    if (shadow == MAP_FAILED || dev == MAP_FAILED) {
        if (shadow != MAP_FAILED) ::munmap(shadow, size);
        if (dev != MAP_FAILED) ::munmap(dev, size);
        return fail(cudaErrorMemoryAllocation);
    }
    std::lock_guard lock(sim().mu);
    allocation a{static_cast<std::byte*>(dev), static_cast<std::byte*>(shadow), bytes,
                 current_device()};
    sim().memory[reinterpret_cast<std::uintptr_t>(dev)] = a;
    *p = dev;
    return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
    if (p == nullptr) return cudaSuccess;
    auto& st = sim();
    std::unique_lock lock(st.mu);
    auto it = st.memory.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == st.memory.end()) return fail(cudaErrorInvalidValue);
    sync_device(lock, it->second.device);
    it = st.memory.find(reinterpret_cast<std::uintptr_t>(p));
    std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::size_t size = (it->second.size + page - 1) / page * page;
    ::munmap(it->second.device_ptr, size);
    ::munmap(it->second.shadow, size);
    st.memory.erase(it);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, std::size_t bytes) {
    if (p == nullptr) return fail(cudaErrorInvalidValue);
    *p = std::malloc(std::max<std::size_t>(bytes, 1));
    if (*p == nullptr) return fail(cudaErrorMemoryAllocation);
    std::lock_guard lock(sim().mu);
    sim().pinned[reinterpret_cast<std::uintptr_t>(*p)] = std::max<std::size_t>(bytes, 1);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
    if (p == nullptr) return cudaSuccess;
    auto& st = sim();
    std::lock_guard lock(st.mu);
    auto it = st.pinned.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == st.pinned.end()) return fail(cudaErrorInvalidValue);
    auto* lo = static_cast<const std::byte*>(p);
    const std::byte* hi = lo + it->second;
    bool in_flight = false;
    auto touches = [&](const std::deque<task>& q) {
        for (const auto& t : q) {
            for (auto [b, n] : t.pinned) in_flight = in_flight || (b < hi && b + n > lo);
        }
    };
    for (auto& s : st.streams) touches(s->queue);
    for (auto& [d, s] : st.legacy) touches(s->queue);
    if (in_flight) {
        ++st.pinned_freed_in_flight;
        report("cudaFreeHost of page-locked memory that a copy in flight still uses");
        return cudaSuccess;  // leaked rather than freed: the copy would write freed memory
    }
    st.pinned.erase(it);
    std::free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
    std::lock_guard lock(sim().mu);
    auto r = stream_of(s);
    if (!r) return fail(cudaErrorInvalidResourceHandle);
    return enqueue_copy(dst, src, bytes, kind, r);
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
    std::unique_lock lock(sim().mu);
    auto r = stream_of(nullptr);
    cudaError_t rc = enqueue_copy(dst, src, bytes, kind, r);
    if (rc == cudaSuccess) wait_stream(lock, *r, r->enqueued);
    return rc;
}

cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
    std::unique_lock lock(sim().mu);
    const allocation* a = find_device(p, bytes);
    if (a == nullptr) return fail(cudaErrorInvalidValue);
    std::byte* to = shadow_of(*a, p);
    auto r = stream_of(nullptr);
    task t;
    t.run = [to, value, bytes] { std::memset(to, value, bytes); };
    enqueue(r, std::move(t));
    wait_stream(lock, *r, r->enqueued);
    return cudaSuccess;
}

}  // extern "C"
