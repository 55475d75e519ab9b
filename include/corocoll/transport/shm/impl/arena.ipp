// The bodies of the non-template functions declared in <corocoll/transport/shm/arena.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/shm/arena.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

COROCOLL_DECL shm_arena::shm_arena(void* mapping, std::size_t bytes, int rank)
    : base_(static_cast<std::byte*>(mapping)), bytes_(bytes), rank_(rank) {
    const auto* h = reinterpret_cast<const detail::arena_header*>(base_);
    size_ = static_cast<int>(h->ranks);
    set_bytes_ = static_cast<std::size_t>(h->set_bytes);
    steps_ = detail::arena_steps_for(size_);
    rank_bytes_ = rank_bytes(size_);
    data_ = base_ + data_offset(size_);
    for (std::size_t u = 0; u < single_copy_uses; ++u) {
        single_copy_from_[u] = static_cast<std::size_t>(h->single_copy_from[u]);
        single_copy_below_[u] = std::size_t{h->single_copy_below_kib[u]} << 10;
    }
    l2_bytes_ = static_cast<std::size_t>(h->l2_bytes);
    step_ = 0;
    for (std::uint64_t k = 0; k < steps_; ++k) {
        step_ = std::max(step_, place(rank_, k).arrived.load(std::memory_order_relaxed));
    }
    line(rank_).pid = static_cast<std::int64_t>(::getpid());
    wakes_ = line(rank_).wakes.load(std::memory_order_relaxed);
    missing_.reserve(static_cast<std::size_t>(size_));
    seen_steps_.assign(static_cast<std::size_t>(size_), 0);
}

COROCOLL_DECL shm_arena::~shm_arena() {
    if (futex_armed_) {
        if (futex_reactor_->withdraw(*futex_)) {
            futex_armed_ = false;  // it never reached the ring
        } else {
            // Woken now, before the word is unmapped; it completes later, and frees itself.
            futex_->self = nullptr;
            io::futex_wake(*futex_word_, INT_MAX);
            (void)futex_.release();
        }
    }
    ::munmap(base_, bytes_);
}

COROCOLL_DECL task<> shm_arena::close() {
    if (!futex_armed_) co_return;
    if (futex_reactor_->withdraw(*futex_)) {
        futex_armed_ = false;  // it never reached the ring
        co_return;
    }
    // A wake reaches the wait only once the reactor has handed it to the kernel (its next
    // entry, the sleep below at the latest): wake until it completes.
    for (int i = 0; futex_armed_ && i < 1000; ++i) {
        io::futex_wake(*futex_word_, INT_MAX);
        co_await futex_reactor_->sleep_for(std::chrono::milliseconds(1));
    }
}

COROCOLL_DECL void shm_arena::publish_arrival() noexcept {
    place(rank_, step_).arrived.store(step_, std::memory_order_release);
    prepare_place(step_ + 2);
    small_written_ = 0;
    wake_sleepers();
}

COROCOLL_DECL void shm_arena::prepare_place(std::uint64_t s) noexcept {
    const auto* p = reinterpret_cast<const std::byte*>(&place(rank_, s));
    const std::size_t lines = lines_prepared_for(small_written_);
    for (std::size_t i = 0; i < lines; ++i) prefetch_for_write(p + i * 64);
}

COROCOLL_DECL void shm_arena::wake_sleepers() noexcept {
    detail::arena_line& l = line(rank_);
    // A plain look, as the store before it is (a sequentially consistent pair would cost
    // every call a locked instruction): a rank that raised `sleepers` just as this one came
    // may go unseen, and its own look may miss the arrival too; the short nap it takes as it
    // goes to sleep (`step_wait::nap`) ends that one.
    if (l.sleepers.load(std::memory_order_relaxed) == 0 ||
        l.sleepers.exchange(0, std::memory_order_acq_rel) == 0) {
        return;
    }
    // `wakes` changes before the wake: a futex wait that reaches the kernel after the wake
    // sees the change and does not sleep.
    l.wakes.store(++wakes_, std::memory_order_seq_cst);
    io::futex_wake(l.wakes, INT_MAX);
}

