// corocoll_torch._C: the torch.distributed backend "corocoll" (torch 2.x's c10d::Backend API,
// or torch 1.13's c10d::ProcessGroup API) on top of corocoll's public API. One translation unit:
// torch's headers are slow to compile. Its parts are private headers beside it, one per job
// (store.hpp: torch's store as corocoll's; threads.hpp: who drives the reactor; tensors.hpp;
// work.hpp: torch's Work; group.hpp: the ProcessGroup; work_members.hpp), and the module is at the
// end of this file. See docs/architecture.md, "The torch backend".
//
// Threads of one group: the caller's (Python's) thread checks the arguments, makes a `Work`
// and starts it on the group's reactor itself when no other thread drives it; a caller that
// waits drives the reactor itself until its Work completes (`progress_thread`, a baton
// between threads). The group's progress thread drives it only for what nobody waits for.
// Blocking calls on torch's c10d::Store run on a third thread (the store thread) through
// `co_await offload`, so set-up never blocks the reactor. Futures (`Work::getFuture`, which
// DDP uses) are completed on a fourth thread, so that callbacks chained with `then` never run
// on the reactor.

#include <torch/csrc/utils/pybind.h>
// torch 2.x hands a backend (c10d::Backend) to the ProcessGroup it makes; torch 1.13 takes a
// ProcessGroup. COROCOLL_TORCH2 picks the torch glue; everything else is shared.
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#elif __has_include(<torch/version.h>)
#include <torch/version.h>
#elif __has_include(<torch/csrc/api/include/torch/version.h>)
#include <torch/csrc/api/include/torch/version.h>
#endif
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
#define COROCOLL_TORCH2 1
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#define COROCOLL_TORCH2 0
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <pybind11/chrono.h>

#include <corocoll/corocoll.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cc = corocoll;
namespace py = pybind11;

namespace corocoll_torch {

using std::chrono::milliseconds;

}  // namespace corocoll_torch

// The parts, in the order each needs the ones before it (not sorted).
// clang-format off
#include "store.hpp"
#include "threads.hpp"
#include "tensors.hpp"
#include "work.hpp"
#include "group.hpp"
#include "work_members.hpp"
// clang-format on

namespace corocoll_torch {

// ---------------------------------------------------------------------------------------------
// The module
// ---------------------------------------------------------------------------------------------

/// Shuts every group of this process down (`group::shutdown`): what the module runs as the
/// process exits, so that no rank leaves while its peers still need it. The GIL is released
/// first: a thread that drops a group meanwhile waits for the registry, not for the GIL.
void close_all() {
    without_gil released;
    std::lock_guard lock(registry().m);
    for (group* g : registry().groups) g->shutdown();
}

c10::intrusive_ptr<torch_group_base> create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, std::chrono::duration<float> timeout) {
    if (size < 1 || rank < 0 || rank >= size) {
        throw std::invalid_argument("corocoll backend: rank " + std::to_string(rank) +
                                    " is outside [0, world_size=" + std::to_string(size) + ")");
    }
    auto ms = std::chrono::duration_cast<milliseconds>(timeout);
    if (ms <= milliseconds(0)) ms = cc::detail::default_timeout();
    auto g = c10::make_intrusive<group>(store, rank, size, ms);
    register_group(g.get());
    return g;
}

/// The corocoll group behind a torch process group; a clear error for another backend's.
group& ours(const c10::intrusive_ptr<torch_group_base>& pg, const char* call) {
    auto* g = dynamic_cast<group*>(pg.get());
    if (g == nullptr) {
        throw std::invalid_argument(std::string("corocoll_torch.") + call +
                                    ": the group's backend is '" + pg->getBackendName() +
                                    "', not corocoll");
    }
    return *g;
}

/// `group::failure` as Python sees it: None, or a dict of cause, rank, failed_ranks and what.
py::object failure_of(const c10::intrusive_ptr<torch_group_base>& pg) {
    auto f = ours(pg, "failure").failure();
    if (!f) return py::none();
    static constexpr const char* causes[] = {"blamed", "rank_failed", "revoked", "closed"};
    py::dict d;
    d["cause"] = causes[static_cast<int>(f->cause) & 3];
    d["rank"] = f->rank;
    d["failed_ranks"] = f->failed_ranks;
    d["what"] = f->what;
    return d;
}

}  // namespace corocoll_torch

PYBIND11_MODULE(_C, m) {
    m.doc() = "corocoll's torch.distributed backend (import corocoll_torch registers it)";
    m.def("create_process_group", &corocoll_torch::create, py::arg("store"), py::arg("rank"),
          py::arg("world_size"), py::arg("timeout"),
          "Builds a corocoll process group on torch's store (the backend's factory)");
    m.def(
        "abort",
        [](const c10::intrusive_ptr<corocoll_torch::torch_group_base>& pg,
           const std::string& reason) { corocoll_torch::ours(pg, "abort").abort(reason); },
        py::arg("group"), py::arg("reason") = "",
        "Revokes the group (every Work in flight here and on every live peer fails, naming "
        "this rank and the reason), then closes it without waiting for the peers; from any "
        "thread");
    m.def(
        "shrink",
        [](const c10::intrusive_ptr<corocoll_torch::torch_group_base>& pg,
           std::chrono::milliseconds window) {
            auto [made, ranks] = corocoll_torch::ours(pg, "shrink").shrink(window);
            return std::pair<c10::intrusive_ptr<corocoll_torch::torch_group_base>,
                             std::vector<int>>(std::move(made), std::move(ranks));
        },
        py::arg("group"), py::arg("join_window"),
        "The group of the group's live ranks (every live rank calls it) and, for each of its "
        "ranks, that rank's rank in `group`");
    m.def(
        "grow",
        [](const c10::intrusive_ptr<corocoll_torch::torch_group_base>& pg, int new_size,
           std::chrono::milliseconds window)
            -> c10::intrusive_ptr<corocoll_torch::torch_group_base> {
            return corocoll_torch::ours(pg, "grow").grow(new_size, window);
        },
        py::arg("group"), py::arg("new_size"), py::arg("join_window"),
        "The group grown to new_size ranks with the processes that joined (every rank of the "
        "group calls it); its ranks keep their numbers, the joiners come after them");
    m.def(
        "join",
        [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
           std::chrono::milliseconds timeout)
            -> c10::intrusive_ptr<corocoll_torch::torch_group_base> {
            return corocoll_torch::group::join(store, rank, world_size, timeout);
        },
        py::arg("store"), py::arg("rank"), py::arg("world_size"), py::arg("timeout"),
        "Waits until the ranks of the groups set up on torch's store (the default group's) "
        "grow, and returns this process's place in the grown group");
    m.def("failure", &corocoll_torch::failure_of, py::arg("group"),
          "None while the group is sound, else a dict: cause ('rank_failed', 'blamed', "
          "'revoked', 'closed'), rank, failed_ranks, what");
    m.def("close_all", &corocoll_torch::close_all,
          "Closes every corocoll group of this process, each first waiting (up to its timeout, "
          "at most 60 s) until its live peers have closed theirs: run as the process exits");
}
