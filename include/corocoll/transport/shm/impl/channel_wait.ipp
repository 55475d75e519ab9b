// The bodies of <corocoll/transport/shm/channel.hpp>'s waiting: a side that sleeps raises its
// `asleep` flag and waits on a futex or the socket; the peer wakes it after a store it must see.
// Inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/shm/channel.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

COROCOLL_DECL void shm_channel::wake_peer_if_asleep() noexcept {
    auto& flag = seg_->asleep[1 - side_].value;
    if (flag.load(std::memory_order_seq_cst) == 0) return;
    if (flag.exchange(0, std::memory_order_acq_rel) == 0) return;
    if (seg_->futex_sleeper[1 - side_].load(std::memory_order_relaxed) != 0) {
        io::futex_wake(flag, 1);
        return;
    }
    char byte = 1;
    // A full socket buffer means wake-ups are already queued; the peer needs just one.
    [[maybe_unused]] auto n = ::send(fd_, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

COROCOLL_DECL void shm_channel::wait::await_suspend(std::coroutine_handle<> h) {
    handle = h;
    run_ = [](corocoll::detail::work_item* item) noexcept {
        static_cast<wait*>(item)->handle.resume();
    };
    (for_room ? ch.writer_ : ch.reader_) = this;
    ch.reactor_.watch(ch.entry_);
    if (o.deadline != io::op_options::time_point::max()) {
        timer.when = o.deadline;
        timer.w = this;
        timer.fire = [](io::timer_entry& t) noexcept {
            wait* w = static_cast<deadline_hook&>(t).w;
            w->ch.finish(*w, std::errc::timed_out);
        };
        ch.reactor_.arm(timer);
    }
    if (o.stop.stop_possible()) stopping.emplace(o.stop, on_stop{this});
}

COROCOLL_DECL void shm_channel::wait::await_resume() {
    stopping.reset();
    if (error) {
        corocoll::detail::throw_error(
            error, std::string("corocoll: ") + (for_room ? "send to" : "recv from") + " shm");
    }
}

COROCOLL_DECL void shm_channel::finish(wait& w, std::error_code error) noexcept {
    wait*& slot = w.for_room ? writer_ : reader_;
    if (slot != &w) return;
    slot = nullptr;
    reactor_.disarm(w.timer);
    w.error = error;
    reactor_.post(w);
}

COROCOLL_DECL void shm_channel::resume_now(wait* w) noexcept {
    reactor_.disarm(w->timer);
    w->handle.resume();
}

COROCOLL_DECL bool shm_channel::poll_entry_fn(io::poll_entry& e) noexcept {
    shm_channel& c = *static_cast<entry&>(e).self;
    bool progress = false;
    bool over = c.shut_ || c.peer_ended_;
    // Resumed right here rather than through the queue: a turn of the loop less per
    // message. What it does to the watched entries is safe during the walk (see
    // `poll_entry`).
    if (c.idle_reader_ && (over || c.kicked_ || c.readable())) {
        c.kicked_ = false;
        std::exchange(c.idle_reader_, {}).resume();
        progress = true;
    }
    if (c.reader_ != nullptr && (over || c.readable())) {
        c.resume_now(std::exchange(c.reader_, nullptr));
        progress = true;
    }
    if (c.writer_ != nullptr && (over || c.writer_ready())) {
        c.resume_now(std::exchange(c.writer_, nullptr));
        progress = true;
    }
    if (c.reader_ == nullptr && c.writer_ == nullptr && !c.idle_reader_) c.reactor_.unwatch(e);
    return progress;
}

COROCOLL_DECL bool shm_channel::prepare_sleep_fn(io::poll_entry& e) noexcept {
    shm_channel& c = *static_cast<entry&>(e).self;
    if (!c.watching_) return false;  // nothing would end the sleep
    auto& flag = c.seg_->asleep[c.side_].value;
    flag.store(1, std::memory_order_seq_cst);
    // The peer may publish without a fence: its store and its look at our flag can pass each
    // other on its processor unless a barrier runs there between our flag and our look.
    if (c.fences_before_sleep_ && !io::barrier_on_processes()) {
        flag.store(0, std::memory_order_relaxed);
        return false;  // not promised: no sleep (the loop pauses and looks again)
    }
    if (((c.reader_ != nullptr || c.idle_reader_) && c.readable_by_tail()) ||
        (c.writer_ != nullptr && c.writer_ready()) || c.shut_ || c.peer_ended_ || c.kicked_) {
        flag.store(0, std::memory_order_relaxed);
        return false;
    }
    if (c.use_futex_) {
        // Waits while the flag is 1: a wake that came first (the peer cleared it) makes the
        // wait end at once. One in flight serves every later sleep until it completes.
        if (!c.futex_armed_) {
            c.futex_armed_ = true;
            c.reactor_.submit(c.futex_op_);
        }
        c.reactor_.note_futex_sleep();
    }
    if (c.fences_before_sleep_) c.reactor_.note_fenced_sleep();
    return true;
}

COROCOLL_DECL void shm_channel::end_sleep_fn(io::poll_entry& e) noexcept {
    shm_channel& c = *static_cast<entry&>(e).self;
    c.seg_->asleep[c.side_].value.store(0, std::memory_order_relaxed);
}

COROCOLL_DECL void shm_channel::prepare_watch(io::detail::io_op* op, io_uring* ring) noexcept {
    shm_channel* c = static_cast<watch_op*>(op)->self;
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    io_uring_prep_recv(sqe, c->fd_, c->sink_, sizeof(c->sink_), 0);
    io_uring_sqe_set_data(sqe, op);
}

COROCOLL_DECL void shm_channel::complete_watch(io::detail::io_op* op, int res) noexcept {
    shm_channel* c = static_cast<watch_op*>(op)->self;
    // -ECANCELED while open: the thread that submitted the receive ended (the kernel
    // cancels a thread's requests when it exits; threads may take turns driving a
    // reactor, see `io::reactor::borrowed`), not the peer.
    if ((res > 0 || res == -ECANCELED) && !c->shut_) {
        c->reactor_.submit(c->watch_op_);
        return;
    }
    if (res != -EINTR && res != -EAGAIN) {
        c->watching_ = false;
        if (!c->shut_) c->peer_ended_ = true;
        if (c->reader_ != nullptr || c->writer_ != nullptr || c->idle_reader_) {
            c->reactor_.watch(c->entry_);
        }
        c->resume_closer();
        return;
    }
    c->reactor_.submit(c->watch_op_);
}

COROCOLL_DECL void shm_channel::prepare_futex(io::detail::io_op* op, io_uring* ring) noexcept {
    shm_channel* c = static_cast<watch_op*>(op)->self;
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    io::detail::prep_futex_wait(sqe, c->seg_->asleep[c->side_].value, 1);
    io_uring_sqe_set_data(sqe, op);
}

COROCOLL_DECL void shm_channel::complete_futex(io::detail::io_op* op, int res) noexcept {
    shm_channel* c = static_cast<watch_op*>(op)->self;
    c->futex_armed_ = false;
    if (res == -EINVAL || res == -EOPNOTSUPP || res == -ENOSYS) {
        // Probed, yet refused (a kernel that forbids it for this mapping): the socket it is.
        c->use_futex_ = false;
        c->seg_->futex_sleeper[c->side_].store(0, std::memory_order_seq_cst);
    }
    c->resume_closer();
}

COROCOLL_DECL void shm_channel::release() noexcept {
    if (seg_ != nullptr) ::munmap(seg_, map_bytes_);
    seg_ = nullptr;
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}

}  // namespace transport

COROCOLL_END_NAMESPACE
