#pragma once

// The torch backend, part 2 of 7: threads.
// A private header of backend.cpp, the backend's one translation unit, which includes it after
// torch's and corocoll's headers and the parts before it.

namespace corocoll_torch {

/// The group's reactor and who drives it. One thread at a time holds the baton and runs the
/// reactor: a caller that waits for its operation (`drive_until`), or else the progress thread.
/// A caller's thread thus makes the progress it waits for itself, with no hand-off to another
/// thread and no wake-up on either side (2 ranks on 2 processors: 4 such wake-ups per 4-byte
/// all_reduce cost most of its time). An operation starts on the caller's thread too
/// (`submit`) when nobody drives. The progress thread drives only what nobody waits for: at
/// once for operations marked eager (set-up, close, a Work whose future was taken, a wait
/// with a timeout), and otherwise at its next tick (every `tick`, while operations were
/// submitted in the last `idle_after`; it sleeps for good after that until woken).
class progress_thread {
public:
    progress_thread() {
        std::promise<cc::io::reactor*> ready;
        auto got = ready.get_future();
        thread_ = std::thread([this, &ready] {
            std::optional<cc::io::reactor> r;
            try {
                cc::io::reactor_options o;
                // Several threads submit to the ring (see io::reactor::borrowed).
                o.allowed_setup_flags = IORING_SETUP_SUBMIT_ALL;
                r.emplace(o);
            } catch (...) {
                ready.set_exception(std::current_exception());
                return;
            }
            ready.set_value(&*r);
            loop(*r);
        });
        try {
            reactor_ = got.get();
        } catch (...) {
            thread_.join();
            throw;
        }
        nudge_.run_ = [](cc::detail::work_item* item) noexcept {
            static_cast<nudge_item*>(item)->pending->store(false, std::memory_order_release);
        };
        nudge_.pending = &nudged_;
    }
    progress_thread(const progress_thread&) = delete;
    progress_thread& operator=(const progress_thread&) = delete;
    ~progress_thread() {
        {
            std::lock_guard lock(m_);
            stop_ = true;
            release_.store(true, std::memory_order_release);
            if (driver_ == driver::progress) nudge();
        }
        progress_cv_.notify_one();
        thread_.join();
    }

    cc::io::reactor& reactor() const noexcept { return *reactor_; }

    /// Starts an operation: `item` runs on the reactor, on this thread at once when nobody
    /// drives it and `eager` is false, else on the thread that drives. `finished(eager)` must
    /// follow, on the driving thread, when the operation is over.
    void submit(cc::detail::work_item& item, bool eager) {
        eager = eager || !may_drive();
        std::unique_lock lock(m_);
        ++active_;
        if (eager) ++eager_;
        recent_ = true;
        if (driver_ == driver::nobody && !eager) {
            driver_ = driver::caller;
            lock.unlock();
            {
                cc::io::reactor::borrowed here(*reactor_);
                item.run_(&item);
                // What the operation queued goes to the kernel now (the loop runs no turn).
                static const std::atomic<bool> no_turn{true};
                reactor_->run_until(no_turn);
            }
            lock.lock();
            hand_over();
            return;
        }
        reactor_->post(item);
        if (driver_ == driver::nobody) progress_cv_.notify_one();
    }

    /// The driving thread's report that an operation is over; `eager` is its flag.
    void finished(const bool& eager) {
        std::lock_guard lock(m_);
        --active_;
        if (eager) --eager_;
        // The progress thread drives only while nobody waits and there is something to do.
        if (active_ == 0 || waiters_ > 0) release_.store(true, std::memory_order_release);
        if (waiters_ > 0 || sleepers_ > 0) waiters_cv_.notify_all();
    }

    /// An operation nobody will drive by waiting (a future was taken, a wait with a
    /// timeout): from now on the progress thread drives it without delay. `eager` is the
    /// operation's flag (guarded here); `done` its completion.
    void make_eager(bool& eager, const std::atomic<bool>& done) {
        std::lock_guard lock(m_);
        if (eager || done.load(std::memory_order_acquire)) return;
        eager = true;
        ++eager_;
        if (driver_ == driver::nobody) progress_cv_.notify_one();
    }
    /// Runs the reactor on the calling thread until `done`, when no other thread drives it;
    /// else sleeps until that one finishes `done` or hands the reactor over. The progress
    /// thread, when it drives, is asked to hand over.
    void drive_until(const std::atomic<bool>& done) {
        if (!may_drive()) {
            wait_until(done);
            return;
        }
        std::unique_lock lock(m_);
        ++waiters_;
        while (!done.load(std::memory_order_acquire)) {
            if (driver_ == driver::nobody) {
                driver_ = driver::caller;
                --waiters_;
                lock.unlock();
                {
                    cc::io::reactor::borrowed here(*reactor_);
                    reactor_->run_until(done);
                }
                lock.lock();
                hand_over();
                return;
            }
            if (driver_ == driver::progress) {
                release_.store(true, std::memory_order_release);
                nudge();
            }
            waiters_cv_.wait(lock);
        }
        --waiters_;
    }

