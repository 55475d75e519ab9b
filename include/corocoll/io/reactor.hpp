#pragma once

#include <corocoll/core/async_scope.hpp>
#include <corocoll/core/awaitable_traits.hpp>
#include <corocoll/core/error.hpp>
#include <corocoll/core/event_loop.hpp>
#include <corocoll/core/sync_wait.hpp>
#include <corocoll/io/detail/io_op.hpp>
#include <corocoll/io/futex.hpp>
#include <corocoll/io/reactor_types.hpp>
#include <corocoll/version.hpp>

#include <fcntl.h>
#include <liburing.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define COROCOLL_HAS_TSAN_FEATURE 1
#endif
#endif
#ifndef COROCOLL_HAS_TSAN_FEATURE
#define COROCOLL_HAS_TSAN_FEATURE 0
#endif

COROCOLL_BEGIN_NAMESPACE

namespace io {

struct op_options;

/// One io_uring ring bound to the thread that creates it; the event loop that every awaitable
/// I/O operation of that thread completes through. At most one reactor per thread; it must be
/// created, run and destroyed on that thread. Other threads reach it only through `post` and
/// `schedule` (a queue and an eventfd), never through the ring. `run_until` (and so
/// `sync_wait` on this thread) submits queued operations, sleeps in the kernel until something
/// completes, and resumes the coroutines whose operations finished. Destroy it only once no
/// operation is in flight: coroutines still waiting on it are never resumed. Its destructor
/// waits for posts from other threads that are still returning.
class reactor final : public corocoll::detail::event_loop {
public:
    /// Sets up this thread's ring with `options` (probing set-up flags and falling back) and its
    /// eventfd. Throws `std::logic_error` when this thread has a reactor already,
    /// `std::system_error` when io_uring is unavailable.
    explicit reactor(reactor_options options = {});

    reactor(const reactor&) = delete;
    reactor& operator=(const reactor&) = delete;

    ~reactor();

    /// The reactor of the calling thread, or null.
    static reactor* current() noexcept {
        return static_cast<reactor*>(corocoll::detail::event_loop::current());
    }

    /// While it lives, a reactor is the calling thread's (`current()`), so that this thread may
    /// drive it (`run_until`) in turns with the thread that made it: the way a thread that
    /// waits for an operation makes progress itself instead of sleeping until another thread
    /// has. The caller keeps the turns apart (one thread at a time, by a lock of its own), and
    /// the ring must take submissions from several threads: set it up without
    /// IORING_SETUP_SINGLE_ISSUER, DEFER_TASKRUN and COOP_TASKRUN
    /// (`reactor_options::allowed_setup_flags`; completions then run on the thread that
    /// submitted the operation, woken for it if it sleeps). Costs two thread-local stores.
    class [[nodiscard]] borrowed {
    public:
        /// Makes `r` this thread's current reactor until the destructor restores the one
        /// before.
        explicit borrowed(reactor& r) noexcept : previous_(current_ref()) { current_ref() = &r; }
        ~borrowed() { current_ref() = previous_; }
        borrowed(const borrowed&) = delete;
        borrowed& operator=(const borrowed&) = delete;

    private:
        corocoll::detail::event_loop* previous_;
    };

    /// How many processes of this job run on this host (the launcher's local world size; the
    /// process group sets it at start-up). 1 until then.
    static void set_local_processes(int n) noexcept {
        local_processes().store(n < 1 ? 1 : n, std::memory_order_relaxed);
    }
    /// True when this host's reactors (this process's, times its local processes) outnumber
    /// the processors this process may run on; busy polling then yields between polls.
    static bool crowded() noexcept;
    /// True when this host had more runnable tasks than the processors this process may run
    /// on at each of the last `host_busy_looks` looks (the running count of /proc/loadavg,
    /// read at most every 10 ms): other programs compete for the processors too, and did at
    /// three instants 20 ms apart at least; a task that runs for a moment (a launcher, a
    /// kernel thread) is seen at one look at most. False where /proc cannot be read.
    static bool host_busy() noexcept;
    /// Looks in a row that `host_busy` needs.
    static constexpr int host_busy_looks = 3;
    /// The processors this process may run on.
    static int processors() noexcept;

    /// What the kernel accepted at set-up.
    const reactor_features& features() const noexcept { return features_; }
    /// Submission-queue size the kernel granted.
    unsigned sq_entries() const noexcept { return ring_.sq.ring_entries; }

    /// Operations submitted and not yet completed, not counting the reactor's own eventfd read.
    std::size_t in_flight() const noexcept { return in_flight_ - 1; }

