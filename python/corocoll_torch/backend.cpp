// corocoll_torch._C: the torch.distributed backend "corocoll" (torch 1.13's c10d::ProcessGroup
// API) on top of corocoll's public API. One translation unit: torch's headers are slow to
// compile. See docs/architecture.md, "The torch backend".
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
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <pybind11/chrono.h>

#include <corocoll/corocoll.hpp>

#include <algorithm>
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

// ---------------------------------------------------------------------------------------------
// torch's c10d::Store as a corocoll store
// ---------------------------------------------------------------------------------------------

/// corocoll's store interface over the c10d::Store torch hands the backend (a PrefixStore over
/// a TCPStore, FileStore or HashStore). c10d's calls block (TCPStore's client serialises them
/// behind one lock anyway), so each runs on the store thread (`pool`, one worker) and the
/// reactor goes on meanwhile. c10d's errors become corocoll's: a wait that ends at its timeout
/// is `std::errc::timed_out` naming the keys, which set-up's roll call relies on.
class torch_store final : public cc::rendezvous::store {
public:
    torch_store(c10::intrusive_ptr<c10d::Store> s, cc::thread_pool& pool)
        : cc::rendezvous::store(s->getTimeout()), store_(std::move(s)), pool_(pool) {}

    cc::task<> set(std::string key, std::string value) override {
        co_await call("set", key, [&] { store_->set(key, to_vec(value)); });
    }
    cc::task<std::string> get(std::string key) override {
        auto wait = timeout();
        co_return co_await call("get", key, [&] {
            // c10d's get waits for the store's own timeout: ours is the one that counts.
            std::vector<std::string> keys{key};
            store_->wait(keys, at_least_1ms(wait));
            return to_str(store_->get(key));
        });
    }
    cc::task<std::int64_t> add(std::string key, std::int64_t delta) override {
        co_return co_await call("add", key, [&] { return store_->add(key, delta); });
    }
    cc::task<std::string> compare_set(std::string key, std::string expected,
                                      std::string desired) override {
        co_return co_await call("compare_set", key, [&] {
            return to_str(store_->compareSet(key, to_vec(expected), to_vec(desired)));
        });
    }
    cc::task<> wait(std::vector<std::string> keys, duration t) override {
        std::string names = cc::rendezvous::detail::join_keys(keys);
        auto start = std::chrono::steady_clock::now();
        try {
            co_await cc::offload(pool_, [&] { store_->wait(keys, at_least_1ms(t)); });
        } catch (const std::exception& e) {
            // c10d's timeouts are plain c10::Errors: the time spent tells them apart.
            if (std::chrono::steady_clock::now() - start >= t) {
                cc::detail::throw_error(std::make_error_code(std::errc::timed_out),
                                        "corocoll: torch store: wait for " + names +
                                            " timed out after " + std::to_string(t.count()) +
                                            " ms");
            }
            throw std::runtime_error("corocoll: torch store: wait for " + names + ": " +
                                     first_line(e.what()));
        }
    }
    cc::task<bool> check(std::vector<std::string> keys) override {
        co_return co_await call("check", cc::rendezvous::detail::join_keys(keys),
                                [&] { return store_->check(keys); });
    }
    cc::task<bool> delete_key(std::string key) override {
        co_return co_await call("delete_key", key, [&] { return store_->deleteKey(key); });
    }
    cc::task<std::int64_t> num_keys() override {
        co_return co_await call("num_keys", "", [&] { return store_->getNumKeys(); });
    }

    static std::string first_line(const char* what) {
        std::string s = what;
        auto nl = s.find('\n');
        return nl == std::string::npos ? s : s.substr(0, nl);
    }

private:
    static milliseconds at_least_1ms(milliseconds t) {
        // 0 means "no timeout" to c10d.
        return std::max(t, milliseconds(1));
    }
    static std::vector<std::uint8_t> to_vec(const std::string& s) {
        return std::vector<std::uint8_t>(s.begin(), s.end());
    }
    static std::string to_str(const std::vector<std::uint8_t>& v) {
        return std::string(v.begin(), v.end());
    }

    template <class F>
    auto call(const char* what, std::string keys, F fn) -> cc::task<decltype(fn())> {
        try {
            co_return co_await cc::offload(pool_, std::move(fn));
        } catch (const std::exception& e) {
            throw std::runtime_error(std::string("corocoll: torch store: ") + what + " '" + keys +
                                     "': " + first_line(e.what()));
        }
    }

    c10::intrusive_ptr<c10d::Store> store_;
    cc::thread_pool& pool_;
};

