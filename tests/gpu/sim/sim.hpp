#pragma once

// The test-only face of the CUDA runtime and NCCL simulator (tests/gpu/sim/): what a test
// may set or ask beyond the real API. The simulator itself is linked in place of libcudart
// and libnccl (meson -Dgpu_sim=true); programs call the real functions, declared by the real
// cuda_runtime_api.h and nccl.h. Never installed.
//
// Environment, read once at the first call:
//   COROCOLL_SIM_DEVICES=N          devices seen (default 4)
//   COROCOLL_SIM_CC=MAJOR.MINOR     compute capability of every device (default 9.0)
//   COROCOLL_SIM_IN_PROGRESS=N      polls of ncclCommGetAsyncError that a non-blocking call
//                                   stays ncclInProgress (default 1)
//   COROCOLL_SIM_FAULT=KIND:RANK:OP one fault (KIND hang or error), as `inject` below

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace corocoll_sim {

/// Devices `cudaGetDeviceCount` reports from now on (their streams and memory stay).
void set_device_count(int n);
/// Compute capability of `device` (cudaDevAttrComputeCapabilityMajor/Minor; NCCL's fp8 check).
void set_compute_capability(int device, int major, int minor);
/// Polls of ncclCommGetAsyncError that a non-blocking init, finalize or operation stays
/// ncclInProgress before it is done.
void set_in_progress_polls(int n);

/// What goes wrong at an injected fault.
enum class fault_kind {
    /// The operation never finishes (its stream stalls until ncclCommAbort).
    hang,
    /// ncclCommGetAsyncError reports ncclSystemError on that rank and ncclRemoteError on its
    /// peers; the operation's kernels spin until ncclCommAbort, as NCCL's do.
    async_error,
};
/// A fault at the `op`-th launch (0-based: each ungrouped call or ncclGroupEnd counts one) on
/// the communicator of rank `rank` (-1: every rank). Applies to communicators made after.
struct fault {
    fault_kind kind = fault_kind::hang;
    int rank = -1;
    std::uint64_t op = 0;
};
void inject(fault f);
void clear_faults();

/// A task that stalls `s` until `release` (a long kernel whose end the test decides).
struct gate;
gate* hold(cudaStream_t s);
void release(gate* g);
/// A task of `d` on `s` (a kernel of that duration: the compute of the gpu_overlap example).
void busy(cudaStream_t s, std::chrono::microseconds d);
/// Tasks enqueued on `s` that have not finished.
std::size_t pending(cudaStream_t s);

/// What the simulator saw that a real GPU would punish: counted, and printed on stderr.
struct violations {
    /// cudaFreeHost of page-locked memory that a copy still in flight reads or writes.
    std::uint64_t pinned_freed_in_flight = 0;
    /// NCCL calls on a communicator already destroyed or aborted.
    std::uint64_t comm_used_after_free = 0;
};
violations seen();

}  // namespace corocoll_sim