    /// What the loop has done so far (see `reactor_stats`). Only on this reactor's thread.
    const reactor_stats& stats() const noexcept { return stats_; }
    /// Counts a sleep that a watched entry's `prepare_sleep` made wait on a futex in the ring
    /// (`reactor_stats::futex_sleeps`).
    void note_futex_sleep() noexcept { ++stats_.futex_sleeps; }

    /// Queues `item` to run on the reactor's thread; from any thread. Wakes the loop through its
    /// eventfd only when the queue was empty: no allocation, at most one write(2).
    COROCOLL_DECL void post(corocoll::detail::work_item& item) noexcept override;

    /// Runs the loop until `done` is true; another thread sets it and wakes the reactor.
    void run_until(const std::atomic<bool>& done) override {
        loop_while([&] { return !done.load(std::memory_order_acquire); });
    }

    /// Runs the loop until `ready(arg)` holds or `deadline` passes; false on the deadline.
    COROCOLL_DECL bool run_until(bool (*ready)(const void* arg) noexcept, const void* arg,
                                 std::chrono::steady_clock::time_point deadline) override;

private:
    // The loop: runs while `go_on()`, which is asked before every turn.
    template <class GoOn>
    void loop_while(GoOn go_on) {
        ++depth_;
        while (go_on()) {
            ++stats_.turns;
            run_posted();
            if (!go_on()) break;
            submit_backlog();
            bool progressed = reap() > 0;
            // Timers fire even while completions keep coming. Busy polling of watched entries
            // looks at them (and the clock) every 16th turn only.
            if (!clock_skipped_ && fire_due_timers()) progressed = true;
            clock_skipped_ = false;
            if (watched_ != nullptr && poll_watched()) progressed = true;
            if (progressed) continue;
            // Work posted from this thread while the items above ran did not wake us.
            if (posted_.load(std::memory_order_acquire) != nullptr) continue;
            wait_for_completion();
            reap();
        }
        // What the last resumed coroutines queued goes out now rather than at the next run.
        if (io_uring_sq_ready(&ring_) > 0) flush();
        --depth_;
    }

public:
    /// True while the loop runs on this thread (inside `run_until`, `run` or `sync_wait`):
    /// code called from a coroutine it resumed sees true, plain code around it false. A
    /// blocking wait from there would run the loop nested inside whatever resumed the caller.
    bool running() const noexcept { return depth_ > 0; }

    /// Starts `a` now, detached, on this thread (it runs until it first suspends before
    /// `adopt` returns); the reactor finishes it: whatever is still running when the reactor
    /// is destroyed runs to its end first, in the destructor. Its exceptions are dropped.
    /// For clean-up that must not block where it is started (a group whose last reference
    /// goes inside a coroutine closes this way). Costs one coroutine frame. Only on this
    /// reactor's thread.
    template <corocoll::awaitable A>
    void adopt(A a) {
        adopted_.spawn(std::move(a));
    }
    /// Tasks given to `adopt` that have not finished.
    std::size_t adopted() const noexcept { return adopted_.pending(); }

    /// Runs `a` on this reactor's thread until it completes and returns its result:
    /// `sync_wait(a)` with this reactor driving the I/O.
    template <class A>
    decltype(auto) run(A&& a) {
        return corocoll::sync_wait(std::forward<A>(a));
    }

    /// Hands `op` to the kernel, or to the backlog when the submission queue is full. The
    /// SQEs are flushed to the kernel the next time the loop waits (one syscall for a batch)
    /// or here, when the queue fills up.
    void submit(detail::io_op& op) noexcept;

    /// Removes `op` from the backlog if it waits there; true if it did.
    bool withdraw(detail::io_op& op) noexcept;

    /// Starts watching `t` (re-arming an armed one moves it); may allocate while the number of
    /// armed timers grows. Only on this reactor's thread.
    void arm(timer_entry& t);
    /// Stops watching `t`; nothing if it is not armed (or has fired).
    void disarm(timer_entry& t) noexcept;

    /// Starts calling `e.poll` on every turn of the loop (nothing if already watched). Only on
    /// this reactor's thread.
    void watch(poll_entry& e) noexcept;
    /// Stops polling `e`; nothing if it is not watched. Only on this reactor's thread.
    void unwatch(poll_entry& e) noexcept;
    /// Entries watched now.
    bool watching() const noexcept { return watched_ != nullptr; }
    /// Counts as progress of the watched entries: the loop busy-polls again from now before
    /// it pauses or sleeps. For an entry that starts a new wait while others were watched
    /// through a quiet time (a shared-memory step after idle channels): without it the loop,
    /// idle for long, would pause at once for up to 500 µs.
    void note_progress() noexcept { progress_unstamped_ = true; }
    /// The watched entries' wait is expected to last up to `d` from now (a peer copies for
    /// this rank meanwhile): the loop keeps busy polling until then, where it would pause
    /// after `busy_poll` (each pause costs a few microseconds of waking up). Nothing when busy
    /// polling is off. The arena's single copies say so for the copy they wait out.
    void busy_poll_for(std::chrono::nanoseconds d) noexcept {
        if (options_.busy_poll.count() > 0) {
            busy_until_ = std::max(busy_until_, std::chrono::steady_clock::now() + d);
        }
    }

