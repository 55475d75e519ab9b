// The bodies of the non-template functions declared in <corocoll/transport/shm/channel.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/copy.hpp>
#include <corocoll/transport/shm/channel.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

COROCOLL_DECL shm_channel::shm_channel(io::reactor& r, int side, void* mapping,
                                       std::size_t map_bytes, int fd, std::size_t single_copy_bytes,
                                       bool futex_wait, bool publish_without_fence)
    : reactor_(r),
      side_(side),
      seg_(static_cast<detail::shm_segment*>(mapping)),
      map_bytes_(map_bytes),
      fd_(fd),
      mask_(seg_->ring_bytes - 1),
      out_(seg_->ring_data(side)),
      in_(seg_->ring_data(1 - side)) {
    out_tail_ = seg_->tail[side_].value.load(std::memory_order_relaxed);
    out_head_ = seg_->head[side_].value.load(std::memory_order_relaxed);
    in_head_ = seg_->head[1 - side_].value.load(std::memory_order_relaxed);
    nonce_ = seg_->probe | 1;
    single_copy_wanted_ = single_copy_bytes;
    peer_pid_ = seg_->pid[1 - side_];
    entry_.self = this;
    entry_.poll = &poll_entry_fn;
    entry_.prepare_sleep = &prepare_sleep_fn;
    entry_.end_sleep = &end_sleep_fn;
    watch_op_.self = this;
    watch_op_.prepare_ = &prepare_watch;
    watch_op_.complete_ = &complete_watch;
    futex_op_.self = this;
    futex_op_.prepare_ = &prepare_futex;
    futex_op_.complete_ = &complete_futex;
    use_futex_ = futex_wait && reactor_.features().futex_wait;
    seg_->futex_sleeper[side_].store(use_futex_ ? 1 : 0, std::memory_order_seq_cst);
    fences_before_sleep_ = publish_without_fence && io::membarrier_registered();
    seg_->fences_before_sleep[side_].store(fences_before_sleep_ ? 1 : 0, std::memory_order_seq_cst);
    watching_ = true;
    reactor_.submit(watch_op_);
}

COROCOLL_DECL shm_channel::~shm_channel() {
    // close() was not awaited: the socket's receive (or the futex wait) may still be in the
    // kernel, and it would write into (or wait on) freed memory.
    if (in_kernel()) std::terminate();
    release();
}

COROCOLL_DECL std::size_t shm_channel::try_recv(std::span<std::byte> out,
                                                bool /*may_call_kernel*/) noexcept {
    std::size_t got = 0, freed = 0;
    while (got < out.size()) {
        if (in_left_ == 0 && !next_record()) break;
        std::size_t n = std::min<std::uint64_t>(in_left_, out.size() - got);
        if (in_kind_ == detail::shm_record::single_copy) {
            // Never after other bytes: what lands in a staging buffer should be small.
            if (got > 0) break;
            n = copy_remote(out.data(), n);
            if (n == 0) break;  // failed: recv reports it
        } else if (expanded_left_ > 0) {
            n = std::min(n, expanded_left_);
            copy_bytes(
                out.data() + got,
                reinterpret_cast<const std::byte*>(&expanded_) + sizeof(expanded_) - expanded_left_,
                n);
            expanded_left_ -= n;
        } else {
            copy_out(out.data() + got, n);
            in_head_ += n;
        }
        got += n;
        in_left_ -= n;
        if (in_left_ == 0) end_record();
        if (got - freed >= stream_piece_bytes) {  // the writer's next piece, while this goes on
            free_room();
            freed = got;
        }
    }
    if (got > freed) free_room();
    return got;
}

COROCOLL_DECL bool shm_channel::await_readable(std::coroutine_handle<> h) noexcept {
    if (shut_ || peer_ended_ || kicked_ || readable()) {
        kicked_ = false;
        return false;
    }
    idle_reader_ = h;
    reactor_.watch(entry_);
    return true;
}

COROCOLL_DECL void shm_channel::kick_reader() noexcept {
    kicked_ = true;
    if (idle_reader_) reactor_.watch(entry_);
}

COROCOLL_DECL task<std::size_t> shm_channel::recv_some(std::span<std::byte> out, io::op_options o) {
    for (;;) {
        if (std::size_t n = try_recv(out, false); n > 0 || out.empty()) co_return n;
        throw_copy_error();
        if (shut_ || peer_ended_) co_return 0;
        co_await wait{*this, false, o};
    }
}

COROCOLL_DECL task<> shm_channel::recv(std::span<std::byte> out, io::op_options o) {
    while (!out.empty()) {
        std::size_t n = try_recv(out, false);
        if (n == 0) {
            throw_copy_error();
            if (shut_ || peer_ended_) {
                corocoll::detail::throw_error(corocoll::errc::connection_closed,
                                              "corocoll: recv from shm: the peer is gone");
            }
            co_await wait{*this, false, o};
        }
        out = out.subspan(n);
    }
}