/// Where torch's store is served, when it is a TCPStore (under any number of PrefixStores):
/// the address the mesh listens on is chosen to reach it, as corocoll's own init does.
inline std::optional<cc::io::endpoint> store_master(c10::intrusive_ptr<c10d::Store> s) {
    while (auto* prefix = dynamic_cast<c10d::PrefixStore*>(s.get())) {
        s = prefix->getUnderlyingStore();
    }
    if (auto* tcp = dynamic_cast<c10d::TCPStore*>(s.get())) {
        try {
            return cc::io::endpoint::resolve(tcp->getHost(), tcp->getPort());
        } catch (const std::exception&) {
        }
    }
    return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Threads
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------------------------

/// Calls `f(T{})` with the corocoll element type of `t`; false when corocoll has none.
template <class F>
bool with_element(at::ScalarType t, F&& f) {
    switch (t) {
        case at::kChar:
            f(std::int8_t{});
            return true;
        case at::kByte:
            f(std::uint8_t{});
            return true;
        case at::kInt:
            f(std::int32_t{});
            return true;
        case at::kLong:
            f(std::int64_t{});
            return true;
        case at::kFloat:
            f(float{});
            return true;
        case at::kDouble:
            f(double{});
            return true;
        case at::kHalf:
            f(cc::float16{});
            return true;
        case at::kBFloat16:
            f(cc::bfloat16{});
            return true;
        default:
            return false;
    }
}

/// The elements of `t` as `T`: its dtype's type, or uint8 for the bytes of a dtype corocoll
/// has no type for.
template <class T>
std::span<T> span_of(const at::Tensor& t) {
    return {static_cast<T*>(t.data_ptr()), t.nbytes() / sizeof(T)};
}

/// Elements of `t` per element of the span the operation sees (1, or the element size of a
/// dtype that moves as bytes).
inline std::size_t raw_scale(const at::Tensor& t) {
    bool known = with_element(t.scalar_type(), [](auto) {});
    return known ? 1 : static_cast<std::size_t>(t.element_size());
}

/// A tensor an operation reads or writes, as corocoll sees it: `dense` is the tensor itself
/// when it is contiguous, else a contiguous copy whose contents go back into `user` when the
/// operation has succeeded (`write_back`, on the progress thread).
struct tensor_arg {
    at::Tensor user;
    at::Tensor dense;
    void write_back() {
        if (!dense.is_same(user)) user.copy_(dense);
    }
};

// ---------------------------------------------------------------------------------------------
// Work
// ---------------------------------------------------------------------------------------------

class group;

/// What a corocoll operation returns to torch: completed once, from the progress thread,
/// with the corocoll error (its text unchanged) or success.
class work : public c10d::Work, public cc::detail::work_item {
public:
    work(int rank, c10d::OpType type, std::string what, std::vector<at::Tensor> outputs)
        : c10d::Work(rank, type), what_(std::move(what)), outputs_(std::move(outputs)) {}

    bool isCompleted() override { return done_.load(std::memory_order_acquire); }

    int sourceRank() const override {
        std::lock_guard lock(mutex_);
        if (source_ < 0) {
            throw std::runtime_error("corocoll: " + what_ +
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
                throw std::runtime_error("corocoll: " + what_ + ": wait(" +
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
        throw std::runtime_error("corocoll: " + what_ +
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

    std::string what_;
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
    op_work(int rank, c10d::OpType type, std::string what, std::vector<at::Tensor> outputs,
            std::vector<tensor_arg> args, Body body)
        : work(rank, type, std::move(what), std::move(outputs)),
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

// ---------------------------------------------------------------------------------------------
// The process group
// ---------------------------------------------------------------------------------------------

class group;

/// The groups of this process that are alive, for `close_all`.
struct group_registry {
    std::mutex m;
    std::vector<group*> groups;
};
inline group_registry& registry() {
    static group_registry* r = new group_registry;  // never destroyed: groups may outlive statics
    return *r;
}
inline void register_group(group* g) {
    std::lock_guard lock(registry().m);
    registry().groups.push_back(g);
}
inline void unregister_group(group* g) {
    std::lock_guard lock(registry().m);
    std::erase(registry().groups, g);
}
void close_all();

/// The backend "corocoll": a c10d::ProcessGroup whose operations run on a corocoll
/// process_group on the group's own progress thread.
class group final : public c10d::ProcessGroup {
public:
    group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, milliseconds timeout)
        : c10d::ProcessGroup(rank, size), timeout_(timeout), store_pool_(1), callbacks_(1) {
        // Ranks of this host that outnumber its processors must not busy-poll plainly. One
        // thread per rank drives the reactor at a time (progress_thread), so a rank counts
        // once.
        if (const char* local = std::getenv("LOCAL_WORLD_SIZE")) {
            cc::io::reactor::set_local_processes(std::atoi(local));
        }
        adapter_ = std::make_shared<torch_store>(store, store_pool_);
        adapter_->set_timeout(timeout);
        master_ = store_master(store);
        // Set-up runs on the progress thread; this thread waits, without the GIL.
        struct setup_item : cc::detail::work_item {
            group* self;
            std::mutex m;
            std::condition_variable cv;
            bool done = false;
            bool eager = true;
            std::exception_ptr error;
        } item;
        item.self = this;
        item.run_ = [](cc::detail::work_item* i) noexcept {
            auto* s = static_cast<setup_item*>(i);
            [](setup_item* s) -> detached {
                std::exception_ptr error;
                try {
                    co_await s->self->set_up();
                } catch (...) {
                    error = std::current_exception();
                }
                s->self->progress_.finished(s->eager);
                std::lock_guard lock(s->m);
                s->error = error;
                s->done = true;
                s->cv.notify_all();
            }(s);
        };
        progress_.submit(item, true);
        {
            without_gil released;
            std::unique_lock lock(item.m);
            item.cv.wait(lock, [&] { return item.done; });
        }
        if (item.error) {
            // The progress thread must not outlive a half-built group: the destructors below
            // (progress_ first) stop it.
            std::rethrow_exception(item.error);
        }
    }

    ~group() override {
        unregister_group(this);
        shutdown();
    }

    /// Closes the group, first waiting (up to `linger()`) until every live peer has closed its
    /// own too: a rank whose program is done must not leave while a peer still needs it (rank
    /// 0's process serves torch's store, which a slower rank may still be polling in the
    /// store-based barrier at the end of init_process_group). Idempotent; operations after it
    /// fail, naming the closed group. Called by destroy_process_group (through the
    /// destructor) and, for every group still open, when the process exits (`close_all`).
    void shutdown() {
        without_gil released;
        std::lock_guard once(shutdown_m_);
        if (!pg_ || pg_->closed()) return;
        // Close on the progress thread, then let the thread go.
        struct close_item : cc::detail::work_item {
            group* self;
            std::mutex m;
            std::condition_variable cv;
            bool done = false;
            bool eager = true;
        } item;
        item.self = this;
        item.run_ = [](cc::detail::work_item* i) noexcept {
            auto* s = static_cast<close_item*>(i);
            [](close_item* s) -> detached {
                try {
                    co_await s->self->pg_->close_after_peers(s->self->linger());
                } catch (...) {
                }
                s->self->progress_.finished(s->eager);
                std::lock_guard lock(s->m);
                s->done = true;
                s->cv.notify_all();
            }(s);
        };
        progress_.submit(item, true);
        std::unique_lock lock(item.m);
        item.cv.wait(lock, [&] { return item.done; });
    }

    /// How long a close waits for the peers to close too: the group's timeout, at most 60 s
    /// (a peer that takes longer is stuck or still working, and this rank goes).
    milliseconds linger() const noexcept { return std::min<milliseconds>(timeout_, max_linger); }
    static constexpr milliseconds max_linger{60'000};

    const std::string getBackendName() const override { return "corocoll"; }

    progress_thread& progress() noexcept { return progress_; }
    cc::thread_pool& callbacks() noexcept { return callbacks_; }
    cc::process_group& pg() noexcept { return *pg_; }

    // ---- point-to-point ----

    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                        int tag) override {
        auto t = one_input("send", tensors);
        check_peer("send", dst);
        return start(c10d::OpType::SEND, "send to rank " + std::to_string(dst), {}, {},
                     [t, dst, tag](auto& pg) -> cc::task<int> {
                         co_await pg.send(bytes_of(t), dst, tag);
                         co_return -1;
                     });
    }

    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                        int tag) override {
        check_peer("recv", src);
        return receive(c10d::OpType::RECV, "recv from rank " + std::to_string(src), tensors, src,
                       tag);
    }

    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                                 int tag) override {
        return receive(c10d::OpType::RECVANYSOURCE, "recv from any source", tensors, cc::any_source,
                       tag);
    }

    // ---- collectives ----

    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
        return start(c10d::OpType::BARRIER, "barrier", {}, {}, [](auto& pg) -> cc::task<int> {
            co_await pg.barrier();
            co_return -1;
        });
    }

    void monitoredBarrier(const c10d::BarrierOptions& opts, bool /*wait_all_ranks*/) override {
        // corocoll's names every rank that did not arrive, as wait_all_ranks=True does.
        auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
        auto w = start(c10d::OpType::BARRIER, "monitored_barrier", {}, {},
                       [timeout](auto& pg) -> cc::task<int> {
                           co_await pg.monitored_barrier(timeout);
                           co_return -1;
                       });
        w->wait(::kNoTimeout);
    }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const c10d::BroadcastOptions& opts) override {
        auto a = one_inout("broadcast", tensors);
        int root = root_of("broadcast", opts.rootRank, opts.rootTensor);
        return typed(c10d::OpType::BROADCAST, "broadcast", a.dense, tensors, {a},
                     [root](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                         auto s = span_of<decltype(elem)>(t);
                         co_await pg.broadcast(s, root);
                         co_return -1;
                     });
    }

    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const c10d::AllreduceOptions& opts) override {
        if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse()) {
            return sparse_allreduce(tensors[0], opts.reduceOp);
        }
        auto a = one_inout("allreduce", tensors);
        auto op = op_of("allreduce", opts.reduceOp);
        return reducing(c10d::OpType::ALLREDUCE, "allreduce", a.dense, tensors, {a},
                        [op](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                            auto s = span_of<decltype(elem)>(t);
                            co_await pg.all_reduce(s, op);
                            co_return -1;
                        });
    }

    /// all_reduce of a sparse (COO) tensor, summed as Gloo sums one (embedding layers with
    /// sparse gradients need it): every rank's coalesced indices and values are gathered, each
    /// rank's padded to the largest count, and the entries of all ranks are laid end to end
    /// and summed by coalesce(). Three all_gathers: the counts, the indices, the values;
    /// bytes on the wire per rank: (size - 1) x the largest rank's entries.
    c10::intrusive_ptr<c10d::Work> sparse_allreduce(at::Tensor& t, const c10d::ReduceOp& op) {
        const char* what = "allreduce";
        if (!t.device().is_cpu()) {
            refuse(what,
                   "a tensor on " + t.device().str() + " (the corocoll backend takes CPU tensors)");
        }
        if (t.layout() != at::kSparse) refuse(what, "a sparse layout other than COO");
        if (op != c10d::ReduceOp::SUM) {
            refuse(what, "a sparse tensor with an op other than SUM (sparse tensors are summed)");
        }
        at::Tensor in = t.coalesce();
        std::int64_t nnz = in._nnz();
        // One row per entry: its indices, then its values (the dense dimensions flattened).
        at::Tensor indices = in._indices().t().contiguous();
        std::int64_t row = 1;
        for (std::int64_t d = in.sparse_dim(); d < in.dim(); ++d) row *= in.size(d);
        at::Tensor values = in._values().reshape({nnz, row}).contiguous();
        auto body = [t, in, indices, values, nnz, row](cc::process_group& pg) -> cc::task<int> {
            auto n = static_cast<std::int64_t>(pg.size());
            std::vector<std::int64_t> mine{nnz}, counts(static_cast<std::size_t>(n));
            co_await pg.all_gather_into(counts, mine);
            std::int64_t most = *std::max_element(counts.begin(), counts.end());
            auto sparse_dim = indices.size(1);
            at::Tensor my_idx = at::zeros({most, sparse_dim}, indices.options());
            at::Tensor my_val = at::zeros({most, row}, in._values().options());
            if (nnz > 0) {
                my_idx.narrow(0, 0, nnz).copy_(indices);
                my_val.narrow(0, 0, nnz).copy_(values);
            }
            at::Tensor all_idx = at::empty({n * most, sparse_dim}, indices.options());
            at::Tensor all_val = at::empty({n * most, row}, my_val.options());
            auto out_idx = span_of<std::uint8_t>(all_idx);
            auto out_val = span_of<std::uint8_t>(all_val);
            co_await pg.all_gather_into(out_idx, span_of<std::uint8_t>(my_idx));
            co_await pg.all_gather_into(out_val, span_of<std::uint8_t>(my_val));
            std::vector<at::Tensor> idx_parts, val_parts;
            for (std::int64_t r = 0; r < n; ++r) {
                idx_parts.push_back(all_idx.narrow(0, r * most, counts[r]));
                val_parts.push_back(all_val.narrow(0, r * most, counts[r]));
            }
            std::vector<std::int64_t> value_shape{-1};
            for (std::int64_t d = in.sparse_dim(); d < in.dim(); ++d) {
                value_shape.push_back(in.size(d));
            }
            at::Tensor sum = at::sparse_coo_tensor(at::cat(idx_parts).t(),
                                                   at::cat(val_parts).reshape(value_shape),
                                                   in.sizes(), in.options())
                                 .coalesce();
            at::Tensor out = t;
            out.copy_(sum);
            co_return -1;
        };
        return start(c10d::OpType::ALLREDUCE, what, {t}, {}, std::move(body));
    }

    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
        std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
        if (tensors.empty()) refuse("allreduce_coalesced", "an empty tensor list");
        for (auto& t : tensors) {
            check_cpu("allreduce_coalesced", t);
            if (t.scalar_type() != tensors[0].scalar_type()) {
                refuse("allreduce_coalesced", "tensors of different dtypes");
            }
        }
        auto op = op_of("allreduce_coalesced", opts.reduceOp);
        // One all_reduce over the tensors laid end to end; copied back on success.
        std::vector<at::Tensor> flat_parts;
        for (auto& t : tensors) flat_parts.push_back(t.reshape({-1}));
        at::Tensor flat = at::cat(flat_parts);
        std::vector<tensor_arg> back;
        std::int64_t at_elem = 0;
        for (auto& t : tensors) {
            back.push_back({t, flat.narrow(0, at_elem, t.numel()).view(t.sizes())});
            at_elem += t.numel();
        }
        return reducing(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", flat, tensors,
                        std::move(back),
                        [op](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                            auto s = span_of<decltype(elem)>(t);
                            co_await pg.all_reduce(s, op);
                            co_return -1;
                        });
    }

    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                          const c10d::ReduceOptions& opts) override {
        auto a = one_inout("reduce", tensors);
        auto op = op_of("reduce", opts.reduceOp);
        int root = root_of("reduce", opts.rootRank, opts.rootTensor);
        return reducing(c10d::OpType::REDUCE, "reduce", a.dense, tensors, {a},
                        [op, root](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                            auto s = span_of<decltype(elem)>(t);
                            co_await pg.reduce(s, root, op);
                            co_return -1;
                        });
    }

    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                   const c10d::AllgatherOptions&) override {
        check_cpu("_allgather_base", in);
        check_cpu("_allgather_base", out);
        same_dtype("_allgather_base", in, out);
        if (out.numel() != in.numel() * getSize()) {
            refuse("_allgather_base",
                   "an output of " + std::to_string(out.numel()) + " elements for an input of " +
                       std::to_string(in.numel()) + " on " + std::to_string(getSize()) +
                       " ranks (needs " + std::to_string(in.numel() * getSize()) + ")");
        }
        tensor_arg o = dense_arg(out);
        at::Tensor i = in.contiguous();
        std::vector<at::Tensor> outs{out};
        return typed(c10d::OpType::_ALLGATHER_BASE, "_allgather_base", i, outs, {o},
                     [o = o.dense](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                         using T = decltype(elem);
                         auto os = span_of<T>(o);
                         co_await pg.all_gather_into(os, span_of<T>(t));
                         co_return -1;
                     });
    }

    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const c10d::AllgatherOptions&) override {
        at::Tensor in = one_input("allgather", inputs);
        if (outputs.size() != 1) refuse("allgather", multi(outputs.size(), "output lists"));
        auto list = gathered_list("allgather", outputs[0], in);
        std::vector<at::Tensor> outs = outputs[0];
        return typed(c10d::OpType::ALLGATHER, "allgather", in, outs, std::move(list.back),
                     [flat = list.flat](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                         using T = decltype(elem);
                         auto os = span_of<T>(flat);
                         co_await pg.all_gather_into(os, span_of<T>(t));
                         co_return -1;
                     });
    }

    /// torch's all_gather_coalesced: `outputs[r][i]` gets rank r's `inputs[i]`. The inputs
    /// (one dtype, any shapes, the same on every rank) are laid end to end and go as one
    /// all_gather; each rank's block is then copied into its outputs.
    c10::intrusive_ptr<c10d::Work> allgather_coalesced(
        std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::AllgatherOptions&) override {
        const char* what = "allgather_coalesced";
        if (inputs.empty()) refuse(what, "an empty input list");
        for (auto& t : inputs) {
            check_cpu(what, t);
            same_dtype(what, inputs[0], t);
        }
        if (outputs.size() != static_cast<std::size_t>(getSize())) {
            refuse(what, std::to_string(outputs.size()) + " output lists in a group of " +
                             std::to_string(getSize()));
        }
        std::vector<at::Tensor> parts;
        std::int64_t total = 0;
        for (auto& t : inputs) {
            parts.push_back(t.reshape({-1}));
            total += t.numel();
        }
        at::Tensor in = at::cat(parts);
        at::Tensor flat = at::empty({total * getSize()}, in.options());
        std::vector<tensor_arg> back;
        std::vector<at::Tensor> outs;
        for (std::size_t r = 0; r < outputs.size(); ++r) {
            if (outputs[r].size() != inputs.size()) {
                refuse(what, "output list " + std::to_string(r) + " has " +
                                 std::to_string(outputs[r].size()) + " tensors, the input list " +
                                 std::to_string(inputs.size()));
            }
            std::int64_t at_elem = static_cast<std::int64_t>(r) * total;
            for (std::size_t i = 0; i < inputs.size(); ++i) {
                const at::Tensor& o = outputs[r][i];
                check_cpu(what, o);
                same_dtype(what, inputs[0], o);
                if (o.numel() != inputs[i].numel()) {
                    refuse(what, "output " + std::to_string(i) + " of rank " + std::to_string(r) +
                                     " has " + std::to_string(o.numel()) + " elements, input " +
                                     std::to_string(i) + " " + std::to_string(inputs[i].numel()));
                }
                back.push_back({o, flat.narrow(0, at_elem, o.numel()).view(o.sizes())});
                outs.push_back(o);
                at_elem += o.numel();
            }
        }
        return typed(c10d::OpType::ALLGATHER_COALESCED, what, in, outs, std::move(back),
                     [flat](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                         using T = decltype(elem);
                         auto os = span_of<T>(flat);
                         co_await pg.all_gather_into(os, span_of<T>(t));
                         co_return -1;
                     });
    }

    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::GatherOptions& opts) override {
        at::Tensor in = one_input("gather", inputs);
        int root = root_of("gather", opts.rootRank, 0);
        flat_list list;
        std::vector<at::Tensor> outs;
        if (getRank() == root) {
            if (outputs.size() != 1) refuse("gather", multi(outputs.size(), "output lists"));
            list = gathered_list("gather", outputs[0], in);
            outs = outputs[0];
        } else if (!outputs.empty()) {
            refuse("gather", "an output list on rank " + std::to_string(getRank()) +
                                 ", which is not the root (" + std::to_string(root) + ")");
        } else {
            list.flat = at::empty({0}, in.options());
        }
        return typed(
            c10d::OpType::GATHER, "gather", in, outs, std::move(list.back),
            [flat = list.flat, root](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                using T = decltype(elem);
                auto os = span_of<T>(flat);
                co_await pg.gather_into(span_of<T>(t), os, root);
                co_return -1;
            });
    }

    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const c10d::ScatterOptions& opts) override {
        auto a = one_inout("scatter", outputs);
        int root = root_of("scatter", opts.rootRank, 0);
        at::Tensor flat;
        if (getRank() == root) {
            if (inputs.size() != 1) refuse("scatter", multi(inputs.size(), "input lists"));
            flat = concat("scatter", inputs[0], a.dense);
        } else if (!inputs.empty()) {
            refuse("scatter", "an input list on rank " + std::to_string(getRank()) +
                                  ", which is not the root (" + std::to_string(root) + ")");
        } else {
            flat = at::empty({0}, a.dense.options());
        }
        return typed(c10d::OpType::SCATTER, "scatter", a.dense, outputs, {a},
                     [flat, root](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                         using T = decltype(elem);
                         auto os = span_of<T>(t);
                         co_await pg.scatter_from(os, span_of<T>(flat), root);
                         co_return -1;
                     });
    }

    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const c10d::ReduceScatterOptions& opts) override {
        auto a = one_inout("reduce_scatter", outputs);
        if (inputs.size() != 1) refuse("reduce_scatter", multi(inputs.size(), "input lists"));
        auto op = op_of("reduce_scatter", opts.reduceOp);
        at::Tensor flat = concat("reduce_scatter", inputs[0], a.dense);
        return reducing(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", a.dense, outputs, {a},
                        [flat, op](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                            using T = decltype(elem);
                            auto os = span_of<T>(t);
                            co_await pg.reduce_scatter_into(os, span_of<T>(flat), op);
                            co_return -1;
                        });
    }

    c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
        at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) override {
        check_cpu("_reduce_scatter_base", in);
        check_cpu("_reduce_scatter_base", out);
        same_dtype("_reduce_scatter_base", in, out);
        auto op = op_of("_reduce_scatter_base", opts.reduceOp);
        tensor_arg o = dense_arg(out);
        at::Tensor i = in.contiguous();
        std::vector<at::Tensor> outs{out};
        return reducing(c10d::OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", o.dense, outs,
                        {o}, [i, op](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                            using T = decltype(elem);
                            auto os = span_of<T>(t);
                            co_await pg.reduce_scatter_into(os, span_of<T>(i), op);
                            co_return -1;
                        });
    }

    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in,
                                                 std::vector<int64_t>& out_splits,
                                                 std::vector<int64_t>& in_splits,
                                                 const c10d::AllToAllOptions&) override {
        check_cpu("alltoall_base", in);
        check_cpu("alltoall_base", out);
        same_dtype("alltoall_base", in, out);
        // torch's splits count rows (the first dimension); corocoll's count elements.
        auto elements = [&](const char* name, const at::Tensor& t,
                            const std::vector<int64_t>& rows) {
            std::vector<std::size_t> out_counts;
            if (rows.empty()) return out_counts;
            if (rows.size() != static_cast<std::size_t>(getSize())) {
                refuse("alltoall_base", std::string(name) + " split sizes for " +
                                            std::to_string(rows.size()) + " ranks in a group of " +
                                            std::to_string(getSize()));
            }
            std::int64_t row = t.dim() == 0 || t.size(0) == 0 ? 0 : t.numel() / t.size(0);
            for (auto r : rows) {
                if (r < 0) refuse("alltoall_base", std::string("a negative ") + name + " split");
                out_counts.push_back(static_cast<std::size_t>(r * row) * raw_scale(t));
            }
            return out_counts;
        };
        auto os = elements("output", out, out_splits);
        auto is = elements("input", in, in_splits);
        if (os.empty() != is.empty()) {
            // One side even: spell it out, as torch does.
            auto even = [&](const at::Tensor& t) {
                std::vector<std::size_t> v(
                    static_cast<std::size_t>(getSize()),
                    static_cast<std::size_t>(t.numel() / getSize()) * raw_scale(t));
                return v;
            };
            if (os.empty()) os = even(out);
            if (is.empty()) is = even(in);
        }
        tensor_arg o = dense_arg(out);
        at::Tensor i = in.contiguous();
        std::vector<at::Tensor> outs{out};
        return typed(
            c10d::OpType::ALLTOALL_BASE, "alltoall_base", i, outs, {o},
            [o = o.dense, os, is](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                using T = decltype(elem);
                auto out_span = span_of<T>(o);
                co_await pg.all_to_all_single(out_span, span_of<T>(t), os, is);
                co_return -1;
            });
    }

    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                            std::vector<at::Tensor>& inputs,
                                            const c10d::AllToAllOptions&) override {
        auto n = static_cast<std::size_t>(getSize());
        if (inputs.size() != n || outputs.size() != n) {
            refuse("alltoall", "lists of " + std::to_string(inputs.size()) + " inputs and " +
                                   std::to_string(outputs.size()) + " outputs in a group of " +
                                   std::to_string(getSize()) + " (one per rank)");
        }
        for (auto& t : inputs) {
            check_cpu("alltoall", t);
            same_dtype("alltoall", inputs[0], t);
        }
        for (auto& t : outputs) {
            check_cpu("alltoall", t);
            same_dtype("alltoall", inputs[0], t);
        }
        std::vector<std::size_t> is, os;
        std::vector<at::Tensor> in_parts;
        for (auto& t : inputs) {
            is.push_back(static_cast<std::size_t>(t.numel()) * raw_scale(t));
            in_parts.push_back(t.reshape({-1}));
        }
        at::Tensor in_flat = at::cat(in_parts);
        std::int64_t total = 0;
        for (auto& t : outputs) {
            os.push_back(static_cast<std::size_t>(t.numel()) * raw_scale(t));
            total += t.numel();
        }
        at::Tensor out_flat = at::empty({total}, in_flat.options());
        std::vector<tensor_arg> back;
        std::int64_t at_elem = 0;
        for (auto& t : outputs) {
            back.push_back({t, out_flat.narrow(0, at_elem, t.numel()).view(t.sizes())});
            at_elem += t.numel();
        }
        return typed(c10d::OpType::ALLTOALL, "alltoall", in_flat, outputs, std::move(back),
                     [out_flat, os, is](auto& pg, auto elem, const at::Tensor& t) -> cc::task<int> {
                         using T = decltype(elem);
                         auto out_span = span_of<T>(out_flat);
                         co_await pg.all_to_all_single(out_span, span_of<T>(t), os, is);
                         co_return -1;
                     });
    }