    /// Awaitable: suspends for `d`. Throws `std::system_error` (operation_canceled) if `stop`
    /// is requested first.
    template <class Rep, class Period>
    auto sleep_for(std::chrono::duration<Rep, Period> d, std::stop_token stop = {});
    /// Awaitable: suspends until the steady clock reaches `t`.
    auto sleep_until(std::chrono::steady_clock::time_point t, std::stop_token stop = {});
    /// Awaitable: resumes the awaiting coroutine on this reactor's thread, from any thread.
    auto schedule() noexcept;
    /// Awaitable: cancels every operation in flight on file descriptor `fd`; yields how many
    /// were cancelled. Each of them completes with `std::errc::operation_canceled`.
    auto cancel_fd(int fd);

    /// Awaitable: one read(2) of up to `data.size()` bytes from any readable descriptor (a
    /// pipe, a signalfd, a file at its current offset); yields the byte count, 0 at end of
    /// file. Sockets have `socket::recv_some`.
    [[nodiscard]] auto read_some(int fd, std::span<std::byte> data);
    /// As `read_some` above, with a deadline and a stop token.
    [[nodiscard]] auto read_some(int fd, std::span<std::byte> data, const op_options& o);

    /// Awaitable: waits until `fd` is ready for `events` (POLLIN, POLLOUT, ...: one-shot
    /// IORING_OP_POLL_ADD) and yields the events that are. A pidfd polls POLLIN when its
    /// process exits.
    [[nodiscard]] auto poll(int fd, unsigned events);
    /// As `poll` above, with a deadline and a stop token.
    [[nodiscard]] auto poll(int fd, unsigned events, const op_options& o);

private:
    void setup_ring();

    // The timer heap, earliest first: `timers_[i]->slot == i` for every entry.
    bool earlier(std::size_t a, std::size_t b) const noexcept {
        return timers_[a]->when < timers_[b]->when;
    }
    void swap_slots(std::size_t a, std::size_t b) noexcept;
    void sift_up(std::size_t i) noexcept;
    void sift_down(std::size_t i) noexcept;

    // Fires the timers whose time has come; true if any did.
    bool fire_due_timers();

    static std::atomic<int>& live_reactors() noexcept;
    static std::atomic<int>& local_processes() noexcept;

    // True when the queue was empty, so the loop may be asleep.
    bool push(corocoll::detail::work_item& item) noexcept;

    void wake() noexcept;

    bool reserve(unsigned n) noexcept;

    void flush() noexcept;

    void backlog_push(detail::io_op& op) noexcept;

    void submit_backlog() noexcept;

    void run_posted() noexcept;

    // Copies a batch of CQEs out of the ring and frees their slots before dispatching, so that
    // what a resumed coroutine submits never races with the ring's completion side.
    std::size_t reap() noexcept;

    void wait_for_completion() noexcept;

    // Whether busy polling gives the processor away between polls (see `reactor_options`).
    bool yield_between_polls() const noexcept;

    // Submits and sleeps in the kernel until a completion or for `d`, whichever is first.
    void wait_at_most(std::chrono::steady_clock::duration d) noexcept;

    // Submits, and runs the completions' task work where the ring defers it (their CQEs show
    // only after entering the kernel; a plain ring's just appear). Never sleeps.
    void submit_and_collect() noexcept;

    // Asks every watched entry once; true if one made progress.
    bool poll_watched() noexcept;

    // One pause between turns of the loop while entries are watched (see `poll_entry`).
    void wait_while_watching() noexcept;

    // Asks every watched entry whether the loop may sleep in the kernel (see `poll_entry`);
    // when all agree, sleeps as an unwatched loop does and returns true.
    bool sleep_watched() noexcept;

    // Polls for up to `busy_poll`, yielding the processor between polls when `yield`; true if
    // a completion, posted work or a due timer turned up.
    bool poll_briefly(bool yield) noexcept;

    // The eventfd read that is always in flight, so that post() from other threads
    // end the loop's sleep. Re-armed each time it completes.
    struct wake_op : detail::io_op {
        reactor* self_ = nullptr;
    };
    static void prepare_wake_read(detail::io_op* op, io_uring* ring) noexcept;
    static void complete_wake_read(detail::io_op* op, int /*res*/) noexcept;

