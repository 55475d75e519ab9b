// The bodies of the non-template functions declared in <corocoll/collectives/ring.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/ring.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {
namespace detail {

COROCOLL_DECL std::size_t chunking::chunks() const noexcept {
    std::size_t count = block.size() / elem;
    return count == 0 ? 1 : (count + chunk_elems - 1) / chunk_elems;
}

COROCOLL_DECL std::span<std::byte> chunking::piece(std::size_t k) const noexcept {
    std::size_t count = block.size() / elem;
    std::size_t first = std::min(count, k * chunk_elems);
    std::size_t last = std::min(count, first + chunk_elems);
    return block.subspan(first * elem, (last - first) * elem);
}

COROCOLL_DECL task<> send_chunks(context& c, std::span<const std::byte> out, int dst,
                                 std::uint32_t round, std::size_t elem) {
    chunking side{{const_cast<std::byte*>(out.data()), out.size()}, elem, chunk_elems(c, elem)};
    for (std::size_t k = 0; k < side.chunks(); ++k) {
        co_await c.send(side.piece(k), dst, round, static_cast<std::uint32_t>(k));
    }
}

COROCOLL_DECL task<> recv_chunks(context& c, std::span<std::byte> in, int src, std::uint32_t round,
                                 const reduction* red, std::size_t elem,
                                 std::span<const std::byte> own) {
    std::size_t per = chunk_elems(c, elem);
    chunking side{in, elem, per};
    std::size_t n = side.chunks();
    if (red == nullptr) {
        for (std::size_t k = 0; k < n; ++k) {
            co_await c.recv(side.piece(k), src, round, static_cast<std::uint32_t>(k));
        }
        co_return;
    }
    assert(own.empty() || own.size() == in.size());
    bool direct = !own.empty();
    std::span<std::byte> bufs[2];
    if (!direct) {
        std::size_t room = std::min(per * elem, in.size());
        bufs[0] = c.scratch(context::ring_slot, room);
        bufs[1] = c.scratch(context::ring_slot + 1, room);
    }
    auto target = [&](std::size_t k) {
        return direct ? side.piece(k) : bufs[k % 2].first(side.piece(k).size());
    };
    // The receive of chunk k + 1 is posted (no coroutine, no allocation) before chunk k is
    // reduced, so its bytes land meanwhile (in the other buffer, or in `in` directly).
    std::optional<context::recv_operation> pending[2];
    pending[0].emplace(c.recv(target(0), src, round, 0));
    pending[0]->start();
    for (std::size_t k = 0; k < n; ++k) {
        co_await *pending[k % 2];
        if (k + 1 < n) {
            auto& next = pending[(k + 1) % 2];
            next.reset();
            next.emplace(c.recv(target(k + 1), src, round, static_cast<std::uint32_t>(k + 1)));
            next->start();
        }
        auto dest = side.piece(k);
        const std::byte* other =
            direct ? own.data() + (dest.data() - in.data()) : bufs[k % 2].data();
        (*red)(dest.data(), other, dest.size() / elem);
    }
}

COROCOLL_DECL task<> ring_round(context& c, std::span<const std::byte> out, int dst,
                                std::span<std::byte> in, int src, std::uint32_t round,
                                const reduction* red, std::size_t elem,
                                std::span<const std::byte> own) {
    co_await when_all(send_chunks(c, out, dst, round, elem),
                      recv_chunks(c, in, src, round, red, elem, own));
}

}  // namespace detail
}  // namespace collectives

COROCOLL_END_NAMESPACE
