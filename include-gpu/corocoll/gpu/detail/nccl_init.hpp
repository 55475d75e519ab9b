#pragma once

// The set-up of an NCCL group after the CPU rendezvous (<corocoll/gpu/nccl_group.hpp>'s
// `gpu::init_process_group`): the device of each rank, the check that no two ranks share
// one, NCCL's unique id passed through the store, and the non-blocking communicator's
// creation, polled by the reactor.

#include <corocoll/core/log.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/gpu/cuda.hpp>
#include <corocoll/gpu/detail/nccl_ops.hpp>
#include <corocoll/gpu/nccl.hpp>
#include <corocoll/gpu/wait.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/process_group/process_group.hpp>
#include <corocoll/rendezvous/launch_env.hpp>
#include <corocoll/rendezvous/prefix_store.hpp>
#include <corocoll/rendezvous/tcp_store.hpp>
#include <corocoll/version.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace gpu::detail {

inline std::string host_name() {
    char buf[256] = {};
    if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
    return buf;
}

/// Which host a GPU is on, as NCCL tells hosts apart (getHostHash, misc/utils.cc ≈ 74-110
/// at v2.28.9-1): NCCL_HOSTID if set, else the host name followed by the kernel's boot id,
/// so that containers with equal host names on different nodes differ.
inline std::string host_identity() {
    if (const char* id = std::getenv("NCCL_HOSTID")) return id;
    std::string out = host_name();
    if (std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
        char boot[64] = {};
        if (std::fscanf(f, "%63s", boot) == 1) out += boot;
        std::fclose(f);
    }
    return out;
}

/// The CUDA device of `rank`: `option` (nccl_options::device) if set, refused if this
/// process does not see it; else `local_rank` (else the rank) modulo the `count` devices
/// seen, so that a launcher that gives each rank one device (srun --gpus-per-task=1, or a
/// CUDA_VISIBLE_DEVICES per rank) works.
inline int pick_device(int rank, int local_rank, int option, int count) {
    using corocoll::detail::init_error;
    if (option < 0) return (local_rank >= 0 ? local_rank : rank) % count;
    if (option >= count) {
        const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
        throw std::invalid_argument(init_error(
            "rank " + std::to_string(rank) + " would use CUDA device " + std::to_string(option) +
            " (nccl_options::device) but this process sees " + std::to_string(count) +
            (visible != nullptr ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")"
                                : std::string())));
    }
    return option;
}

/// The lowest compute capability (major * 10 + minor) of a group's devices, and a rank that
/// has it.
struct lowest_capability {
    int value = 0;
    int rank = -1;
};

/// One rank's GPU as the others read it: where it is (`host`: NCCL's host identity, and its
/// PCI bus id), how to name it in an error (`shown`), and its compute capability.
struct rank_gpu {
    std::string host;
    std::string bus;
    std::string shown;
    int capability = 0;

    std::string encode() const {
        return host + "\n" + bus + "\n" + shown + "\n" + std::to_string(capability);
    }
    static rank_gpu decode(const std::string& s) {
        rank_gpu g;
        std::size_t a = s.find('\n'), b = s.find('\n', a + 1), c = s.find('\n', b + 1);
        if (a == std::string::npos || b == std::string::npos || c == std::string::npos) return g;
        g.host = s.substr(0, a);
        g.bus = s.substr(a + 1, b - a - 1);
        g.shown = s.substr(b + 1, c - b - 1);
        g.capability = std::atoi(s.c_str() + c + 1);
        return g;
    }
};

/// Publishes `mine` and reads every rank's: two ranks on one GPU (the same host identity and
/// PCI bus id, what NCCL compares before it fails init with "Duplicate GPU detected",
/// init.cc ≈ 904) fail here, both named, on every rank alike. Yields the group's lowest
/// compute capability. One set, one wait and `size` gets in the store.
inline task<lowest_capability> check_gpu_per_rank(rendezvous::prefix_store& store, int rank,
                                                  int size, const rank_gpu& mine,
                                                  std::chrono::milliseconds timeout) {
    using corocoll::detail::init_error;
    co_await store.set("nccl/device/" + std::to_string(rank), mine.encode());
    std::vector<std::string> keys;
    for (int p = 0; p < size; ++p) keys.push_back("nccl/device/" + std::to_string(p));
    co_await store.wait(keys, timeout);
    std::vector<rank_gpu> gpus;
    for (const auto& k : keys) gpus.push_back(rank_gpu::decode(co_await store.get(k)));
    lowest_capability lowest{gpus.front().capability, 0};
    for (int a = 0; a < size; ++a) {
        const auto& ga = gpus[static_cast<std::size_t>(a)];
        if (ga.capability < lowest.value) lowest = {ga.capability, a};
        for (int b = a + 1; b < size; ++b) {
            const auto& gb = gpus[static_cast<std::size_t>(b)];
            if (ga.host == gb.host && ga.bus == gb.bus) {
                throw std::invalid_argument(init_error(
                    "ranks " + std::to_string(a) + " and " + std::to_string(b) + " both use " +
                    ga.shown +
                    ": NCCL needs a GPU of its own per rank (start one rank per GPU, LOCAL_RANK "
                    "picks it), or use backend \"tcp\" with gpu::staged to share one GPU"));
            }
        }
    }
    co_return lowest;
}

