#pragma once

// The torch backend, part 4 of 7: work.
// A private header of backend.cpp, the backend's one translation unit, which includes it after
// torch's and corocoll's headers and the parts before it.

namespace corocoll_torch {

class group;

/// What an operation is, for its errors: `op` names it ("allreduce", "send to rank"), `peer`
/// is the rank a send or recv names (appended to `op`), else -1. Made into words only when
/// an error needs them, never per call.
struct op_label {
    op_label(const char* o, int p = -1) : op(o), peer(p) {}  // implicit: a name is a label
    const char* op;
    int peer;
};

/// What a corocoll operation returns to torch: completed once, from the progress thread,
/// with the corocoll error (its text unchanged) or success.
class work : public c10d::Work, public cc::detail::work_item {
public:
    work(int rank, int size, c10d::OpType type, op_label label, std::vector<at::Tensor> outputs)
        : c10d::Work(rank, type), label_(label), size_(size), outputs_(std::move(outputs)) {}

    bool isCompleted() override { return done_.load(std::memory_order_acquire); }

    int sourceRank() const override {
        std::lock_guard lock(mutex_);
        if (source_ < 0) {
            throw std::runtime_error("corocoll: " + what() +
                                     ": sourceRank() is only known after a recv from any source "
                                     "has completed");
        }
        return source_;
    }

    std::vector<at::Tensor> result() override { return outputs_; }

    /// Waits for the operation, with the GIL released; `timeout` 0: up to the group's timeout,
    /// which bounds every corocoll operation. Rethrows the operation's error.
    bool wait(milliseconds timeout) override {
        if (!done_.load(std::memory_order_acquire)) {
            without_gil released;
            if (timeout == ::kNoTimeout) {
                drive_until_done();
            } else if (!wait_for(timeout)) {
                throw std::runtime_error("corocoll: " + what() + ": wait(" +
                                         std::to_string(timeout.count()) +
                                         " ms) ended before the operation did; it goes on, "
                                         "bounded by the group's timeout");
            }
        }
        std::exception_ptr e;
        {
            std::lock_guard lock(mutex_);
            e = exception_;
        }
        if (e) std::rethrow_exception(e);
        return true;
    }

    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

    void abort() override {
        throw std::runtime_error("corocoll: " + what() +
                                 ": abort is not supported (destroy the group instead)");
    }

    /// Posts the operation to the progress thread of `g`.
    void submit(group& g);

protected:
    /// Runs the operation on the progress thread; yields the sender of a recv, else -1.
    virtual cc::task<int> run(cc::process_group& pg) = 0;
    /// After success, on the progress thread: copies results out of contiguous stand-ins.
    virtual void finish_outputs() {}

private:
    static detached drive(work* self, group* g);
    void complete(int source, std::exception_ptr e);
    void drive_until_done();
    bool wait_for(milliseconds timeout);
    void complete_future(c10::intrusive_ptr<c10::ivalue::Future> f);

    // "allreduce on rank 0 of 2": the operation, as its errors name it.
    std::string what() const;

    op_label label_;
    int size_;
    std::vector<at::Tensor> outputs_;
    std::atomic<bool> done_{false};
    int source_ = -1;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    group* group_ = nullptr;
    // Driven by the progress thread without delay (progress_thread::make_eager); guarded by
    // the progress thread's lock.
    bool eager_ = false;
};

/// A `work` whose operation is the lambda `Body(cc::process_group&) -> cc::task<int>`.
template <class Body>
class op_work final : public work {
public:
    op_work(int rank, int size, c10d::OpType type, op_label label, std::vector<at::Tensor> outputs,
            std::vector<tensor_arg> args, Body body)
        : work(rank, size, type, label, std::move(outputs)),
          args_(std::move(args)),
          body_(std::move(body)) {}

private:
    cc::task<int> run(cc::process_group& pg) override { return body_(pg); }
    void finish_outputs() override {
        for (auto& a : args_) a.write_back();
    }

    std::vector<tensor_arg> args_;
    Body body_;
};

inline std::string work::what() const {
    std::string s = label_.op;
    if (label_.peer >= 0) s += " " + std::to_string(label_.peer);
    return s + " on rank " + std::to_string(rank_) + " of " + std::to_string(size_);
}

#if COROCOLL_TORCH2
/// Several Works as one (torch 2.x's coalescing): complete when each is; `wait` waits for each
/// in turn and rethrows the first error; the future completes with every part's outputs, or
/// with the first error.
class joined_work final : public c10d::Work {
public:
    joined_work(int rank, c10d::OpType type, std::vector<c10::intrusive_ptr<c10d::Work>> parts)
        : c10d::Work(rank, type), parts_(std::move(parts)) {}

    bool isCompleted() override {
        return std::all_of(parts_.begin(), parts_.end(), [](auto& w) { return w->isCompleted(); });
    }

    std::vector<at::Tensor> result() override {
        std::vector<at::Tensor> all;
        for (auto& w : parts_) {
            for (auto& t : w->result()) all.push_back(t);
        }
        return all;
    }

    /// `timeout` bounds the wait for all the parts together (0: each up to the group's).
    bool wait(milliseconds timeout) override {
        auto deadline = std::chrono::steady_clock::now() + timeout;
        for (auto& w : parts_) {
            if (timeout == ::kNoTimeout) {
                w->wait(timeout);
                continue;
            }
            auto left =
                std::chrono::ceil<milliseconds>(deadline - std::chrono::steady_clock::now());
            w->wait(std::max(left, milliseconds(1)));  // past it: a part not done yet raises
        }
        return true;
    }

    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
        auto f =
            c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
        if (parts_.empty()) {
            f->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
            return f;
        }
        struct state {
            std::mutex m;
            std::size_t left;
            bool ended = false;
        };
        auto s = std::make_shared<state>();
        s->left = parts_.size();
        auto outputs = result();
        for (auto& w : parts_) {
            w->getFuture()->addCallback([f, s, outputs](c10::ivalue::Future& part) {
                std::lock_guard lock(s->m);
                if (s->ended) return;
                if (part.hasError()) {
                    s->ended = true;
                    f->setError(part.exception_ptr());
                } else if (--s->left == 0) {
                    s->ended = true;
                    f->markCompleted(c10::IValue(outputs));
                }
            });
        }
        return f;
    }

private:
    std::vector<c10::intrusive_ptr<c10d::Work>> parts_;
};
#endif

}  // namespace corocoll_torch