COROCOLL_DECL bool shm_arena::prepare_futex_sleep(io::reactor& r, int m, std::uint64_t s,
                                                  bool& fresh) noexcept {
    detail::arena_line& l = line(m);
    fresh = false;
    if (futex_armed_) {
        // One wait at a time. On m's word it is still good: m's next arrival ends it. On
        // another's, that rank has arrived since and woke it: its completion is on the way.
        return futex_word_ == &l.wakes;
    }
    if (!futex_) {
        futex_ = std::unique_ptr<futex_op>(new (std::nothrow) futex_op);
        if (!futex_) return false;
        futex_->self = this;
        futex_->prepare_ = &prepare_futex;
        futex_->complete_ = &complete_futex;
        futex_reactor_ = &r;
    }
    if (futex_reactor_ != &r) return false;  // a wait set up on another reactor
    const std::uint32_t seen = l.wakes.load(std::memory_order_seq_cst);
    l.sleepers.store(1, std::memory_order_seq_cst);
    if (reached(m, s, std::memory_order_seq_cst)) return false;
    futex_word_ = &l.wakes;
    futex_expected_ = seen;
    futex_armed_ = true;
    fresh = true;
    r.submit(*futex_);
    r.note_futex_sleep();
    return true;
}

COROCOLL_DECL void shm_arena::prepare_futex(io::detail::io_op* op, io_uring* ring) noexcept {
    auto* f = static_cast<futex_op*>(op);
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    io::detail::prep_futex_wait(sqe, *f->self->futex_word_, f->self->futex_expected_);
    io_uring_sqe_set_data(sqe, op);
}

COROCOLL_DECL void shm_arena::complete_futex(io::detail::io_op* op, int res) noexcept {
    auto* f = static_cast<futex_op*>(op);
    if (f->self == nullptr) {
        delete f;  // its arena is gone
        return;
    }
    f->self->futex_armed_ = false;
    // Probed, yet refused (a kernel that forbids it for this mapping): pauses it is.
    if (res == -EINVAL || res == -EOPNOTSUPP || res == -ENOSYS) f->self->futex_refused_ = true;
}

COROCOLL_DECL void shm_arena::offer(const void* at, std::size_t bytes) noexcept {
    std::uint64_t words[2] = {reinterpret_cast<std::uintptr_t>(at), bytes};
    std::memcpy(small(rank_, next_step()), words, sizeof(words));
}