/// NCCL's unique id of the group: rank 0 makes it (ncclGetUniqueId) and sets it in the
/// store; the others get it from there.
inline task<ncclUniqueId> share_unique_id(rendezvous::prefix_store& store, int rank) {
    using corocoll::detail::init_error;
    ncclUniqueId id{};
    if (rank == 0) {
        ncclResult_t rc = ncclGetUniqueId(&id);
        if (rc != ncclSuccess) {
            throw nccl_error(rc, init_error("rank 0: ncclGetUniqueId: " + describe_nccl(rc)));
        }
        co_await store.set("nccl/id", std::string(id.internal, sizeof(id.internal)));
    } else {
        std::string bytes = co_await store.get("nccl/id");
        if (bytes.size() != sizeof(id.internal)) {
            throw std::runtime_error(init_error("rank " + std::to_string(rank) +
                                                ": the NCCL id in the store has " +
                                                std::to_string(bytes.size()) + " bytes, not " +
                                                std::to_string(sizeof(id.internal))));
        }
        std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    co_return id;
}

/// A non-blocking communicator (`config.blocking = 0`) named `name`, its set-up polled by
/// the reactor (`comm_progress`) until ready, bounded by `timeout`; aborted if it fails.
/// `name` and `config` stay in this frame until then: NCCL may read them while it sets up.
inline task<ncclComm_t> init_comm(io::reactor& r, ncclUniqueId id, int rank, int size, int device,
                                  std::string name, std::chrono::milliseconds timeout) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = name.c_str();
    ncclComm_t comm = nullptr;
    ncclResult_t rc = ncclSuccess;
    {
        device_guard on(device);  // NCCL takes the current device (cudaGetDevice)
        rc = ncclCommInitRankConfig(&comm, size, id, rank, &config);
    }
    if (rc != ncclSuccess && rc != ncclInProgress) {
        if (comm != nullptr) (void)ncclCommAbort(comm);
        throw nccl_error(
            rc, corocoll::detail::init_error("rank " + std::to_string(rank) +
                                             ": ncclCommInitRankConfig: " + describe_nccl(rc)));
    }
    std::exception_ptr error;
    try {
        co_await until(r,
                       [comm](std::string& why) noexcept {
                           progress p = comm_progress(comm, why);
                           if (p == progress::failed) why = "ncclCommInitRankConfig: " + why;
                           return p;
                       },
                       io::deadline_after(timeout), {"init_process_group (nccl)", rank});
    } catch (...) {
        error = std::current_exception();
    }
    if (error) {
        (void)ncclCommAbort(comm);
        std::rethrow_exception(error);
    }
    co_return comm;
}

/// What `nccl_setup_for` set up. `comm` is ready; whoever holds this owns it (ncclCommAbort
/// if it cannot be handed on).
struct nccl_setup {
    int rank = -1;
    int size = -1;
    int device = -1;
    lowest_capability capability;
    ncclComm_t comm = nullptr;
    std::shared_ptr<rendezvous::prefix_store> store;
    std::shared_ptr<rendezvous::tcp_store_server> hosted;
};

/// The rendezvous of `corocoll::init_process_group` (bounded by `o.timeout`), then this
/// rank's device (`pick_device`, `device_option` being nccl_options::device) out of the
/// `count` seen, one GPU per rank, the unique id and the communicator.
inline task<nccl_setup> nccl_setup_for(io::reactor& r, init_options& o, int device_option,
                                       int count) {
    auto rv = co_await corocoll::detail::rendezvous_for(r, o);
    int local_rank = rv.local_rank;
    if (local_rank < 0 && device_option < 0) {
        // Rank and size were given (or a store): the launcher may still say the local rank.
        try {
            local_rank = rendezvous::read_launch_env().local_rank;
        } catch (const std::exception&) {
        }
    }
    int device = pick_device(rv.rank, local_rank, device_option, count);
    char bus[32] = {};
    check_cuda(cudaDeviceGetPCIBusId(bus, sizeof(bus), device),
               "init_process_group: cudaDeviceGetPCIBusId");
    int major = 0, minor = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
               "init_process_group: cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
               "init_process_group: cudaDeviceGetAttribute");
    rank_gpu mine{host_identity(), bus, host_name() + " GPU " + bus, major * 10 + minor};
    auto& store = *rv.group_store;
    auto lowest = co_await check_gpu_per_rank(store, rv.rank, rv.world_size, mine, o.timeout);
    ncclUniqueId id = co_await share_unique_id(store, rv.rank);
    ncclComm_t comm =
        co_await init_comm(r, id, rv.rank, rv.world_size, device, o.group_name, o.timeout);
    COROCOLL_LOG(info, "INIT", "nccl group '", o.group_name, "' ready: rank ", rv.rank, " of ",
                 rv.world_size, " on ", mine.shown);
    co_return nccl_setup{rv.rank,
                         rv.world_size,
                         device,
                         lowest,
                         comm,
                         std::move(rv.group_store),
                         std::move(rv.hosted)};
}

}  // namespace gpu::detail

COROCOLL_END_NAMESPACE
