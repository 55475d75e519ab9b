// The simulator (tests/gpu/sim/) is faithful where the GPU layer depends on it: streams run in
// order and after the legacy default stream, events are not ready before their work ends, a
// host access to device memory crashes, non-blocking communicators stay in progress, faults
// surface through ncclCommGetAsyncError, collectives compute across ranks, and NCCL's
// argument and duplicate-GPU errors come back as NCCL returns them. Raw CUDA and NCCL calls
// only; nothing of corocoll.

#include "sim/sim.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

// Polls ncclCommGetAsyncError while it says ncclInProgress; returns what it settles on and
// how many polls said ncclInProgress.
ncclResult_t settle(ncclComm_t c, int* polls = nullptr) {
    ncclResult_t state = ncclInProgress;
    int n = 0;
    while (state == ncclInProgress) {
        if (ncclCommGetAsyncError(c, &state) != ncclSuccess) FAIL("ncclCommGetAsyncError failed");
        if (state == ncclInProgress) ++n;
    }
    if (polls != nullptr) *polls = n;
    return state;
}

// Non-blocking communicators of `n` ranks on devices `device(r)`, each made on a thread of
// its own; `body(rank, comm)` runs there once init has settled successfully.
template <class Device, class Body>
void with_comms(int n, Device device, Body body) {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; ++r) {
        ranks.emplace_back([&, r] {
            REQUIRE(cudaSetDevice(device(r)) == cudaSuccess);
            ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
            config.blocking = 0;
            ncclComm_t c = nullptr;
            REQUIRE(ncclCommInitRankConfig(&c, n, id, r, &config) == ncclInProgress);
            body(r, c, settle(c));
        });
    }
    for (auto& t : ranks) t.join();
}

}  // namespace

TEST_CASE("a stream runs its work in order, after a stall ends, and events wait for it") {
    cudaStream_t s;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamDefault) == cudaSuccess);
    int* d = nullptr;
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(int)) == cudaSuccess);
    int one = 1, two = 2, got = 0;
    auto* g = corocoll_sim::hold(s);
    REQUIRE(cudaMemcpyAsync(d, &one, sizeof(int), cudaMemcpyHostToDevice, s) == cudaSuccess);
    cudaEvent_t e;
    REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    CHECK(cudaEventQuery(e) == cudaSuccess);  // never recorded
    REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(d, &two, sizeof(int), cudaMemcpyHostToDevice, s) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(&got, d, sizeof(int), cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(corocoll_sim::pending(s) == 4);
    CHECK(cudaEventQuery(e) == cudaErrorNotReady);
    CHECK(cudaGetLastError() == cudaSuccess);  // not ready is no error
    CHECK(got == 0);
    corocoll_sim::release(g);
    REQUIRE(cudaEventSynchronize(e) == cudaSuccess);
    CHECK(cudaEventQuery(e) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(got == 2);
    CHECK(corocoll_sim::pending(s) == 0);
    cudaEventDestroy(e);
    cudaFree(d);
    cudaStreamDestroy(s);
}

TEST_CASE("an ordinary stream waits for the legacy default stream; a non-blocking one does not") {
    cudaStream_t ordinary, nonblocking;
    REQUIRE(cudaStreamCreateWithFlags(&ordinary, cudaStreamDefault) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking) == cudaSuccess);
    int* d = nullptr;
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(int)) == cudaSuccess);
    int x = 7;
    auto* g = corocoll_sim::hold(nullptr);
    REQUIRE(cudaMemcpyAsync(d, &x, sizeof(int), cudaMemcpyHostToDevice, nonblocking) ==
            cudaSuccess);
    REQUIRE(cudaStreamSynchronize(nonblocking) == cudaSuccess);  // not held up
    REQUIRE(cudaMemcpyAsync(d, &x, sizeof(int), cudaMemcpyHostToDevice, ordinary) == cudaSuccess);
    cudaEvent_t e;
    REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    REQUIRE(cudaEventRecord(e, ordinary) == cudaSuccess);
    CHECK(cudaEventQuery(e) == cudaErrorNotReady);
    corocoll_sim::release(g);
    REQUIRE(cudaEventSynchronize(e) == cudaSuccess);
    cudaEventDestroy(e);
    cudaFree(d);
    cudaStreamDestroy(ordinary);
    cudaStreamDestroy(nonblocking);
}

TEST_CASE("the current device is per thread; an event records only on a stream of its device") {
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    cudaStream_t s1;
    REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamDefault) == cudaSuccess);
    int other = -1;
    std::thread([&] { cudaGetDevice(&other); }).join();
    CHECK(other == 0);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    cudaEvent_t e0;
    REQUIRE(cudaEventCreateWithFlags(&e0, cudaEventDisableTiming) == cudaSuccess);
    CHECK(cudaEventRecord(e0, s1) == cudaErrorInvalidResourceHandle);
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    CHECK(cudaSetDevice(99) == cudaErrorInvalidDevice);
    cudaEventDestroy(e0);
    cudaStreamDestroy(s1);
}