COROCOLL_DECL void shm_arena::copy_from(engine& e, const collective_meta& meta, int r,
                                        std::uint64_t s, std::size_t offset,
                                        std::span<std::byte> to, bool backward) {
    std::uint64_t words[2];
    std::memcpy(words, small(r, s), sizeof(words));
    std::string why;
    if (offset > words[1] || to.size() > words[1] - offset) {
        why = "rank " + std::to_string(r) + " offered " + std::to_string(words[1]) +
              " bytes, not " + std::to_string(offset + to.size());
    }
    const auto pid = static_cast<pid_t>(line(r).pid);
    const std::uintptr_t base = words[0] + offset;
    // After a process_vm_readv that failed (`got` <= 0, errno): a killed rank fails the group
    // naming it; any other reason goes in `why`.
    auto failed = [&](ssize_t got) {
        const int err = got < 0 ? errno : EIO;
        if (err == ESRCH && line(r).withdrawn.load(std::memory_order_seq_cst) < s) {
            // Killed: its pair's channel will say so too, but this copy found out first.
            e.peer_gone(r, "its process is gone (process_vm_readv: no such process)");
            e.raise_if_failed(meta, "copying through shared memory");
        }
        why = "copying rank " + std::to_string(r) + "'s buffer (process_vm_readv): " +
              std::error_code(err, std::system_category()).message();
    };
    // `n` bytes at `from` of r's buffer into `into`.
    auto read = [&](std::byte* into, std::size_t from, std::size_t n) {
        for (std::size_t done = 0; why.empty() && done < n;) {
            iovec local{into + done, n - done};
            iovec remote{reinterpret_cast<void*>(base + from + done), n - done};
            ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
            if (got <= 0) {
                failed(got);
            } else {
                done += static_cast<std::size_t>(got);
            }
        }
    };
    // Where the kernel's copy into `to` would sit at a slow offset: each piece into the bounce
    // buffer at the place in a page that r's bytes have, then into `to` by lines (at the same
    // slow offset: memcpy would be slow there too), the pieces in the order of the sweep.
    auto read_by_bounce = [&] {
        if (!bounce_) bounce_.reset(new std::byte[sweep_piece_bytes + 2 * 4096]);
        const auto page_of_bounce =
            (reinterpret_cast<std::uintptr_t>(bounce_.get()) + 4095) & ~std::uintptr_t{4095};
        const std::size_t pieces = (to.size() + sweep_piece_bytes - 1) / sweep_piece_bytes;
        for (std::size_t k = 0; k < pieces && why.empty(); ++k) {
            const std::size_t i = backward ? pieces - 1 - k : k;
            const std::size_t from = i * sweep_piece_bytes;
            const std::size_t len = std::min(sweep_piece_bytes, to.size() - from);
            auto* landing = reinterpret_cast<std::byte*>(page_of_bounce + ((base + from) & 4095));
            read(landing, from, len);
            if (why.empty()) corocoll::detail::copy_by_lines(to.data() + from, landing, len);
        }
    };
    const auto& probe = corocoll::detail::machine_copy_probe();
    // Above MAX_RW_COUNT (2 GiB less a page) the kernel copies part of one call only.
    constexpr std::size_t one_call_most = 0x7ffff000;
    if (why.empty() && probe.misaligned_slow && to.size() >= corocoll::detail::copy_by_lines_from &&
        corocoll::detail::slow_copy_offset(to.data(), reinterpret_cast<const void*>(base))) {
        read_by_bounce();
    } else if (why.empty() && backward && to.size() > sweep_piece_bytes &&
               to.size() <= one_call_most) {
        // One call, its pieces listed from the last (at most `most` of them).
        constexpr std::size_t most = 64;
        const std::size_t piece = std::max(sweep_piece_bytes, (to.size() + most - 1) / most);
        iovec local[most], remote[most];
        std::size_t k = 0;
        for (std::size_t end = to.size(); end > 0; ++k) {
            const std::size_t from = end > piece ? end - piece : 0;
            local[k] = {to.data() + from, end - from};
            remote[k] = {reinterpret_cast<void*>(base + from), end - from};
            end = from;
        }
        ssize_t got = ::process_vm_readv(pid, local, k, remote, k, 0);
        if (got <= 0) {
            failed(got);
        } else if (static_cast<std::size_t>(got) < to.size()) {
            // Cut short (a fault on the way): all of it again, forward.
            read(to.data(), 0, to.size());
        }
    } else {
        read(to.data(), 0, to.size());
    }
    // A copy that failed or ran while r withdrew its buffer: r left the call with an error
    // (its own, or a failure it saw first: a third rank's death) and may have freed the
    // buffer or ended since (EFAULT, ESRCH). That error, which r left beside its channel, is
    // the cause here too; its leaving is not.
    if (line(r).withdrawn.load(std::memory_order_seq_cst) >= s) {
        if (e.fail_as_left_by(r)) e.raise_if_failed(meta, "copying through shared memory");
        why = "rank " + std::to_string(r) + " left the call while its buffer was being copied";
    }
    if (why.empty()) return;
    e.abandon("rank " + std::to_string(rank_) + ": collective #" + std::to_string(meta.seq) + " " +
              e.describe(meta) + ": " + why);
    e.raise_if_failed(meta, "copying through shared memory");
}

