// The bodies of the non-template functions declared in <corocoll/collectives/context.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/context.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL std::span<std::byte> scratch_buffers::get(std::size_t slot, std::size_t bytes) {
    if (slots_.size() <= slot) slots_.resize(slot + 1);
    buffer& b = slots_[slot];
    b.idle = 0;
    if (b.size < bytes) {
        b.data.reset();
        b.data.reset(new std::byte[bytes]);
        b.size = bytes;
    }
    return {b.data.get(), bytes};
}

COROCOLL_DECL void scratch_buffers::trim() noexcept {
    for (buffer& b : slots_) {
        // The trim after the call that used it makes 1: freed after `idle_calls` more.
        if (++b.idle > idle_calls && b.size > kept_bytes) {
            b.data.reset();
            b.size = 0;
        }
    }
}

COROCOLL_DECL std::size_t scratch_buffers::held_bytes() const noexcept {
    std::size_t held = 0;
    for (const buffer& b : slots_) held += b.size;
    return held;
}

COROCOLL_DECL std::span<std::byte> context::scratch(std::size_t slot, std::size_t bytes) {
    if (scratch_pool == nullptr) {
        own_scratch = std::make_shared<scratch_buffers>();
        scratch_pool = own_scratch.get();
    }
    return scratch_pool->get(slot, bytes);
}

COROCOLL_DECL context context::among(std::span<const int> ranks, std::uint32_t first_round) {
    // The sub-call shares this call's scratch: make it now if this call has none, so that
    // both use one pool.
    if (scratch_pool == nullptr) scratch(ring_slot, 0);
    context sub = *this;
    sub.arena = nullptr;
    int me = group_rank(rank());
    sub.members = ranks;
    sub.member_rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), me) - ranks.begin());
    sub.round_base = round_base + first_round;
    return sub;
}

COROCOLL_DECL task<> context::exchange(std::span<const std::byte> out, int dst,
                                       std::span<std::byte> in, int src, std::uint32_t round,
                                       std::uint32_t chunk) {
    // The receive is posted before the send starts, so the peer's message lands in place
    // whichever comes first; no when_all (two coroutine frames less per exchange). A send that
    // must wait for room is drained by the peer's reader, which needs nothing from us.
    recv_operation incoming = recv(in, src, round, chunk);
    incoming.start();
    std::exception_ptr failed;
    try {
        co_await send(out, dst, round, chunk);
    } catch (...) {
        failed = std::current_exception();
    }
    if (failed) {
        // The receive may be filling `in` from the kernel: it ends (the group has failed)
        // before the buffer can go.
        try {
            co_await incoming;
        } catch (...) {
        }
        std::rethrow_exception(failed);
    }
    co_await incoming;
}

COROCOLL_DECL std::pair<std::size_t, std::size_t> block_range(std::size_t count, std::size_t parts,
                                                              std::size_t i) noexcept {
    std::size_t base = count / parts, extra = count % parts;
    std::size_t first = i * base + std::min(i, extra);
    return {first, first + base + (i < extra ? 1 : 0)};
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