TEST_CASE("a host access to a device pointer dies with SIGSEGV; copies name the direction") {
    int* d = nullptr;
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), 4 * sizeof(int)) == cudaSuccess);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        std::signal(SIGSEGV, SIG_DFL);  // doctest's handler would report and go on
        volatile int* p = d;
        p[1] = 42;  // the host must not touch device memory
        ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGSEGV);
    int h[4] = {1, 2, 3, 4};
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    CHECK(cudaMemcpy(d, h, sizeof h + 1, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    REQUIRE(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice) == cudaSuccess);
    int back[4] = {};
    REQUIRE(cudaMemcpy(back, d, sizeof back, cudaMemcpyDefault) == cudaSuccess);
    CHECK(std::memcmp(back, h, sizeof h) == 0);
    (void)cudaGetLastError();
    cudaFree(d);
}

TEST_CASE("non-blocking init stays in progress until every rank has joined, then computes") {
    corocoll_sim::set_in_progress_polls(3);
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t c0 = nullptr;
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    REQUIRE(ncclCommInitRankConfig(&c0, 2, id, 0, &config) == ncclInProgress);
    ncclResult_t state = ncclSuccess;
    for (int i = 0; i < 10; ++i) {  // rank 1 has not joined: never ready
        REQUIRE(ncclCommGetAsyncError(c0, &state) == ncclSuccess);
        CHECK(state == ncclInProgress);
    }
    std::thread rank1([&] {
        REQUIRE(cudaSetDevice(1) == cudaSuccess);
        ncclComm_t c1 = nullptr;
        REQUIRE(ncclCommInitRankConfig(&c1, 2, id, 1, &config) == ncclInProgress);
        int polls = 0;
        CHECK(settle(c1, &polls) == ncclSuccess);
        CHECK(polls == 3);
        float* d = nullptr;
        REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), 2 * sizeof(float)) == cudaSuccess);
        float h[2] = {10, 20};
        cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
        CHECK(ncclAllReduce(d, d, 2, ncclFloat32, ncclSum, c1, nullptr) == ncclInProgress);
        CHECK(settle(c1) == ncclSuccess);
        cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);  // after the legacy stream's work
        CHECK(h[0] == 11);
        CHECK(h[1] == 22);
        REQUIRE(ncclCommFinalize(c1) == ncclInProgress);
        CHECK(settle(c1) == ncclSuccess);
        CHECK(ncclCommDestroy(c1) == ncclSuccess);
        cudaFree(d);
    });
    CHECK(settle(c0) == ncclSuccess);
    float* d = nullptr;
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), 2 * sizeof(float)) == cudaSuccess);
    float h[2] = {1, 2};
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
    CHECK(ncclAllReduce(d, d, 2, ncclFloat32, ncclSum, c0, nullptr) == ncclInProgress);
    // A call before the last one settled: refused, and the error stays (ncclCommEnsureReady).
    CHECK(ncclAllReduce(d, d, 2, ncclFloat32, ncclSum, c0, nullptr) == ncclInvalidArgument);
    CHECK(std::string(ncclGetLastError(c0)).find("before the previous operation") !=
          std::string::npos);
    CHECK(settle(c0) == ncclInvalidArgument);
    rank1.join();
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h[0] == 11);
    CHECK(h[1] == 22);
    CHECK(ncclCommAbort(c0) == ncclSuccess);
    cudaFree(d);
    corocoll_sim::set_in_progress_polls(1);
}

TEST_CASE("an injected async error: the failing rank sees it, its peers a remote error") {
    corocoll_sim::inject({corocoll_sim::fault_kind::async_error, 1, 1});
    with_comms(
        3, [](int r) { return r; },
        [](int r, ncclComm_t c, ncclResult_t init) {
            REQUIRE(init == ncclSuccess);
            cudaStream_t s;
            REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamDefault) == cudaSuccess);
            int* d = nullptr;
            REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(int)) == cudaSuccess);
            // Launch 0 succeeds; launch 1 fails on rank 1.
            REQUIRE(ncclAllReduce(d, d, 1, ncclInt32, ncclSum, c, s) == ncclInProgress);
            REQUIRE(settle(c) == ncclSuccess);
            REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
            REQUIRE(ncclAllReduce(d, d, 1, ncclInt32, ncclSum, c, s) == ncclInProgress);
            cudaEvent_t e;
            REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
            REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
            ncclResult_t state = ncclInProgress;
            while (state == ncclInProgress || state == ncclSuccess) {
                if (ncclCommGetAsyncError(c, &state) != ncclSuccess) FAIL("ncclCommGetAsyncError");
            }
            CHECK(state == (r == 1 ? ncclSystemError : ncclRemoteError));
            CHECK(cudaEventQuery(e) == cudaErrorNotReady);  // the kernel spins until abort
            CHECK(ncclCommAbort(c) == ncclSuccess);
            CHECK(cudaEventSynchronize(e) == cudaSuccess);
            cudaEventDestroy(e);
            cudaFree(d);
            cudaStreamDestroy(s);
        });
    corocoll_sim::clear_faults();
    CHECK(std::string(ncclGetLastError(nullptr)).find("injected failure of AllReduce") !=
          std::string::npos);
}