COROCOLL_DECL void shm_arena::announce(const collective_meta& m) noexcept {
    detail::arena_line& l = line(rank_);
    std::uint64_t words[4];
    std::memcpy(words, &m, sizeof(words));
    std::uint64_t v = l.version.load(std::memory_order_relaxed);
    l.version.store(v + 1, std::memory_order_relaxed);
    // Release: a reader that sees any new word sees the odd version too.
    for (int i = 0; i < 4; ++i) l.current[i].store(words[i], std::memory_order_release);
    l.version.store(v + 2, std::memory_order_release);
    // A rank asleep until this one comes looks at its call again (one that differs from its
    // own fails the group).
    wake_sleepers();
}

COROCOLL_DECL bool shm_arena::announced(int r, collective_meta& out) const noexcept {
    const detail::arena_line& l = line(r);
    std::uint64_t before = l.version.load(std::memory_order_acquire);
    if (before % 2 != 0) return false;
    std::uint64_t words[4];
    // Acquire: the second look at the version cannot come before these.
    for (int i = 0; i < 4; ++i) words[i] = l.current[i].load(std::memory_order_acquire);
    if (l.version.load(std::memory_order_relaxed) != before) return false;
    std::memcpy(&out, words, sizeof(words));
    return true;
}

COROCOLL_DECL shm_arena::step_wait shm_arena::arrive(engine& e, const collective_meta& meta,
                                                     std::chrono::steady_clock::time_point deadline,
                                                     bool check, int only) {
    ++step_;
    publish_arrival();
    if (only >= 0) {
        // Waiting for one rank says nothing of the others: what this rank writes next waits
        // for them first (`settle`).
        pending_ = step_;
        pending_check_ = false;
    }
    return {*this, e, meta, step_, deadline, check, only};
}

COROCOLL_DECL void shm_arena::arrive_and_go(engine& e, const collective_meta& meta, bool check) {
    ++step_;
    publish_arrival();
    pending_ = step_;
    pending_check_ = check;
    pending_meta_ = meta;
    // Compared already where `will_go_on` said this step (this rank's own `went_on` shows it).
    if (check && line(rank_).went_on.load(std::memory_order_relaxed) != step_) {
        compare_going_on(e, meta, step_);
    }
}

COROCOLL_DECL void shm_arena::will_go_on(engine& e, const collective_meta& meta) {
    compare_going_on(e, meta, next_step());
}

COROCOLL_DECL void shm_arena::compare_going_on(engine& e, const collective_meta& meta,
                                               std::uint64_t s) {
    // Of two ranks that both go on at this step, at least one sees the other's `went_on`
    // (sequentially consistent, the store and the looks) and compares their calls. A rank
    // that waits here compares its call with those it waits for (step_wait::await_resume).
    line(rank_).went_on.store(s, std::memory_order_seq_cst);
    for (int r = 0; r < size_; ++r) {
        if (r == rank_ || line(r).went_on.load(std::memory_order_seq_cst) < s) continue;
        // r goes on at this step or went on at a later one (then it passed this one). It is
        // at most steps_ - 1 steps ahead (settle_lines): once it arrived here, its place
        // for this step holds its call. Before that it is between its own `will_go_on` and
        // its arrival, in the call it announced (it announces the next only after arriving:
        // the second look tells).
        collective_meta theirs;
        if (!reached(r, s, std::memory_order_acquire)) {
            const bool known = announced(r, theirs);
            if (!reached(r, s, std::memory_order_acquire)) {
                if (known && !e.check_call(r, meta, theirs)) return;
                continue;
            }
        }
        if (!e.check_call(r, meta, this->meta(r, s, meta))) return;
    }
}