    reactor_options options_;
    // The timer slack of the thread that made the reactor, to give back (0: none taken).
    int slack_before_ = 0;
    std::thread::id slack_thread_;
    reactor_features features_;
    io_uring ring_{};
    int wake_fd_ = -1;
    std::uint64_t wake_buf_ = 0;
    wake_op wake_op_;
    std::atomic<corocoll::detail::work_item*> posted_{nullptr};
    std::atomic<int> posters_{0};
    detail::io_op* backlog_head_ = nullptr;
    detail::io_op* backlog_tail_ = nullptr;
    std::size_t in_flight_ = 0;
    std::vector<timer_entry*> timers_;
    poll_entry* watched_ = nullptr;
    poll_entry* polling_next_ = nullptr;
    std::chrono::steady_clock::time_point watch_progress_{};
    unsigned busy_turns_left_ = 0;
    // Busy polling goes on at least until then (see `busy_poll_for`).
    std::chrono::steady_clock::time_point busy_until_{};
    // Progress made since `watch_progress_` was last stamped (see `poll_watched`).
    bool progress_unstamped_ = false;
    // Looks at the watched entries between full turns while busy polling.
    static constexpr int tight_polls = 8;
    bool clock_skipped_ = false;
    std::chrono::steady_clock::time_point last_enter_{};
    reactor_stats stats_;
    int depth_ = 0;
    corocoll::async_scope adopted_;
};

}  // namespace io

COROCOLL_END_NAMESPACE

#include <corocoll/io/detail/basic_op.hpp>
#include <corocoll/io/detail/reactor_ops.hpp>

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace io {

COROCOLL_DECL reactor::~reactor() {
    // Work handed over with `adopt` (a group closing because its last reference went)
    // finishes first, while the ring still runs.
    if (adopted_.pending() != 0) {
        try {
            corocoll::sync_wait(adopted_.join());
        } catch (...) {
        }
    }
    while (posters_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
    if (slack_before_ > 0 && slack_thread_ == std::this_thread::get_id()) {
        ::prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(slack_before_), 0, 0, 0);
    }
    live_reactors().fetch_sub(1, std::memory_order_relaxed);
    current_ref() = nullptr;
    // Closing the ring cancels whatever is still in flight, our eventfd read included.
#if defined(__SANITIZE_THREAD__) || COROCOLL_HAS_TSAN_FEATURE
    // liburing 2.3 maps and unmaps the ring with raw system calls, which TSan does not
    // see: a later reactor's ring at the same address would look like a race with this
    // one's. So under TSan the ring is taken down here as io_uring_queue_exit does (unmap
    // the SQEs and the rings, close the descriptor; this reactor registers no ring fd),
    // but through libc, whose munmap TSan intercepts and forgets the ranges for.
    ::munmap(ring_.sq.sqes, ring_.sq.ring_entries * sizeof(io_uring_sqe));
    ::munmap(ring_.sq.ring_ptr, ring_.sq.ring_sz);
    if (ring_.cq.ring_ptr != nullptr && ring_.cq.ring_ptr != ring_.sq.ring_ptr) {
        ::munmap(ring_.cq.ring_ptr, ring_.cq.ring_sz);
    }
    ::close(ring_.ring_fd);
#else
    io_uring_queue_exit(&ring_);
#endif
    ::close(wake_fd_);
}

COROCOLL_DECL reactor::reactor(reactor_options options) : options_(options) {
    if (current_ref() != nullptr) {
        throw std::logic_error("corocoll: this thread already has an io::reactor");
    }
    setup_ring();
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) {
        int err = errno;
        io_uring_queue_exit(&ring_);
        corocoll::detail::throw_errno(err, "corocoll: reactor: eventfd");
    }
    wake_op_.self_ = this;
    wake_op_.prepare_ = &prepare_wake_read;
    wake_op_.complete_ = &complete_wake_read;
    submit(wake_op_);
    if (options_.timer_slack.count() > 0) {
        int old = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
        if (old > 0 &&
            ::prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(options_.timer_slack.count()), 0,
                    0, 0) == 0) {
            slack_before_ = old;
            slack_thread_ = std::this_thread::get_id();
        }
    }
    current_ref() = this;
    live_reactors().fetch_add(1, std::memory_order_relaxed);
}

COROCOLL_DECL bool reactor::crowded() noexcept {
    return live_reactors().load(std::memory_order_relaxed) *
               local_processes().load(std::memory_order_relaxed) >
           processors();
}