COROCOLL_DECL std::size_t shm_channel::try_send(std::span<iovec> iov) noexcept {
    if (shut_ || peer_ended_) return 0;
    // A small message (header and payload) goes as one record: the fewer cache lines it
    // spans, the sooner the reader has it.
    if (iov.size() > 1) {
        std::size_t total = detail::iov_bytes(iov);
        if (total <= small_record_bytes && put_gathered(iov, total)) {
            publish();
            return total;
        }
    }
    std::size_t sent = 0, published = 0;
    for (const iovec& v : iov) {
        // A payload for a single copy goes through `send`, which waits for the copy.
        if (single_copy(v.iov_len)) break;
        const auto* from = static_cast<const std::byte*>(v.iov_base);
        std::size_t left = v.iov_len;
        while (left > 0) {
            std::size_t n = put_inline(from, left);
            if (n == 0) break;
            from += n;
            left -= n;
            sent += n;
            if (left > 0) {  // more pieces of this payload follow: the reader starts on this one
                publish();
                published = sent;
            }
        }
        if (left > 0) break;
    }
    if (sent > published) publish();
    return sent;
}

COROCOLL_DECL task<> shm_channel::send(std::span<iovec> iov, io::op_options o) {
    iovec rest_space[4];
    if (iov.size() > std::size(rest_space)) {
        throw std::invalid_argument("corocoll: shm send: more than 4 buffers at once");
    }
    std::span<iovec> rest = iov;
    for (;;) {
        std::size_t n = try_send(rest);
        if (n == detail::iov_bytes(rest)) co_return;
        rest = detail::iov_after(rest, n, rest_space);
        if (shut_ || peer_ended_) {
            corocoll::detail::throw_error(std::make_error_code(std::errc::broken_pipe),
                                          "corocoll: send to shm: the peer is gone");
        }
        if (single_copy(rest[0].iov_len) && put_remote(rest[0])) {
            co_await single_copy_done(o);
            rest = rest.subspan(1);
            if (rest.empty()) co_return;
            continue;
        }
        co_await wait{*this, true, o};
    }
}

COROCOLL_DECL void shm_channel::send_now(std::span<iovec> iov) noexcept {
    if (shut_ || peer_ended_) return;
    if (put_gathered(iov, detail::iov_bytes(iov))) publish();
}

COROCOLL_DECL void shm_channel::leave_last_words(std::span<iovec> iov) noexcept {
    auto& area = seg_->last_words[side_];
    std::size_t n = 0;
    for (const iovec& v : iov) {
        std::size_t k = std::min(v.iov_len, sizeof(area) - n);
        copy_bytes(area + n, v.iov_base, k);
        n += k;
    }
    seg_->last_words_length[side_].store(static_cast<std::uint32_t>(n), std::memory_order_release);
}

COROCOLL_DECL std::string shm_channel::last_words() const {
    std::uint32_t n = seg_->last_words_length[1 - side_].load(std::memory_order_acquire);
    const auto& area = seg_->last_words[1 - side_];
    return std::string(area, std::min<std::size_t>(n, sizeof(area)));
}

COROCOLL_DECL void shm_channel::shutdown() noexcept {
    if (shut_) return;
    shut_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    // Whoever waits here sees the end at the next turn of the loop.
    if (reader_ != nullptr || writer_ != nullptr || idle_reader_) reactor_.watch(entry_);
}

COROCOLL_DECL task<> shm_channel::close() {
    shutdown();
    if (futex_armed_) {
        if (reactor_.withdraw(futex_op_)) {
            futex_armed_ = false;  // it never reached the kernel
        } else {
            // Our own wake ends our own wait.
            seg_->asleep[side_].value.store(0, std::memory_order_seq_cst);
            io::futex_wake(seg_->asleep[side_].value, 1);
        }
    }
    // The socket's receive ends with the shutdown, the futex wait with the wake; their
    // memory is ours until they have.
    if (in_kernel()) co_await closed_awaiter{*this};
    release();
}

COROCOLL_DECL std::size_t shm_channel::room() noexcept {
    out_head_ = seg_->head[side_].value.load(std::memory_order_seq_cst);
    return seg_->ring_bytes - (out_tail_ - out_head_);
}

COROCOLL_DECL void shm_channel::copy_in(const void* from, std::size_t n) noexcept {
    const auto* src = static_cast<const std::byte*>(from);
    std::size_t at = out_tail_ & mask_;
    std::size_t first = std::min<std::size_t>(n, seg_->ring_bytes - at);
    copy_bytes(out_ + at, src, first);
    if (first < n) copy_bytes(out_, src + first, n - first);
    out_tail_ += n;
}

