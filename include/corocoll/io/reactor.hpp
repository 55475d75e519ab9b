#pragma once

// The reactor: one io_uring ring per thread, the event loop that drives every awaitable I/O
// operation, timer and polled wait of that thread.

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
#include <sys/syscall.h>
#include <sys/sysinfo.h>
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
    /// This host's runnable tasks now (the running count of /proc/loadavg, the caller
    /// included), or -1 where /proc cannot be read.
    static int runnable_tasks() noexcept;
    /// The processors this process may run on.
    static int processors() noexcept;
    /// How long a sched_yield takes, at least, when it gives the processor to another task:
    /// a yield that took this long handed over, one that returned sooner found nothing else to
    /// run. Twice the cheapest of a few system calls, read once (a yield that finds nothing
    /// else is a system call and a look at the run queue; one that hands over to a peer that
    /// yields straight back is two of them and two switches), and 1 us at least. Read here,
    /// not fixed: on an Intel Xeon of model 207 a system call takes 0.1-0.3 us and an empty
    /// yield returns within 0.5 us 99.7% of the time (a hand-over takes 1.5-3 us); on an AMD
    /// EPYC VM a system call takes 1.0 us and an empty yield 1.25-1.6, and a fixed 1 us took
    /// every yield for a hand-over.
    static std::chrono::nanoseconds handover_time() noexcept;

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
    /// Counts a barrier on other processes' processors that an entry ran before agreeing to a
    /// watched sleep (`reactor_stats::fenced_sleeps`); called by the entry.
    void note_fenced_sleep() noexcept { ++stats_.fenced_sleeps; }

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
    // /proc/loadavg, opened once per process (by the first reactor) and read with pread, so
    // that `host_busy` opens nothing while reactors run: a descriptor that came and went every
    // 10 ms made the count of free descriptors at a given moment a matter of luck. -1 if it
    // cannot be opened.
    static int loadavg_fd() noexcept;
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
    // Whether a wait that has polled for `waited` yields between its further polls: it polled
    // `reactor_options::yield_after`, or this thread's last yield gave the processor away (the
    // peer it waits for likely shares the processor, and a poll cannot see it answer before
    // it runs: a pair on one processor otherwise spends `yield_after` at every wait, 16 us a
    // hand-over in all, and takes milliseconds to count the hand-overs that move it).
    bool polled_long_enough(std::chrono::steady_clock::duration waited) const noexcept {
        return !options_.busy_poll_when_crowded &&
               (waited >= options_.yield_after || handover_streak_ > 0);
    }
    // sched_yield between polls; where many yields give the processor to another task, on a
    // host whose runnable tasks leave a processor idle, moves this thread to another of its
    // processors (`reactor_stats::moves`).
    void yield_processor() noexcept;
    // A yield that took `handover_time()` gave the processor away (4 us, a fixed value long
    // ago, missed every hand-over of a release build's ping-pong on a Xeon of model 207), and
    // this many such of `yield_window` yields, the peer shares this processor (a
    // ping-pong on one processor hands over at one yield in three or more; ranks on
    // processors of their own, only when some other task takes theirs for a moment).
    static constexpr int yield_window = 64;
    static constexpr int handovers_to_move = 16;
    // ... the last this many of them included.
    static constexpr int handover_streak = 4;
    // So many hand-overs in a row decide at once, before the window ends.
    static constexpr int handovers_in_a_row = 8;
    // The least time between two moves: where this job's ranks outnumber the processors, and
    // elsewhere (a move at start-up, before the scheduler put the pair together again, held
    // the next one off for 10 ms: 4 jobs of 12 ran together for 770-950 ping-pongs).
    static constexpr std::chrono::milliseconds crowded_move_interval{10};
    static constexpr std::chrono::milliseconds move_interval{1};
    // The least time between two looks at the host's runnable tasks (`room_elsewhere`), made
    // at a decision: a streak of hand-overs to another program decides at every yield.
    static constexpr std::chrono::microseconds look_interval{100};
    // A decided move waits 1 to this many yields (`yield_processor`).
    static constexpr int move_stagger = 32;
    // False where the host's runnable tasks, read now, outnumber its processors: every
    // processor has work, and a move would crowd another. (Where they cannot be read, or the
    // process may not use every processor of the host: whether this job's ranks leave a
    // processor free, `crowded`.)
    static bool room_elsewhere() noexcept;
    // Bars this thread from its processor and lets it back (it is migrated at once and stays);
    // counts the move.
    void move_elsewhere(std::chrono::steady_clock::time_point now) noexcept;

    // Submits and sleeps in the kernel until a completion or for `d`, whichever is first.
    void wait_at_most(std::chrono::steady_clock::duration d) noexcept;

    // Whether the kernel says it holds completions for us (task work to run, or an overflowed
    // completion queue): read from the ring's flags where `features_.taskrun_flag`.
    bool kernel_holds_completions() const noexcept;

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
    int yields_seen_ = 0;      // of the current window of `yield_window`
    int handovers_ = 0;        // of those, yields that gave the processor away
    int handover_streak_ = 0;  // such yields in a row, the last one included
    // Yields in a row, the last one included, that returned at once: nothing else wanted this
    // processor (at most `quick_yields_to_thin`).
    int quick_yields_ = 0;
    // So many quick yields in a row, and a watched wait yields at one full turn in
    // `busy_turns` + 1 only (`wait_while_watching`): a sched_yield that hands the processor
    // to nobody still costs a system call, and a message that lands meanwhile waits for it.
    static constexpr int quick_yields_to_thin = 4;
    // Turns between full turns while busy polling (each one `tight_polls` looks).
    static constexpr unsigned busy_turns = 15;
    std::chrono::steady_clock::time_point last_move_{};
    // The last decision that looked for room elsewhere (`room_elsewhere`): at most one a
    // `look_interval`.
    std::chrono::steady_clock::time_point last_look_{};
    int move_in_ = 0;  // yields until a decided move is made; 0: none decided
    std::chrono::steady_clock::time_point last_enter_{};
    reactor_stats stats_;
    int depth_ = 0;
    corocoll::async_scope adopted_;
};

}  // namespace io

COROCOLL_END_NAMESPACE

#include <corocoll/io/detail/basic_op.hpp>
#include <corocoll/io/detail/reactor_ops.hpp>

#if COROCOLL_DEFINE_BODIES
#include <corocoll/io/impl/reactor.ipp>
#endif