TEST_CASE("two ranks on one device: Duplicate GPU detected, ncclInvalidUsage on both") {
    with_comms(
        2, [](int) { return 2; },
        [](int, ncclComm_t c, ncclResult_t init) {
            CHECK(init == ncclInvalidUsage);
            CHECK(std::string(ncclGetLastError(c)).find("Duplicate GPU detected : rank") !=
                  std::string::npos);
            ncclCommAbort(c);
        });
}

TEST_CASE("NCCL's argument checks: fp8 reductions below sm90, a host buffer, another device") {
    corocoll_sim::set_compute_capability(1, 8, 0);
    with_comms(
        2, [](int r) { return r; },
        [](int r, ncclComm_t c, ncclResult_t init) {
            REQUIRE(init == ncclSuccess);
            void* d = nullptr;
            REQUIRE(cudaMalloc(&d, 64) == cudaSuccess);
            // The lowest capability of the communicator counts, on every rank.
            CHECK(ncclAllReduce(d, d, 4, ncclFloat8e4m3, ncclSum, c, nullptr) ==
                  ncclInvalidArgument);
            CHECK(std::string(ncclGetLastError(c)).find("FP8 reduction") != std::string::npos);
            CHECK(settle(c) == ncclInvalidArgument);  // kept on a non-blocking communicator
            CHECK(ncclBroadcast(d, d, 4, ncclFloat8e4m3, 0, c, nullptr) == ncclInvalidArgument);
            ncclCommAbort(c);
            cudaFree(d);
            (void)r;
        });
    corocoll_sim::set_compute_capability(1, 9, 0);
    with_comms(
        1, [](int) { return 0; },
        [](int, ncclComm_t c, ncclResult_t init) {
            REQUIRE(init == ncclSuccess);
            int host[4] = {};
            CHECK(ncclAllReduce(host, host, 4, ncclInt32, ncclSum, c, nullptr) ==
                  ncclInvalidArgument);
            CHECK(std::string(ncclGetLastError(c)).find("is not a valid pointer") !=
                  std::string::npos);
            ncclCommAbort(c);
        });
    with_comms(
        1, [](int) { return 0; },
        [](int, ncclComm_t c, ncclResult_t init) {
            REQUIRE(init == ncclSuccess);
            cudaSetDevice(3);
            void* d = nullptr;
            REQUIRE(cudaMalloc(&d, 16) == cudaSuccess);
            cudaSetDevice(0);
            CHECK(ncclAllReduce(d, d, 4, ncclInt32, ncclSum, c, nullptr) == ncclInvalidArgument);
            CHECK(std::string(ncclGetLastError(c)).find("allocated on device 3") !=
                  std::string::npos);
            ncclCommAbort(c);
            cudaFree(d);
        });
}

TEST_CASE("send and recv that must progress together hang unless grouped") {
    with_comms(
        2, [](int r) { return r; },
        [](int r, ncclComm_t c, ncclResult_t init) {
            REQUIRE(init == ncclSuccess);
            cudaStream_t s;
            REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamDefault) == cudaSuccess);
            int* out = nullptr;
            int* in = nullptr;
            REQUIRE(cudaMalloc(reinterpret_cast<void**>(&out), sizeof(int)) == cudaSuccess);
            REQUIRE(cudaMalloc(reinterpret_cast<void**>(&in), sizeof(int)) == cudaSuccess);
            int v = 100 + r;
            cudaMemcpy(out, &v, sizeof v, cudaMemcpyHostToDevice);
            int peer = 1 - r;
            REQUIRE(ncclGroupStart() == ncclSuccess);
            REQUIRE(ncclSend(out, 1, ncclInt32, peer, c, s) == ncclSuccess);
            REQUIRE(ncclRecv(in, 1, ncclInt32, peer, c, s) == ncclSuccess);
            REQUIRE(ncclGroupEnd() == ncclInProgress);
            REQUIRE(settle(c) == ncclSuccess);
            REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
            int got = 0;
            cudaMemcpy(&got, in, sizeof got, cudaMemcpyDeviceToHost);
            CHECK(got == 100 + peer);
            // Ungrouped, each rank's send waits for a receive queued behind it: a hang.
            REQUIRE(ncclSend(out, 1, ncclInt32, peer, c, s) == ncclInProgress);
            REQUIRE(settle(c) == ncclSuccess);
            REQUIRE(ncclRecv(in, 1, ncclInt32, peer, c, s) == ncclInProgress);
            REQUIRE(settle(c) == ncclSuccess);
            cudaEvent_t e;
            REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
            REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            CHECK(cudaEventQuery(e) == cudaErrorNotReady);
            CHECK(corocoll_sim::pending(s) == 2);
            ncclCommAbort(c);
            CHECK(cudaEventSynchronize(e) == cudaSuccess);
            cudaEventDestroy(e);
            cudaFree(out);
            cudaFree(in);
            cudaStreamDestroy(s);
        });
}