COROCOLL_DECL shm_arena::step_wait shm_arena::settle(
    engine& e, std::chrono::steady_clock::time_point deadline) {
    // Step 0 is complete from the start: nothing pending waits for nothing. The calls are
    // compared at the last step gone past only: no rank has written its place again since
    // (this rank has not arrived at the next step).
    std::uint64_t s = std::exchange(pending_, 0);
    if (s <= confirmed_) s = 0;
    return {*this, e, pending_meta_, s, deadline, s != 0 && pending_check_, -1};
}

COROCOLL_DECL bool shm_arena::lines_settled() noexcept {
    // The next step's place was last used by step next - steps_, which every rank is
    // done with once it arrived at the step after. Nothing to read where every rank was seen
    // that far.
    const std::uint64_t next = next_step();
    const std::uint64_t s = next > steps_ ? next - steps_ + 1 : 0;
    if (s <= confirmed_) return true;
    // Where a rank's line must be read, it must show that rank half the places behind at
    // most, as `settle_lines` then waits for (s > 0: next >= steps_). A look that found it
    // only just far enough would be needed again at the very next call, at the line that
    // rank has just written: a transfer at each call, and each of its later writes of that
    // place would take the line back first. Half the places: the next steps_ / 2 calls
    // read nothing of it. (The last look at r's place for this rank's latest step, first,
    // may show r further still.)
    const std::uint64_t half = std::max(s, next - steps_ / 2);
    for (int r = 0; r < size_; ++r) {
        if (r == rank_ || seen_steps_[static_cast<std::size_t>(r)] >= s) continue;
        if (!seen_at(r, half, step_)) return false;
    }
    return true;
}

COROCOLL_DECL shm_arena::step_wait shm_arena::settle_lines(
    engine& e, const collective_meta& meta, std::chrono::steady_clock::time_point deadline) {
    // The calls of the steps gone past are not compared again here: whoever arrived at them
    // after this rank compared its call with this rank's then (of two that went on, one saw
    // the other). Where some rank is not yet where `lines_settled` asks, wait until every
    // rank is at most half the places behind: the calls that follow then run without a look
    // at the others' lines, where a wait for the oldest place alone would look again at the
    // very next call.
    const std::uint64_t next = next_step();
    const std::uint64_t s = lines_settled() ? 0 : std::max(next - steps_ + 1, next - steps_ / 2);
    return {*this, e, meta, s, deadline, false, -1};
}

COROCOLL_DECL bool shm_arena::step_wait::complete() noexcept {
    if (e_.failed()) return true;
    // `settle` with nothing pending: no other rank's line to read.
    if (step_ == 0) return true;
    if (only_ >= 0) return a_.seen_at(only_, step_);
    for (; seen_ < a_.size_; ++seen_) {
        if (seen_ == a_.rank_) continue;
        if (!a_.seen_at(seen_, step_)) return false;
    }
    return true;
}

COROCOLL_DECL void shm_arena::step_wait::await_suspend(std::coroutine_handle<> h) {
    handle_ = h;
    poll = &poll_fn;
    prepare_sleep = a_.futex_usable(e_.reactor()) ? &prepare_sleep_fn : nullptr;
    list_missing();
    e_.begin_shared_wait(a_.missing_);
    timer_.w = this;
    timer_.when = deadline_;
    timer_.fire = &on_deadline;
    e_.reactor().arm(timer_);
    e_.reactor().watch(*this);
    e_.reactor().note_progress();
}

COROCOLL_DECL void shm_arena::step_wait::finish() noexcept {
    e_.reactor().unwatch(*this);
    e_.reactor().disarm(timer_);
    e_.reactor().disarm(nap_);
    e_.end_shared_wait(!e_.failed());
    std::exchange(handle_, {}).resume();
}