COROCOLL_DECL void shm_channel::copy_out(void* to, std::size_t n) noexcept {
    auto* dst = static_cast<std::byte*>(to);
    std::size_t at = in_head_ & mask_;
    std::size_t first = std::min<std::size_t>(n, seg_->ring_bytes - at);
    copy_bytes(dst, in_ + at, first);
    if (first < n) copy_bytes(dst + first, in_, n - first);
}

COROCOLL_DECL std::uint64_t shm_channel::begin_record(detail::shm_record::kind_t kind,
                                                      std::uint64_t length) noexcept {
    const std::uint64_t start = out_tail_;
    out_tail_ += sizeof(std::uint64_t);  // the stamp, stored last
    const std::uint64_t kind_length = detail::shm_record::pack(kind, length);
    copy_in(&kind_length, sizeof(kind_length));
    return start;
}

COROCOLL_DECL void shm_channel::seal_record(std::uint64_t start) noexcept {
    out_tail_ = start + detail::pad_line(out_tail_ - start);
    auto* word = reinterpret_cast<std::uint64_t*>(out_ + (start & mask_));
    std::atomic_ref<std::uint64_t>(*word).store(stamp_for(start), std::memory_order_release);
}

COROCOLL_DECL bool shm_channel::record_here() noexcept {
    auto* word = reinterpret_cast<std::uint64_t*>(in_ + (in_head_ & mask_));
    return std::atomic_ref<std::uint64_t>(*word).load(std::memory_order_acquire) ==
           stamp_for(in_head_);
}

COROCOLL_DECL std::size_t shm_channel::put_inline(const std::byte* from, std::size_t n) noexcept {
    if (n == 0) return 0;
    n = std::min(n, stream_piece_bytes);
    constexpr std::size_t head = sizeof(detail::shm_record);
    auto usable = [](std::size_t room) { return room & ~(detail::shm_line - 1); };
    std::size_t free = usable(seg_->ring_bytes - (out_tail_ - out_head_));
    if (free < detail::pad_line(head + n)) free = usable(room());
    if (free < detail::shm_line) return 0;
    std::size_t take = std::min(n, free - head);
    const std::uint64_t start = begin_record(detail::shm_record::inline_bytes, take);
    copy_in(from, take);
    seal_record(start);
    return take;
}

COROCOLL_DECL bool shm_channel::put_gathered(std::span<iovec> iov, std::size_t total) noexcept {
    constexpr std::size_t head = sizeof(detail::shm_record);
    // A small point-to-point frame with a plain header goes compact (one line up to
    // shm_compact_payload bytes of payload).
    frame_header h;
    bool compact = iov.size() >= 1 && iov[0].iov_len == sizeof(h) &&
                   total - sizeof(h) <= detail::shm_compact_most;
    if (compact) {
        std::memcpy(&h, iov[0].iov_base, sizeof(h));
        frame_header plain;
        plain.kind = frame_kind::p2p;
        plain.flags = h.flags;
        plain.src = h.src;
        plain.dst = h.dst;
        plain.tag = h.tag;
        plain.length = total - sizeof(h);
        compact = std::memcmp(&plain, &h, sizeof(h)) == 0;
    }
    std::size_t need = detail::pad_line(
        head + (compact ? sizeof(detail::shm_compact) + total - sizeof(h) : total));
    if (seg_->ring_bytes - (out_tail_ - out_head_) < need && room() < need) return false;
    if (compact) {
        const std::uint64_t start = begin_record(detail::shm_record::compact, total);
        detail::shm_compact c;
        c.kind = static_cast<std::uint8_t>(h.kind);
        c.flags = h.flags;
        c.src = h.src;
        c.dst = h.dst;
        c.tag = h.tag;
        copy_in(&c, sizeof(c));
        for (const iovec& v : iov.subspan(1)) copy_in(v.iov_base, v.iov_len);
        seal_record(start);
        return true;
    }
    const std::uint64_t start = begin_record(detail::shm_record::inline_bytes, total);
    for (const iovec& v : iov) copy_in(v.iov_base, v.iov_len);
    seal_record(start);
    return true;
}

COROCOLL_DECL bool shm_channel::put_remote(const iovec& v) noexcept {
    if (room() < detail::shm_line) return false;
    detail::shm_remote where{reinterpret_cast<std::uintptr_t>(v.iov_base), ++copies_sent_};
    const std::uint64_t start = begin_record(detail::shm_record::single_copy, v.iov_len);
    copy_in(&where, sizeof(where));
    seal_record(start);
    publish();
    return true;
}

COROCOLL_DECL void shm_channel::publish() noexcept {
    store_then_wake(seg_->tail[side_].value, out_tail_);
}

COROCOLL_DECL void shm_channel::free_room() noexcept {
    store_then_wake(seg_->head[1 - side_].value, in_head_);
}