private:
    friend class work;

    cc::task<> set_up() {
        auto scoped = std::make_shared<cc::rendezvous::prefix_store>("corocoll", adapter_);
        pg_ = co_await cc::detail::build_group(
            progress_.reactor(), std::move(scoped), getRank(), getSize(), "torch", timeout_, {},
            cc::transport::choose_listen_address(master_), nullptr);
    }

    std::string who() const {
        return "rank " + std::to_string(getRank()) + " of " + std::to_string(getSize());
    }

    [[noreturn]] void refuse(const std::string& op, const std::string& why) const {
        throw std::invalid_argument("corocoll backend: " + op + " on " + who() + ": " + why);
    }
    static std::string multi(std::size_t n, const char* what) {
        return std::to_string(n) + " " + what +
               " (one tensor per rank and call; lists of several tensors per rank are not "
               "supported)";
    }

    void check_cpu(const char* op, const at::Tensor& t) const {
        if (!t.defined()) refuse(op, "an undefined tensor");
        if (!t.device().is_cpu()) {
            refuse(op,
                   "a tensor on " + t.device().str() + " (the corocoll backend takes CPU tensors)");
        }
        if (t.layout() != at::kStrided) refuse(op, "a sparse tensor (only dense tensors)");
    }
    void same_dtype(const char* op, const at::Tensor& a, const at::Tensor& b) const {
        if (a.scalar_type() != b.scalar_type()) {
            refuse(op, std::string("tensors of different dtypes (") +
                           c10::toString(a.scalar_type()) + " and " +
                           c10::toString(b.scalar_type()) + ")");
        }
    }
    void check_peer(const char* op, int peer) const {
        if (peer < 0 || peer >= getSize()) {
            refuse(op, "rank " + std::to_string(peer) + " is outside [0, " +
                           std::to_string(getSize()) + ")");
        }
        if (peer == getRank()) refuse(op, "a message to or from itself");
    }
    int root_of(const char* op, std::int64_t root, std::int64_t root_tensor) const {
        if (root_tensor != 0)
            refuse(op, "rootTensor " + std::to_string(root_tensor) + " (one tensor per rank)");
        if (root < 0 || root >= getSize()) {
            refuse(op, "root " + std::to_string(root) + " is outside [0, " +
                           std::to_string(getSize()) + ")");
        }
        return static_cast<int>(root);
    }
    cc::reduce_op op_of(const char* op, const c10d::ReduceOp& r) const {
        switch (r.op_) {
            case c10d::ReduceOp::SUM:
                return cc::reduce_op::sum;
            case c10d::ReduceOp::AVG:
                return cc::reduce_op::avg;
            case c10d::ReduceOp::PRODUCT:
                return cc::reduce_op::product;
            case c10d::ReduceOp::MIN:
                return cc::reduce_op::min;
            case c10d::ReduceOp::MAX:
                return cc::reduce_op::max;
            case c10d::ReduceOp::BAND:
                return cc::reduce_op::band;
            case c10d::ReduceOp::BOR:
                return cc::reduce_op::bor;
            case c10d::ReduceOp::BXOR:
                return cc::reduce_op::bxor;
            default:
                refuse(op, "ReduceOp " + std::to_string(static_cast<int>(r.op_)) +
                               " (PREMUL_SUM is NCCL's)");
        }
    }

    at::Tensor one_input(const char* op, const std::vector<at::Tensor>& tensors) const {
        if (tensors.size() != 1) refuse(op, multi(tensors.size(), "tensors"));
        check_cpu(op, tensors[0]);
        return tensors[0].contiguous();
    }
    tensor_arg dense_arg(const at::Tensor& t) const {
        return {t, t.is_contiguous() ? t : t.contiguous()};
    }
    tensor_arg one_inout(const char* op, const std::vector<at::Tensor>& tensors) const {
        if (tensors.size() != 1) refuse(op, multi(tensors.size(), "tensors"));
        check_cpu(op, tensors[0]);
        return dense_arg(tensors[0]);
    }

    struct flat_list {
        at::Tensor flat;
        std::vector<tensor_arg> back;
    };
    // The output list of a gathering collective as one flat tensor: the list's own memory when
    // its tensors lie end to end in it (views of one tensor, as torch's chunk makes), else a
    // new tensor whose pieces are copied into the list on success.
    flat_list gathered_list(const char* op, const std::vector<at::Tensor>& list,
                            const at::Tensor& in) const {
        if (list.size() != static_cast<std::size_t>(getSize())) {
            refuse(op, "an output list of " + std::to_string(list.size()) +
                           " tensors in a group of " + std::to_string(getSize()));
        }
        bool adjacent = true;
        auto bytes = static_cast<std::size_t>(in.nbytes());
        for (std::size_t r = 0; r < list.size(); ++r) {
            const auto& t = list[r];
            check_cpu(op, t);
            same_dtype(op, in, t);
            if (t.numel() != in.numel()) {
                refuse(op, "output " + std::to_string(r) + " has " + std::to_string(t.numel()) +
                               " elements, the input " + std::to_string(in.numel()));
            }
            adjacent = adjacent && t.is_contiguous() &&
                       static_cast<char*>(t.data_ptr()) ==
                           static_cast<char*>(list[0].data_ptr()) + r * bytes;
        }
        flat_list out;
        if (adjacent && bytes > 0) {
            // A view over the same storage, from the first tensor's place on.
            out.flat = at::empty({0}, in.options())
                           .set_(list[0].storage(), list[0].storage_offset(),
                                 {in.numel() * getSize()}, {1});
            return out;
        }
        out.flat = at::empty({in.numel() * getSize()}, in.options());
        for (std::size_t r = 0; r < list.size(); ++r) {
            out.back.push_back(
                {list[r], out.flat.narrow(0, static_cast<std::int64_t>(r) * in.numel(), in.numel())
                              .view(list[r].sizes())});
        }
        return out;
    }

    // The input list of a scattering collective laid end to end.
    at::Tensor concat(const char* op, const std::vector<at::Tensor>& list,
                      const at::Tensor& out) const {
        if (list.size() != static_cast<std::size_t>(getSize())) {
            refuse(op, "an input list of " + std::to_string(list.size()) +
                           " tensors in a group of " + std::to_string(getSize()));
        }
        std::vector<at::Tensor> parts;
        for (std::size_t r = 0; r < list.size(); ++r) {
            check_cpu(op, list[r]);
            same_dtype(op, out, list[r]);
            if (list[r].numel() != out.numel()) {
                refuse(op, "input " + std::to_string(r) + " has " +
                               std::to_string(list[r].numel()) + " elements, the output " +
                               std::to_string(out.numel()));
            }
            parts.push_back(list[r].reshape({-1}));
        }
        return at::cat(parts);
    }

    c10::intrusive_ptr<c10d::Work> receive(c10d::OpType type, std::string what,
                                           std::vector<at::Tensor>& tensors, int src, int tag) {
        auto a = one_inout("recv", tensors);
        at::Tensor t = a.dense;
        return start(type, std::move(what), tensors, {a}, [t, src, tag](auto& pg) -> cc::task<int> {
            auto b = writable_bytes_of(t);
            co_return co_await pg.recv(b, src, tag);
        });
    }

    static std::span<const std::byte> bytes_of(const at::Tensor& t) {
        return {static_cast<const std::byte*>(t.data_ptr()), t.nbytes()};
    }
    static std::span<std::byte> writable_bytes_of(const at::Tensor& t) {
        return {static_cast<std::byte*>(t.data_ptr()), t.nbytes()};
    }

    template <class Body>
    c10::intrusive_ptr<c10d::Work> start(c10d::OpType type, std::string what,
                                         std::vector<at::Tensor> outputs,
                                         std::vector<tensor_arg> args, Body body) {
        auto w = c10::make_intrusive<op_work<Body>>(getRank(), type, what + " on " + who(),
                                                    std::move(outputs), std::move(args),
                                                    std::move(body));
        w->submit(*this);
        return w;
    }

    // An operation on the elements of `t` as corocoll's type for its dtype; a dtype corocoll
    // has no type for moves its bytes as uint8 (all ranks do the same).
    template <class Body>
    c10::intrusive_ptr<c10d::Work> typed(c10d::OpType type, const char* what, at::Tensor t,
                                         std::vector<at::Tensor> outputs,
                                         std::vector<tensor_arg> args, Body body) {
        c10::intrusive_ptr<c10d::Work> w;
        bool known = with_element(t.scalar_type(), [&](auto elem) {
            w = start(type, what, outputs, args,
                      [t, body, elem](cc::process_group& pg) { return body(pg, elem, t); });
        });
        if (!known) {
            at::Tensor raw = t.view({-1}).view(at::kByte);
            w = start(type, what, std::move(outputs), std::move(args),
                      [raw, body](cc::process_group& pg) { return body(pg, std::uint8_t{}, raw); });
        }
        return w;
    }

    // The same for a reduction, which needs corocoll's type.
    template <class Body>
    c10::intrusive_ptr<c10d::Work> reducing(c10d::OpType type, const char* what, at::Tensor t,
                                            std::vector<at::Tensor> outputs,
                                            std::vector<tensor_arg> args, Body body) {
        c10::intrusive_ptr<c10d::Work> w;
        bool known = with_element(t.scalar_type(), [&](auto elem) {
            w = start(type, what, outputs, args,
                      [t, body, elem](cc::process_group& pg) { return body(pg, elem, t); });
        });
        if (!known) {
            refuse(what, std::string("dtype ") + c10::toString(t.scalar_type()) +
                             " cannot be reduced (corocoll reduces int8, uint8, int32, int64, "
                             "float16, bfloat16, float32, float64)");
        }
        return w;
    }

    milliseconds timeout_;
    std::mutex shutdown_m_;
    cc::thread_pool store_pool_;
    cc::thread_pool callbacks_;
    std::shared_ptr<torch_store> adapter_;
    std::optional<cc::io::endpoint> master_;
    // Last: it stops first, before the pools and the adapter it uses go away.
    progress_thread progress_;
    std::shared_ptr<cc::process_group> pg_;
};

// ---------------------------------------------------------------------------------------------
// work's members that need the group
// ---------------------------------------------------------------------------------------------

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

c10::intrusive_ptr<c10d::ProcessGroup> create(const c10::intrusive_ptr<c10d::Store>& store,
                                              int rank, int size,
                                              std::chrono::duration<float> timeout) {
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

}  // namespace corocoll_torch

PYBIND11_MODULE(_C, m) {
    m.doc() = "corocoll's torch.distributed backend (import corocoll_torch registers it)";
    m.def("create_process_group", &corocoll_torch::create, py::arg("store"), py::arg("rank"),
          py::arg("world_size"), py::arg("timeout"),
          "Builds a corocoll process group on torch's store (the backend's factory)");
    m.def("close_all", &corocoll_torch::close_all,
          "Closes every corocoll group of this process, each first waiting (up to its timeout, "
          "at most 60 s) until its live peers have closed theirs: run as the process exits");
}
