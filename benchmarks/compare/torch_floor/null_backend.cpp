// torch_floor._null: a torch.distributed backend that does nothing. Every operation returns a
// Work that is already complete, so a call on it costs what torch itself costs: the Python
// wrapper, the argument checks, the dispatcher, the Work handed back to Python. torch_overhead.py
// times the same calls on it and on corocoll, one rank each, and reports the difference: what
// the corocoll backend adds between torch's call and its reactor. Built with the torch backend
// (benchmarks/meson.build); never a backend for real work: it moves no data.

#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <pybind11/chrono.h>

#include <chrono>
#include <string>
#include <vector>

namespace {

class done_work final : public c10d::Work {
public:
    done_work(int rank, c10d::OpType type) : c10d::Work(rank, type) {}
    bool isCompleted() override { return true; }
    bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
};

class null_group final : public c10d::ProcessGroup {
public:
    null_group(int rank, int size) : c10d::ProcessGroup(rank, size) {}

    const std::string getBackendName() const override { return "null"; }

    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& /*tensors*/,
                                             const c10d::AllreduceOptions& /*opts*/) override {
        return done(c10d::OpType::ALLREDUCE);
    }
    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& /*tensors*/,
                                             const c10d::BroadcastOptions& /*opts*/) override {
        return done(c10d::OpType::BROADCAST);
    }
    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& /*outputs*/,
                                             std::vector<at::Tensor>& /*inputs*/,
                                             const c10d::AllgatherOptions& /*opts*/) override {
        return done(c10d::OpType::ALLGATHER);
    }
    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override {
        return done(c10d::OpType::BARRIER);
    }

private:
    c10::intrusive_ptr<c10d::Work> done(c10d::OpType type) {
        return c10::make_intrusive<done_work>(getRank(), type);
    }
};

}  // namespace

PYBIND11_MODULE(_null, m) {
    py::object base = py::module::import("torch.distributed").attr("ProcessGroup");
    py::class_<null_group, c10::intrusive_ptr<null_group>>(m, "NullGroup", base);
    m.def("create_process_group", [](const c10::intrusive_ptr<c10d::Store>& /*store*/, int rank,
                                     int size, std::chrono::milliseconds /*timeout*/) {
        return c10::make_intrusive<null_group>(rank, size);
    });
}