COROCOLL_DECL bool reactor::host_busy() noexcept {
    static std::atomic<std::int64_t> next_look{0};
    static std::atomic<bool> busy{false};
    static std::atomic<int> looks_over{0};  // written by the thread that won the look
    const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count();
    std::int64_t due = next_look.load(std::memory_order_relaxed);
    if (now < due ||
        !next_look.compare_exchange_strong(due, now + 10'000'000, std::memory_order_relaxed)) {
        return busy.load(std::memory_order_relaxed);
    }
    // "0.52 0.58 0.59 3/128 4242": the fourth field is runnable/all.
    char text[128];
    ssize_t n = -1;
    if (int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC); fd >= 0) {
        n = ::read(fd, text, sizeof(text) - 1);
        ::close(fd);
    }
    if (n <= 0) return busy.load(std::memory_order_relaxed);
    text[n] = '\0';
    int fields = 0;
    const char* p = text;
    while (*p != '\0' && fields < 3) {
        if (*p++ == ' ') ++fields;
    }
    const int over = std::atoi(p) > processors()
                         ? std::min(looks_over.load(std::memory_order_relaxed) + 1, host_busy_looks)
                         : 0;
    looks_over.store(over, std::memory_order_relaxed);
    const bool now_busy = over >= host_busy_looks;
    busy.store(now_busy, std::memory_order_relaxed);
    return now_busy;
}

COROCOLL_DECL int reactor::processors() noexcept {
    static const int cpus = [] {
        cpu_set_t set;
        CPU_ZERO(&set);
        if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
        return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    }();
    return cpus;
}

COROCOLL_DECL void reactor::post(corocoll::detail::work_item& item) noexcept {
    if (current_ref() == this) {
        // The loop drains the queue before it sleeps: no wake, no lifetime guard needed.
        push(item);
        return;
    }
    // Counted so that the destructor waits for us: once the item is in, the loop may run
    // it and the owner destroy the reactor while we still write to the eventfd.
    posters_.fetch_add(1, std::memory_order_acq_rel);
    // Only the first item after a drain needs to wake the loop: later ones ride along.
    if (push(item)) wake();
    posters_.fetch_sub(1, std::memory_order_acq_rel);
}

COROCOLL_DECL bool reactor::run_until(bool (*ready)(const void* arg) noexcept, const void* arg,
                                      std::chrono::steady_clock::time_point deadline) {
    struct expiry : timer_entry {
        std::atomic<bool> passed{false};
    } timer;
    timer.when = deadline;
    timer.fire = [](timer_entry& t) noexcept {
        static_cast<expiry&>(t).passed.store(true, std::memory_order_release);
    };
    if (!ready(arg)) {
        arm(timer);
        loop_while([&] { return !ready(arg) && !timer.passed.load(std::memory_order_acquire); });
        disarm(timer);
    }
    return ready(arg);
}

COROCOLL_DECL void reactor::submit(detail::io_op& op) noexcept {
    if (backlog_head_ == nullptr && reserve(op.sqes_)) {
        op.prepare_(&op, &ring_);
        in_flight_ += op.tracked_ ? 1 : 0;
        return;
    }
    backlog_push(op);
}

COROCOLL_DECL bool reactor::withdraw(detail::io_op& op) noexcept {
    if (!op.queued_) return false;
    if (op.prev_ != nullptr) {
        op.prev_->next_ = op.next_;
    } else {
        backlog_head_ = op.next_;
    }
    if (op.next_ != nullptr) {
        op.next_->prev_ = op.prev_;
    } else {
        backlog_tail_ = op.prev_;
    }
    op.prev_ = op.next_ = nullptr;
    op.queued_ = false;
    return true;
}

COROCOLL_DECL void reactor::arm(timer_entry& t) {
    if (t.armed()) disarm(t);
    timers_.push_back(&t);
    t.slot = timers_.size() - 1;
    sift_up(t.slot);
}

COROCOLL_DECL void reactor::disarm(timer_entry& t) noexcept {
    if (!t.armed()) return;
    std::size_t i = t.slot;
    t.slot = timer_entry::not_armed;
    timer_entry* last = timers_.back();
    timers_.pop_back();
    if (last == &t) return;
    timers_[i] = last;
    last->slot = i;
    sift_up(i);
    sift_down(last->slot);
}

COROCOLL_DECL void reactor::watch(poll_entry& e) noexcept {
    if (e.watched) return;
    if (watched_ == nullptr) watch_progress_ = std::chrono::steady_clock::now();
    e.watched = true;
    e.prev = nullptr;
    e.next = watched_;
    if (watched_ != nullptr) watched_->prev = &e;
    watched_ = &e;
}

