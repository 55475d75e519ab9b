#pragma once

// The simulator's shared state (tests/gpu/sim/): devices, streams as in-order worker threads,
// device memory as mappings the host cannot touch. One lock guards all of it; the workers
// wait on one condition variable. Everything here is leaked on purpose: a stream worker may
// still be stalled (an injected hang) when the process exits, and must not meet destroyed
// globals.

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace corocoll_sim::detail {

struct stream_rec;

/// A unit of stream work: `run` is called on the stream's worker, without the lock, once
/// every (stream, count) of `after` has completed that many tasks.
struct task {
    std::function<void()> run;
    std::vector<std::pair<std::shared_ptr<stream_rec>, std::uint64_t>> after;
    /// Page-locked ranges the task reads or writes (see violations::pinned_freed_in_flight).
    std::vector<std::pair<const std::byte*, std::size_t>> pinned;
};

/// A CUDA stream: its tasks run in order on a thread of its own.
struct stream_rec {
    int device = 0;
    bool legacy = false;   // the legacy default stream of `device`
    bool blocking = true;  // waits for the legacy default stream (cudaStreamDefault)
    std::deque<task> queue;
    std::uint64_t enqueued = 0;
    std::uint64_t completed = 0;
    bool destroyed = false;
};

struct event_rec {
    int device = 0;
    std::shared_ptr<stream_rec> stream;  // null: never recorded
    std::uint64_t seq = 0;               // done once stream->completed reaches it
};

struct allocation {
    std::byte* device_ptr = nullptr;  // PROT_NONE: a host access faults
    std::byte* shadow = nullptr;      // the same pages, read and written by the simulator
    std::size_t size = 0;
    int device = 0;
};

struct state {
    std::mutex mu;
    std::condition_variable cv;
    int device_count = 4;
    std::vector<std::pair<int, int>> capability = std::vector<std::pair<int, int>>(64, {9, 0});
    int in_progress_polls = 1;
    std::map<std::uintptr_t, allocation> memory;       // by device address
    std::map<std::uintptr_t, std::size_t> pinned;      // cudaMallocHost blocks
    std::vector<std::shared_ptr<stream_rec>> streams;  // live ordinary streams
    std::map<int, std::shared_ptr<stream_rec>> legacy;
    std::uint64_t pinned_freed_in_flight = 0;
    std::uint64_t comm_used_after_free = 0;
};

/// The one state, made (and the environment read) at the first call.
state& sim();

/// The current device of the calling thread (cudaSetDevice is per host thread).
int& current_device();

/// The stream `s` names: null, cudaStreamLegacy and cudaStreamPerThread are the legacy
/// default stream of the current device. Under the lock.
std::shared_ptr<stream_rec> stream_of(cudaStream_t s);

/// Enqueues `t` on `s` (with the legacy default stream's ordering) and wakes its worker.
/// Under the lock.
void enqueue(const std::shared_ptr<stream_rec>& s, task t);

/// The allocation that holds [p, p + bytes), or null. Under the lock.
const allocation* find_device(const void* p, std::size_t bytes);

/// The simulator's address of device address `p` (which find_device found).
std::byte* shadow_of(const allocation& a, const void* p);

/// Blocks (the lock held by `lock`) until `s` has completed `seq` tasks.
void wait_stream(std::unique_lock<std::mutex>& lock, stream_rec& s, std::uint64_t seq);

/// Prints a violation on stderr.
void report(const std::string& what);

}  // namespace corocoll_sim::detail
