#pragma once

// The torch backend, part 6 of 7: work's members that need the group.
// A private header of backend.cpp, the backend's one translation unit, which includes it after
// torch's and corocoll's headers and the parts before it.

namespace corocoll_torch {

inline void work::submit(group& g) {
    group_ = &g;
    // The progress thread holds a reference until the operation has completed.
    c10::raw::intrusive_ptr::incref(this);
    run_ = [](cc::detail::work_item* item) noexcept {
        auto* self = static_cast<work*>(item);
        drive(self, self->group_);
    };
    g.progress().submit(*this, false);
}

inline detached work::drive(work* self, group* g) {
    int source = -1;
    std::exception_ptr error;
    try {
        source = co_await self->run(g->pg());
        self->finish_outputs();
    } catch (...) {
        error = std::current_exception();
    }
    self->complete(source, error);
    c10::raw::intrusive_ptr::decref(self);
}

inline void work::complete(int source, std::exception_ptr e) {
    c10::intrusive_ptr<c10::ivalue::Future> f;
    {
        std::lock_guard lock(mutex_);
        source_ = source;
        exception_ = e;
        completed_ = true;
        f = future_;
    }
    done_.store(true, std::memory_order_release);
    cv_.notify_all();
    group_->progress().finished(eager_);
    if (f) {
        // Callbacks chained on the future run on the callbacks thread, never on the reactor.
        struct item : cc::detail::work_item {
            work* self;
            c10::intrusive_ptr<c10::ivalue::Future> f;
        };
        auto* it = new item;
        it->self = this;
        it->f = std::move(f);
        c10::raw::intrusive_ptr::incref(this);
        it->run_ = [](cc::detail::work_item* i) noexcept {
            std::unique_ptr<item> owned(static_cast<item*>(i));
            owned->self->complete_future(owned->f);
            c10::raw::intrusive_ptr::decref(owned->self);
        };
        group_->callbacks().submit(*it);
    }
}

inline void work::complete_future(c10::intrusive_ptr<c10::ivalue::Future> f) {
    std::exception_ptr e;
    {
        std::lock_guard lock(mutex_);
        e = exception_;
    }
    try {
        if (e) {
            f->setError(e);
        } else {
            f->markCompleted(c10::IValue(outputs_));
        }
    } catch (...) {
        // A callback that throws is the future's business; nothing to do here.
    }
}

inline c10::intrusive_ptr<c10::ivalue::Future> work::getFuture() {
    c10::intrusive_ptr<c10::ivalue::Future> f;
    bool finished = false;
    {
        std::lock_guard lock(mutex_);
        if (future_) return future_;
        future_ =
            c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
        f = future_;
        finished = completed_;
    }
    // A future's user waits on the future, not on this Work: nobody would drive it.
    if (!finished) group_->progress().make_eager(eager_, done_);
    // Completed before anyone asked: the future is completed here, once.
    if (finished) complete_future(f);
    return f;
}

inline void work::drive_until_done() { group_->progress().drive_until(done_); }

// A wait with a timeout sleeps; the progress thread drives the operation meanwhile.
inline bool work::wait_for(milliseconds timeout) {
    group_->progress().make_eager(eager_, done_);
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [this] { return completed_; });
}

}  // namespace corocoll_torch