    /// Whether the calling thread may drive the reactor: the thread that made the group, the
    /// one that lives as long as it in the common case. The kernel cancels a thread's
    /// io_uring requests when the thread ends, and a driving thread submits some that stay in
    /// flight (the receives that watch connections): a thread that may end first must not.
    bool may_drive() const noexcept { return std::this_thread::get_id() == creator_; }

private:
    enum class driver { nobody, caller, progress };

    // For a thread that must not drive: the progress thread drives at once instead.
    void wait_until(const std::atomic<bool>& done) {
        std::unique_lock lock(m_);
        ++sleepers_;
        ++eager_;
        if (driver_ == driver::nobody) progress_cv_.notify_one();
        waiters_cv_.wait(lock, [&] { return done.load(std::memory_order_acquire); });
        --eager_;
        --sleepers_;
    }
    struct nudge_item : cc::detail::work_item {
        std::atomic<bool>* pending = nullptr;
    };

    // Wakes the reactor's loop (it then looks at `release_`); one nudge in the queue at most.
    void nudge() noexcept {
        if (!nudged_.exchange(true, std::memory_order_acq_rel)) reactor_->post(nudge_);
    }

    // A caller lets go of the reactor (the lock held): to a waiting caller, else to the
    // progress thread when something is left that must not wait for its tick.
    void hand_over() {
        driver_ = driver::nobody;
        if (waiters_ > 0) {
            waiters_cv_.notify_all();
        } else if (active_ > 0 && (eager_ > 0 || parked_)) {
            progress_cv_.notify_one();
        }
    }

    void loop(cc::io::reactor& r) {
        using clock = std::chrono::steady_clock;
        std::unique_lock lock(m_);
        auto last_recent = clock::now();
        while (!stop_) {
            bool undriven = active_ > 0 && driver_ == driver::nobody && waiters_ == 0;
            if (undriven && (eager_ > 0 || ticked_)) {
                driver_ = driver::progress;
                release_.store(false, std::memory_order_release);
                lock.unlock();
                r.run_until(release_);
                lock.lock();
                driver_ = driver::nobody;
                ticked_ = false;
                if (waiters_ > 0) waiters_cv_.notify_all();
                continue;
            }
            auto now = clock::now();
            if (recent_) {
                recent_ = false;
                last_recent = now;
            }
            if (active_ == 0 && now - last_recent > idle_after) {
                if (driver_ == driver::nobody && waiters_ == 0) {
                    // Idle: the loop still runs (asleep in the kernel until something comes),
                    // so that the readers answer a peer's status query (a rank whose program
                    // is busy elsewhere, in Python, is alive and must say so) and see a
                    // peer's goodbye or end. A caller that wants the reactor asks for it back
                    // (`drive_until`, through `release_`).
                    driver_ = driver::progress;
                    parked_ = true;
                    release_.store(false, std::memory_order_release);
                    lock.unlock();
                    r.run_until(release_);
                    lock.lock();
                    parked_ = false;
                    driver_ = driver::nobody;
                    if (waiters_ > 0) waiters_cv_.notify_all();
                    continue;
                }
                parked_ = true;
                progress_cv_.wait(lock);
                parked_ = false;
                continue;
            }
            ticked_ = progress_cv_.wait_for(lock, tick) == std::cv_status::timeout;
        }
    }

    static constexpr std::chrono::microseconds tick{1000};
    static constexpr std::chrono::milliseconds idle_after{100};

    std::mutex m_;
    std::condition_variable progress_cv_;
    std::condition_variable waiters_cv_;
    driver driver_ = driver::nobody;
    int active_ = 0;
    int eager_ = 0;
    int waiters_ = 0;   // callers that want to drive
    int sleepers_ = 0;  // callers that wait without driving (wait_until)
    bool recent_ = false;
    bool parked_ = false;
    bool ticked_ = false;
    bool stop_ = false;
    std::atomic<bool> release_{false};
    std::atomic<bool> nudged_{false};
    nudge_item nudge_;
    cc::io::reactor* reactor_ = nullptr;
    std::thread::id creator_ = std::this_thread::get_id();
    std::thread thread_;
};

/// A coroutine that starts at once and frees itself at its end (the ops' drivers).
struct detached {
    struct promise_type : cc::detail::pooled_frame {
        detached get_return_object() noexcept { return {}; }
        std::suspend_never initial_suspend() const noexcept { return {}; }
        std::suspend_never final_suspend() const noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { std::terminate(); }  // drivers catch everything
    };
};

/// Releases the GIL for a blocking wait when the calling thread holds it.
class without_gil {
public:
    without_gil() {
        if (Py_IsInitialized() && PyGILState_Check()) state_ = PyEval_SaveThread();
    }
    ~without_gil() {
        if (state_ != nullptr) PyEval_RestoreThread(state_);
    }
    without_gil(const without_gil&) = delete;
    without_gil& operator=(const without_gil&) = delete;

private:
    PyThreadState* state_ = nullptr;
};

}  // namespace corocoll_torch