COROCOLL_DECL void shm_channel::store_then_wake(std::atomic<std::uint64_t>& counter,
                                                std::uint64_t value) noexcept {
    if (publishes_without_fence()) {
        counter.store(value, std::memory_order_release);
        std::atomic_signal_fence(std::memory_order_seq_cst);
    } else {
        counter.store(value, std::memory_order_seq_cst);
    }
    wake_peer_if_asleep();
}

COROCOLL_DECL bool shm_channel::next_record() noexcept {
    if (!record_here()) return false;
    const std::uint64_t start = in_head_;
    detail::shm_record rec;
    copy_out(&rec, sizeof(rec));
    in_head_ += sizeof(rec);
    in_kind_ = rec.kind();
    in_left_ = rec.length();
    std::uint64_t body = in_left_;
    if (in_kind_ == detail::shm_record::single_copy) {
        detail::shm_remote where;
        copy_out(&where, sizeof(where));
        in_head_ += sizeof(where);
        in_address_ = where.address;
        in_number_ = where.number;
        body = sizeof(where);
    } else if (in_kind_ == detail::shm_record::compact) {
        detail::shm_compact c;
        copy_out(&c, sizeof(c));
        in_head_ += sizeof(c);
        expanded_ = frame_header{};
        expanded_.kind = static_cast<frame_kind>(c.kind);
        expanded_.flags = c.flags;
        expanded_.src = c.src;
        expanded_.dst = c.dst;
        expanded_.tag = c.tag;
        expanded_.length = in_left_ - sizeof(frame_header);
        expanded_left_ = sizeof(frame_header);
        body = sizeof(c) + expanded_.length;
    }
    in_next_ = start + detail::pad_line(sizeof(rec) + body);
    return true;
}

COROCOLL_DECL void shm_channel::end_record() noexcept {
    if (in_kind_ == detail::shm_record::single_copy) {
        // The writer gave up on this copy (and may have freed its buffer) before we were
        // done: what was copied cannot be trusted.
        if (seg_->withdrawn[1 - side_].value.load(std::memory_order_seq_cst) >= in_number_) {
            copy_error_ = std::make_error_code(std::errc::connection_aborted);
        }
        seg_->copied[1 - side_].value.store(in_number_, std::memory_order_seq_cst);
    }
    in_head_ = in_next_;
}

COROCOLL_DECL std::size_t shm_channel::copy_remote(std::byte* to, std::size_t n) noexcept {
    iovec local{to, n};
    iovec remote{reinterpret_cast<void*>(in_address_), n};
    ssize_t got = ::process_vm_readv(peer_pid_, &local, 1, &remote, 1, 0);
    if (got <= 0) {
        // ESRCH: the writer's process is gone (killed) while its payload was being read.
        copy_error_ = got < 0 && errno == ESRCH
                          ? make_error_code(corocoll::errc::connection_closed)
                          : std::error_code(got < 0 ? errno : EIO, std::system_category());
        return 0;
    }
    in_address_ += static_cast<std::uint64_t>(got);
    return static_cast<std::size_t>(got);
}

COROCOLL_DECL void shm_channel::throw_copy_error() const {
    if (copy_error_) {
        corocoll::detail::throw_error(copy_error_,
                                      "corocoll: recv from shm: copying from the peer");
    }
}

COROCOLL_DECL bool shm_channel::single_copy(std::size_t bytes) noexcept {
    if (single_copy_wanted_ == 0 || bytes < single_copy_wanted_) return false;
    if (!peer_reads_us_) {
        peer_reads_us_ = seg_->can_read_peer[1 - side_].load(std::memory_order_acquire) != 0;
    }
    return peer_reads_us_;
}

COROCOLL_DECL bool shm_channel::readable() noexcept { return in_left_ > 0 || record_here(); }

COROCOLL_DECL bool shm_channel::readable_by_tail() noexcept {
    return in_left_ > 0 || seg_->tail[1 - side_].value.load(std::memory_order_seq_cst) != in_head_;
}

COROCOLL_DECL task<> shm_channel::single_copy_done(io::op_options o) {
    awaiting_copy_ = true;
    try {
        while (!copy_finished()) {
            if (shut_ || peer_ended_) {
                corocoll::detail::throw_error(std::make_error_code(std::errc::broken_pipe),
                                              "corocoll: send to shm: the peer is gone");
            }
            co_await wait{*this, true, o};
        }
    } catch (...) {
        // The buffer may go away now: the peer must not trust a copy it finishes later.
        seg_->withdrawn[side_].value.store(copies_sent_, std::memory_order_seq_cst);
        awaiting_copy_ = false;
        throw;
    }
    awaiting_copy_ = false;
}

}  // namespace transport

COROCOLL_END_NAMESPACE