COROCOLL_DECL void reactor::unwatch(poll_entry& e) noexcept {
    if (!e.watched) return;
    e.watched = false;
    if (e.prev != nullptr) {
        e.prev->next = e.next;
    } else {
        watched_ = e.next;
    }
    if (e.next != nullptr) e.next->prev = e.prev;
    // The entry being polled right now may unwatch itself: the walk goes on from here.
    if (polling_next_ == &e) polling_next_ = e.next;
    e.prev = e.next = nullptr;
}

COROCOLL_DECL void reactor::setup_ring() {
    // Newest first; each step drops what an older kernel rejects with EINVAL.
    const unsigned attempts[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_SUBMIT_ALL,
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL,
        IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL,
        0,
    };
    int rc = -EINVAL;
    for (unsigned flags : attempts) {
        if ((flags & ~options_.allowed_setup_flags) != 0) continue;
        io_uring_params p{};
        p.flags = flags;
        if (options_.cq_entries != 0) {
            p.flags |= IORING_SETUP_CQSIZE;
            p.cq_entries = options_.cq_entries;
        }
        rc = io_uring_queue_init_params(options_.sq_entries, &ring_, &p);
        if (rc == 0) {
            features_.single_issuer = (flags & IORING_SETUP_SINGLE_ISSUER) != 0;
            features_.defer_taskrun = (flags & IORING_SETUP_DEFER_TASKRUN) != 0;
            features_.coop_taskrun = (flags & IORING_SETUP_COOP_TASKRUN) != 0;
            features_.submit_all = (flags & IORING_SETUP_SUBMIT_ALL) != 0;
            break;
        }
        if (rc != -EINVAL) break;
    }
    if (rc != 0) {
        corocoll::detail::throw_errno(-rc, "corocoll: reactor: io_uring_queue_init with " +
                                               std::to_string(options_.sq_entries) + " entries");
    }
    features_.futex_wait = futex_wait_supported();
    // A child made by fork() must not share the ring's memory with us.
    io_uring_ring_dontfork(&ring_);
}

COROCOLL_DECL void reactor::swap_slots(std::size_t a, std::size_t b) noexcept {
    std::swap(timers_[a], timers_[b]);
    timers_[a]->slot = a;
    timers_[b]->slot = b;
}