COROCOLL_DECL void shm_arena::step_wait::look_for_other_calls() noexcept {
    for (int r : a_.missing_) {
        collective_meta theirs;
        if (!a_.announced(r, theirs) || theirs.seq != meta_.seq || theirs == meta_) continue;
        try {
            e_.check_call(r, meta_, theirs);  // fails the group, naming both calls
        } catch (const std::exception&) {
            // Out of memory for the text: the deadline still ends the wait.
        }
        return;
    }
}

COROCOLL_DECL void shm_arena::step_wait::list_missing() noexcept {
    listed_from_ = seen_;
    a_.missing_.clear();
    if (only_ >= 0) {
        a_.missing_.push_back(only_);
        return;
    }
    for (int r = seen_; r < a_.size_; ++r) {
        if (r != a_.rank_ && !a_.reached(r, step_, std::memory_order_relaxed))
            a_.missing_.push_back(r);
    }
}

COROCOLL_DECL bool shm_arena::step_wait::poll_fn(io::poll_entry& e) noexcept {
    auto& w = static_cast<step_wait&>(e);
    if (!w.complete()) {
        // What a status answer says this rank waits for follows the arrivals.
        if (w.seen_ != w.listed_from_) w.list_missing();
        // Now and then: is a rank that has not come in another collective of this number?
        if (++w.polls_ % 64 == 0) w.look_for_other_calls();
        return false;
    }
    w.finish();
    return true;
}

COROCOLL_DECL bool shm_arena::step_wait::prepare_sleep_fn(io::poll_entry& e) noexcept {
    auto& w = static_cast<step_wait&>(e);
    if (w.complete()) return false;  // (or the group failed): the next poll finishes it
    bool fresh = false;
    const int m = w.only_ >= 0 ? w.only_ : w.seen_;
    if (!w.a_.prepare_futex_sleep(w.e_.reactor(), m, w.step_, fresh)) return false;
    if (fresh && !w.nap_.armed()) {
        // The rare arrival that neither side saw (see `wake_sleepers`) costs this long at most.
        w.nap_.when = std::chrono::steady_clock::now() + nap;
        w.nap_.fire = [](io::timer_entry&) noexcept {};
        try {
            w.e_.reactor().arm(w.nap_);
        } catch (const std::exception&) {
            return false;  // out of memory for the timer heap: no sleep then
        }
    }
    // Asleep, nothing polls: a rank not there yet that runs another collective of this number
    // is looked for now (the rank slept on wakes this one when it announces a call later).
    if (w.seen_ != w.listed_from_) w.list_missing();
    w.look_for_other_calls();
    return !w.e_.failed();
}

COROCOLL_DECL void shm_arena::step_wait::on_deadline(io::timer_entry& t) noexcept {
    step_wait& w = *static_cast<deadline_hook&>(t).w;
    int culprit = w.only_ >= 0 ? w.only_ : w.seen_ < w.a_.size_ ? w.seen_ : 0;
    try {
        w.e_.shared_wait_expired(culprit, "collective #" + std::to_string(w.meta_.seq) + " " +
                                              w.e_.describe(w.meta_) + " (shared memory, step " +
                                              std::to_string(w.step_) + "), waiting for rank " +
                                              std::to_string(culprit));
    } catch (const std::exception&) {
        w.e_.abandon("rank " + std::to_string(w.a_.rank_) +
                     " timed out in a shared-memory collective");
    }
}

COROCOLL_DECL void shm_arena::step_wait::await_resume() {
    static constexpr const char* where = "waiting at a shared-memory step";
    if (e_.failed()) e_.raise_if_failed(meta_, where);
    if (only_ < 0) a_.confirmed_ = std::max(a_.confirmed_, step_);
    if (!check_) return;
    for (int r = 0; r < a_.size_; ++r) {
        if (r == a_.rank_ || (only_ >= 0 && r != only_)) continue;
        if (!e_.check_call(r, meta_, a_.meta(r, step_, meta_))) e_.raise_if_failed(meta_, where);
    }
}

}  // namespace transport

COROCOLL_END_NAMESPACE
