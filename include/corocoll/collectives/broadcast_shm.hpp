#pragma once

// Broadcast through the group's shared arena (transport/shm_arena.hpp), for a group whose
// ranks all share one host: the root copies the buffer into the arena once, in pieces, and
// every other rank copies each piece out after the step that follows it. The root writes
// piece k + 1 (in the other data set) while the others copy piece k out, and a loop of
// broadcasts pipelines the same way from one call to the next. Up to 24 bytes go in the
// root's own line (one line moved per rank).
// Cost: one step per piece; the root writes bytes once, whatever n; every other rank reads
// bytes once: n copies in all against 2 (n - 1) through the channels, with no message.
// Chosen: on a group with an arena, by size (see select.hpp).

#include <corocoll/collectives/context.hpp>
#include <corocoll/transport/shm_arena.hpp>
#include <corocoll/version.hpp>

#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Bytes per piece of the shared-memory broadcast (at most the arena's data set).
inline constexpr std::size_t broadcast_shm_piece_bytes = std::size_t{256} << 10;

COROCOLL_DECL task<> broadcast_shm(context& c, std::span<std::byte> data, int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> broadcast_shm(context& c, std::span<std::byte> data, int root) {
    transport::shm_arena& a = *c.arena;
    const bool is_root = a.rank() == root;
    a.declare(c.meta);
    if (data.size() <= transport::shm_arena::small_bytes) {
        const std::uint64_t s = a.next_step();
        if (is_root && !data.empty()) std::memcpy(a.small(root, s), data.data(), data.size());
        co_await a.arrive(c.net, c.meta, c.deadline, true);
        if (!is_root && !data.empty()) std::memcpy(data.data(), a.small(root, s), data.size());
        co_return;
    }
    const std::size_t piece = std::min(broadcast_shm_piece_bytes, a.set_bytes());
    bool check = true;
    for (std::size_t off = 0; off < data.size(); off += piece) {
        const std::size_t len = std::min(piece, data.size() - off);
        const std::uint64_t s = a.next_step();
        if (is_root) std::memcpy(a.set(s), data.data() + off, len);
        co_await a.arrive(c.net, c.meta, c.deadline, std::exchange(check, false));
        if (!is_root) std::memcpy(data.data() + off, a.set(s), len);
    }
}

}  // namespace collectives

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