COROCOLL_DECL void reactor::sift_up(std::size_t i) noexcept {
    while (i > 0 && earlier(i, (i - 1) / 2)) {
        swap_slots(i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

COROCOLL_DECL void reactor::sift_down(std::size_t i) noexcept {
    for (;;) {
        std::size_t least = i;
        for (std::size_t c = 2 * i + 1; c <= 2 * i + 2 && c < timers_.size(); ++c) {
            if (earlier(c, least)) least = c;
        }
        if (least == i) return;
        swap_slots(i, least);
        i = least;
    }
}

COROCOLL_DECL bool reactor::fire_due_timers() {
    if (timers_.empty()) return false;
    auto now = std::chrono::steady_clock::now();
    bool fired = false;
    while (!timers_.empty() && timers_.front()->when <= now) {
        timer_entry& t = *timers_.front();
        disarm(t);
        t.fire(t);
        fired = true;
    }
    return fired;
}

COROCOLL_DECL std::atomic<int>& reactor::live_reactors() noexcept {
    static std::atomic<int> n{0};
    return n;
}

COROCOLL_DECL std::atomic<int>& reactor::local_processes() noexcept {
    static std::atomic<int> n{1};
    return n;
}

COROCOLL_DECL bool reactor::push(corocoll::detail::work_item& item) noexcept {
    corocoll::detail::work_item* head = posted_.load(std::memory_order_relaxed);
    do {
        item.next_ = head;
    } while (!posted_.compare_exchange_weak(head, &item, std::memory_order_release,
                                            std::memory_order_relaxed));
    return head == nullptr;
}

COROCOLL_DECL void reactor::wake() noexcept {
    std::uint64_t one = 1;
    // EAGAIN means the counter is already non-zero: the loop is woken anyway.
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
}

COROCOLL_DECL bool reactor::reserve(unsigned n) noexcept {
    if (io_uring_sq_space_left(&ring_) >= n) return true;
    flush();
    return io_uring_sq_space_left(&ring_) >= n;
}

COROCOLL_DECL void reactor::flush() noexcept {
    int rc;
    do {
        rc = io_uring_submit(&ring_);
    } while (rc == -EINTR);
    // -EBUSY/-EAGAIN: the kernel wants completions reaped first; the SQEs stay queued and
    // go out with the loop's next submit.
}

COROCOLL_DECL void reactor::backlog_push(detail::io_op& op) noexcept {
    op.next_ = nullptr;
    op.prev_ = backlog_tail_;
    if (backlog_tail_ != nullptr) {
        backlog_tail_->next_ = &op;
    } else {
        backlog_head_ = &op;
    }
    backlog_tail_ = &op;
    op.queued_ = true;
}

COROCOLL_DECL void reactor::submit_backlog() noexcept {
    while (backlog_head_ != nullptr && reserve(backlog_head_->sqes_)) {
        detail::io_op* op = backlog_head_;
        withdraw(*op);
        op->prepare_(op, &ring_);
        in_flight_ += op->tracked_ ? 1 : 0;
    }
}

COROCOLL_DECL void reactor::run_posted() noexcept {
    // Looked at on every turn of the loop: a plain load when nothing was posted (the usual
    // case while busy polling) instead of a locked exchange.
    if (posted_.load(std::memory_order_relaxed) == nullptr) return;
    corocoll::detail::work_item* list = posted_.exchange(nullptr, std::memory_order_acquire);
    // The stack holds the newest first; reverse it so items run in the order posted.
    corocoll::detail::work_item* ordered = nullptr;
    while (list != nullptr) {
        auto* next = list->next_;
        list->next_ = ordered;
        ordered = list;
        list = next;
    }
    while (ordered != nullptr) {
        auto* next = ordered->next_;
        ordered->run_(ordered);
        ordered = next;
    }
}

COROCOLL_DECL std::size_t reactor::reap() noexcept {
    std::size_t total = 0;
    for (;;) {
        io_uring_cqe* cqes[64];
        unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, 64);
        if (n == 0) return total;
        struct completion {
            __u64 user_data;
            int res;
        } batch[64];
        for (unsigned i = 0; i < n; ++i) batch[i] = {cqes[i]->user_data, cqes[i]->res};
        io_uring_cq_advance(&ring_, n);
        for (unsigned i = 0; i < n; ++i) {
            if (batch[i].user_data == detail::ignored_user_data ||
                batch[i].user_data == LIBURING_UDATA_TIMEOUT) {
                continue;
            }
            auto* op = reinterpret_cast<detail::io_op*>(batch[i].user_data);
            --in_flight_;
            op->complete_(op, batch[i].res);
        }
        total += n;
    }
}

COROCOLL_DECL void reactor::wait_for_completion() noexcept {
    if (options_.spin) {
        ++stats_.polls;
        flush();
        if (features_.defer_taskrun) io_uring_get_events(&ring_);
        return;
    }
    if (watched_ != nullptr) {
        wait_while_watching();
        return;
    }
    if (options_.busy_poll.count() > 0 && in_flight() > 0 && poll_briefly(yield_between_polls())) {
        return;
    }
    if (timers_.empty()) {
        ++stats_.kernel_waits;
        int rc = io_uring_submit_and_wait(&ring_, 1);
        // EINTR: a signal; EBUSY/EAGAIN: completions to reap first. The loop comes back.
        (void)rc;
        return;
    }
    wait_at_most(timers_.front()->when - std::chrono::steady_clock::now());
}

COROCOLL_DECL bool reactor::yield_between_polls() const noexcept {
    if (options_.busy_poll_when_crowded) return false;
    return crowded() || (options_.yield_when_host_busy && host_busy());
}

COROCOLL_DECL void reactor::wait_at_most(std::chrono::steady_clock::duration d) noexcept {
    if (d <= d.zero()) return;
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
    __kernel_timespec ts{ns / 1'000'000'000, ns % 1'000'000'000};
    io_uring_cqe* cqe = nullptr;
    ++stats_.kernel_waits;
    // -ETIME when the time is up first. Kernels without IORING_FEAT_EXT_ARG get a timeout
    // SQE from liburing instead, whose CQE `reap` skips.
    int rc = io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &ts, nullptr);
    (void)rc;
}

COROCOLL_DECL void reactor::submit_and_collect() noexcept {
    if (features_.defer_taskrun || features_.coop_taskrun) {
        io_uring_submit_and_get_events(&ring_);
    } else {
        flush();
    }
}

COROCOLL_DECL bool reactor::poll_watched() noexcept {
    bool progressed = false;
    for (poll_entry* e = watched_; e != nullptr; e = polling_next_) {
        polling_next_ = e->next;
        if (e->poll(*e)) progressed = true;
    }
    polling_next_ = nullptr;
    // The clock is read at the next look at it (`wait_while_watching`), not here: a read
    // costs as much as the rest of a message's bookkeeping.
    if (progressed) progress_unstamped_ = true;
    return progressed;
}

COROCOLL_DECL void reactor::wait_while_watching() noexcept {
    // A clock read costs about as much as a poll of shared memory (vdso clock_gettime
    // was a third of a perf profile of coll_perf's shm ping-pong): while busy polling,
    // the clock is read at every 16th turn only.
    if (busy_turns_left_ > 0) {
        --busy_turns_left_;
        clock_skipped_ = true;
        ++stats_.polls;
        if (io_uring_sq_ready(&ring_) > 0) submit_and_collect();
        // A few looks at the watched entries alone before the next full turn: the rest of a
        // turn (completions, posted work, the backlog) costs several times a look at shared
        // memory, and a message that lands meanwhile waits for it.
        for (int i = 0; i < tight_polls; ++i) {
            if (poll_watched()) return;
        }
        return;
    }
    auto now = std::chrono::steady_clock::now();
    if (progress_unstamped_) {
        watch_progress_ = now;
        progress_unstamped_ = false;
    }
    auto idle = now - watch_progress_;
    if (idle < options_.busy_poll || now < busy_until_) {
        const bool yield = yield_between_polls();
        if (!yield) busy_turns_left_ = 15;
        ++stats_.polls;
        // Entering the kernel costs much more than a poll of shared memory (coll_perf's shm
        // ping-pong of 4 B took 1.7-1.8 µs one way entering at every 16th turn, 1.2-1.35
        // entering at most every 10 µs): every 10 µs, or when there is something to submit
        // (the completions of a deferred-task-run ring appear only then).
        if (io_uring_sq_ready(&ring_) > 0 || now - last_enter_ >= std::chrono::microseconds(10)) {
            last_enter_ = now;
            submit_and_collect();
        }
        if (yield) {
            ++stats_.yields;
            sched_yield();
        }
        return;
    }
    if (sleep_watched()) return;
    auto pause =
        std::min<std::chrono::steady_clock::duration>(idle / 32, std::chrono::microseconds(500));
    if (!timers_.empty()) pause = std::min(pause, timers_.front()->when - now);
    wait_at_most(pause);
}

COROCOLL_DECL bool reactor::sleep_watched() noexcept {
    poll_entry* refused = nullptr;
    for (poll_entry* e = watched_; e != nullptr; e = e->next) {
        if (e->prepare_sleep == nullptr || !e->prepare_sleep(*e)) {
            refused = e;
            break;
        }
    }
    if (refused == nullptr) {
        ++stats_.watched_sleeps;
        if (timers_.empty()) {
            ++stats_.kernel_waits;
            io_uring_submit_and_wait(&ring_, 1);
        } else {
            wait_at_most(timers_.front()->when - std::chrono::steady_clock::now());  // counts
        }
    }
    for (poll_entry* e = watched_; e != nullptr && e != refused; e = e->next) {
        if (e->end_sleep != nullptr) e->end_sleep(*e);
    }
    // A refusal by an entry that can sleep means its wait ended: poll again at once.
    if (refused != nullptr && refused->prepare_sleep != nullptr) {
        watch_progress_ = std::chrono::steady_clock::now();
        return true;
    }
    if (refused == nullptr) watch_progress_ = std::chrono::steady_clock::now();
    return refused == nullptr;
}

COROCOLL_DECL bool reactor::poll_briefly(bool yield) noexcept {
    // Deferred or cooperative task work (the completions) runs only when we enter the
    // kernel; a plain ring's completions just appear. The first entry also submits.
    bool enter = features_.defer_taskrun || features_.coop_taskrun;
    submit_and_collect();
    auto until = std::chrono::steady_clock::now() + options_.busy_poll;
    for (;;) {
        ++stats_.polls;
        if (io_uring_cq_ready(&ring_) > 0) return true;
        if (posted_.load(std::memory_order_acquire) != nullptr) return true;
        auto now = std::chrono::steady_clock::now();
        if (!timers_.empty() && timers_.front()->when <= now) return true;
        if (now >= until) return false;
        if (enter) io_uring_get_events(&ring_);
        if (yield) {
            ++stats_.yields;
            sched_yield();
        }
    }
}

COROCOLL_DECL void reactor::prepare_wake_read(detail::io_op* op, io_uring* ring) noexcept {
    reactor* self = static_cast<wake_op*>(op)->self_;
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    io_uring_prep_read(sqe, self->wake_fd_, &self->wake_buf_, sizeof(self->wake_buf_), 0);
    io_uring_sqe_set_data(sqe, op);
}

COROCOLL_DECL void reactor::complete_wake_read(detail::io_op* op, int /*res*/) noexcept {
    reactor* self = static_cast<wake_op*>(op)->self_;
    ++self->stats_.wakeups;
    self->submit(self->wake_op_);
}

}  // namespace io

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
