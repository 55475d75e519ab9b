// The bodies of the non-template functions declared in <corocoll/io/reactor.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/cheapest.hpp>
#include <corocoll/io/reactor.hpp>

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
    handover_time();  // read once, here rather than at the first yield of some wait
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
    loadavg_fd();  // opened now, not while the loop runs (`host_busy`, moves)
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
    const int running = runnable_tasks();
    if (running < 0) return busy.load(std::memory_order_relaxed);
    const int over = running > processors()
                         ? std::min(looks_over.load(std::memory_order_relaxed) + 1, host_busy_looks)
                         : 0;
    looks_over.store(over, std::memory_order_relaxed);
    const bool now_busy = over >= host_busy_looks;
    busy.store(now_busy, std::memory_order_relaxed);
    return now_busy;
}

COROCOLL_DECL int reactor::runnable_tasks() noexcept {
    // "0.52 0.58 0.59 3/128 4242": the fourth field is runnable/all.
    char text[128];
    ssize_t n = -1;
    if (int fd = loadavg_fd(); fd >= 0) n = ::pread(fd, text, sizeof(text) - 1, 0);
    if (n <= 0) return -1;
    text[n] = '\0';
    int fields = 0;
    const char* p = text;
    while (*p != '\0' && fields < 3) {
        if (*p++ == ' ') ++fields;
    }
    return std::atoi(p);
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

COROCOLL_DECL std::chrono::nanoseconds reactor::handover_time() noexcept {
    static const std::chrono::nanoseconds least_handover = [] {
        const auto call = corocoll::detail::cheapest_of(64, [] {
            ::syscall(SYS_getppid);
            return true;
        });
        return std::max<std::chrono::nanoseconds>(std::chrono::microseconds(1), 2 * call);
    }();
    return least_handover;
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
    // IORING_SETUP_TASKRUN_FLAG (5.19) goes with each task-run set-up where allowed, and is
    // dropped first where the kernel rejects it.
    const unsigned attempts[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_SUBMIT_ALL |
            IORING_SETUP_TASKRUN_FLAG,
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_SUBMIT_ALL,
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL |
            IORING_SETUP_TASKRUN_FLAG,
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL,
        IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_TASKRUN_FLAG,
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
            features_.taskrun_flag = (flags & IORING_SETUP_TASKRUN_FLAG) != 0;
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

COROCOLL_DECL int reactor::loadavg_fd() noexcept {
    static const int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    return fd;
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
    // With deferred task work, completions that wait on the kernel's side (a receive whose
    // data came after it was armed) are posted only when we ask for events; a plain submit
    // posts only the operations that complete at once. The loop reaps as long as completions
    // keep coming and submits (here) when the queue is full, so without asking, sockets whose
    // data is always there at submission (a busy store client) would be served again and
    // again while the others' completions waited: a store of 10,000 clients showed p50 2 ms
    // and p99 2 s (benchmarks/store_load.cpp) until this asked for events too.
    int rc;
    do {
        rc = features_.defer_taskrun ? io_uring_submit_and_get_events(&ring_)
                                     : io_uring_submit(&ring_);
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

COROCOLL_DECL bool reactor::kernel_holds_completions() const noexcept {
    // Raised by the kernel (IORING_SETUP_TASKRUN_FLAG) when it queues task work that posts
    // completions, cleared when that work runs; an overflowed queue wants an entry too.
    return (IO_URING_READ_ONCE(*ring_.sq.kflags) & (IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW)) !=
           0;
}

COROCOLL_DECL void reactor::submit_and_collect() noexcept {
    if (features_.defer_taskrun || features_.coop_taskrun) {
        ++stats_.enters;  // (a plain ring's submit enters only with something to submit)
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
        const bool yield = yield_between_polls() || polled_long_enough(idle);
        if (!yield) busy_turns_left_ = busy_turns;
        ++stats_.polls;
        // Entering the kernel costs much more than a poll of shared memory (0.2-1 µs), and a
        // message that lands meanwhile waits for it: only when there is something to submit
        // or the kernel holds completions for us (the completions of a task-run ring appear
        // only then), or, where the ring cannot say so, every 10 µs.
        if (io_uring_sq_ready(&ring_) > 0 ||
            (features_.taskrun_flag ? kernel_holds_completions()
                                    : now - last_enter_ >= std::chrono::microseconds(10))) {
            last_enter_ = now;
            submit_and_collect();
        }
        if (yield) {
            yield_processor();
            // Where the last yields all came back at once (the job's other ranks, or the other
            // programs, asleep or on other processors), yielding at every turn gives the
            // processor to nobody: 4 ranks on 2 processors, two of them ping-ponging while the
            // others slept in a barrier, yielded at every poll, 1.3 times a message. The
            // turns up to the next full one just look; a task that wakes up here waits for
            // them at most (about 5 us: reactor_test's wait made 65,585 polls in 20 ms on an
            // AMD EPYC VM), and then its first yield hands over again.
            if (quick_yields_ >= quick_yields_to_thin) busy_turns_left_ = busy_turns;
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

COROCOLL_DECL void reactor::yield_processor() noexcept {
    ++stats_.yields;
    const auto before = std::chrono::steady_clock::now();
    sched_yield();
    // A sched_yield with nothing else to run here returns within a microsecond or so; one
    // that took longer gave the processor to another task for a while.
    const auto back = std::chrono::steady_clock::now();
    if (back - before >= handover_time()) {
        ++handovers_;
        // Saturated: a rank that shares its processor for hours hands over at every yield.
        if (handover_streak_ < handovers_in_a_row) ++handover_streak_;
        quick_yields_ = 0;
    } else {
        handover_streak_ = 0;
        if (quick_yields_ < quick_yields_to_thin) ++quick_yields_;
    }
    if (move_in_ > 0) {
        // A move was decided: it is made after a few more yields, if they handed over too.
        if (--move_in_ == 0 && handover_streak_ >= handover_streak && room_elsewhere()) {
            move_elsewhere(back);
        }
        return;
    }
    // (A streak may go on for long, past a look that found no room: at most one look per
    // `look_interval` for streaks; a window's end is 64 yields after the last.)
    const bool in_a_row =
        !crowded() && handover_streak_ >= handovers_in_a_row && back - last_look_ >= look_interval;
    if (++yields_seen_ < yield_window && !in_a_row) return;
    // The last few yields handed over too: a peer that has just moved away leaves this one
    // alone on its processor, and its quick yields keep it from following.
    const bool shared =
        in_a_row || (handovers_ >= handovers_to_move && handover_streak_ >= handover_streak);
    yields_seen_ = handovers_ = 0;
    if (!shared) return;
    // Handed over at a good part of its yields, on a host whose runnable tasks do not outnumber
    // its processors: the task that ran is most likely the peer this loop waits for (each answer
    // needs it to run), sharing this processor while another may stand idle. The scheduler
    // keeps such a pair together a long time (each one's wake-ups pull the other back; tasks
    // that ran moments ago count as cache-hot and are not moved), so the thread moves itself:
    // barred from this processor it is migrated at once, and let back it stays where it went.
    // Only the one that runs moves; its peer then has the processor to itself and stops seeing
    // hand-overs. Where other programs keep every processor busy a move gains nothing and
    // crowds another: the host's runnable tasks, read now, tell (more than its processors:
    // every processor has work). Without that look, a `yes` loop beside a 2-rank coll_perf
    // all_gather of 4 B-1 MiB made 464-615 migrations instead of 114-190 once hand-overs in a
    // row decided, and every size but one ran slower. (Not `host_busy`, which takes three
    // looks 10 ms apart: two ranks on one processor and a moment's third task look busy, and
    // that is when a move helps.) Where the job's ranks outnumber the processors (`crowded`),
    // a move helps only while some of them sleep: two ranks that ping-pong while the others
    // wait in a barrier leave processors idle, and the scheduler keeps the pair together as
    // above (coll_perf --nproc 4 --coll ping_pong on 2 processors: 1.45 or 2.4 us per message
    // in 7 runs of 10, against 0.7 apart).
    if (back - last_move_ < (crowded() ? crowded_move_interval : move_interval)) return;
    last_look_ = back;
    if (!room_elsewhere()) return;
    // The pair's windows end together (their yields alternate), so both would decide at once,
    // and a peer that moves while this one's last yields hand over to it moves it too: both
    // land on the same processor again (3 jobs in 40 of shm_test's, each a move 10 ms
    // later at best). Each waits a yield count of its own, from the clock's low bits, and moves
    // only if its yields still hand over then: the first one's move ends the other's streak.
    move_in_ = 1 + static_cast<int>((back.time_since_epoch().count() >> 4) % move_stagger);
}

COROCOLL_DECL bool reactor::room_elsewhere() noexcept {
    // /proc/loadavg counts the whole host's tasks: they say whether this job's processors have
    // room only where the job may use every processor of the host (not under a cpuset or
    // taskset that leaves it a few, where other jobs' tasks elsewhere would bar every move).
    static const bool whole_host = processors() >= ::get_nprocs();
    const int running = whole_host ? runnable_tasks() : -1;
    return running >= 0 ? running <= processors() : !crowded();
}

COROCOLL_DECL void reactor::move_elsewhere(std::chrono::steady_clock::time_point now) noexcept {
    // A move that cannot be made counts as one too: the next try waits as long.
    last_move_ = now;
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || CPU_COUNT(&allowed) < 2) return;
    const int here = ::sched_getcpu();
    if (here < 0 || !CPU_ISSET(here, &allowed)) return;
    cpu_set_t elsewhere = allowed;
    CPU_CLR(here, &elsewhere);
    if (::sched_setaffinity(0, sizeof(elsewhere), &elsewhere) != 0) return;
    ::sched_setaffinity(0, sizeof(allowed), &allowed);
    ++stats_.moves;
}

COROCOLL_DECL bool reactor::poll_briefly(bool yield) noexcept {
    // Deferred or cooperative task work (the completions) runs only when we enter the
    // kernel; a plain ring's completions just appear. The first entry also submits.
    bool enter = features_.defer_taskrun || features_.coop_taskrun;
    submit_and_collect();
    const auto start = std::chrono::steady_clock::now();
    const auto until = start + options_.busy_poll;
    for (;;) {
        ++stats_.polls;
        if (io_uring_cq_ready(&ring_) > 0) return true;
        if (posted_.load(std::memory_order_acquire) != nullptr) return true;
        auto now = std::chrono::steady_clock::now();
        if (!timers_.empty() && timers_.front()->when <= now) return true;
        if (now >= until) return false;
        // At every step, the flag or not: the entry runs the task work that posts a socket's
        // completion at once. Entering only on the flag made a 2-rank TCP ping-pong of 4 B
        // 6% slower (10.27 µs against 9.64, medians of 8 runs; AMD EPYC, 1 µs system calls):
        // past `yield_after` the wait then sat in sched_yield calls instead.
        if (enter) {
            ++stats_.enters;
            io_uring_get_events(&ring_);
        }
        if (yield || polled_long_enough(now - start)) yield_processor();
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
