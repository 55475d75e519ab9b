#pragma once

#include <corocoll/core/task.hpp>
#include <corocoll/core/when_all.hpp>
#include <corocoll/transport/engine.hpp>
#include <corocoll/transport/frame.hpp>
#include <corocoll/version.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// What one call of a collective algorithm works with: the group's transport, this call's
/// metadata (checked by every receiver), its deadline and the chunk size that large transfers
/// are cut into. Algorithms address their messages by (round, chunk), which become the
/// frame's step; within one collective no two messages between the same pair share a step.
struct context {
    transport::engine& net;
    transport::collective_meta meta;
    std::chrono::steady_clock::time_point deadline;
    std::size_t chunk_bytes = std::size_t{1} << 20;

    int rank() const noexcept { return net.rank(); }
    int size() const noexcept { return net.size(); }

    static std::uint32_t step(std::uint32_t round, std::uint32_t chunk = 0) noexcept {
        return (round << 20) | (chunk & 0xfffffu);
    }

    task<> send(std::span<const std::byte> data, int dst, std::uint32_t round,
                std::uint32_t chunk = 0) {
        return net.send_coll(data, dst, meta, step(round, chunk), deadline);
    }
    task<std::size_t> recv(std::span<std::byte> buf, int src, std::uint32_t round,
                           std::uint32_t chunk = 0) {
        return net.recv_coll(buf, src, meta, step(round, chunk), deadline);
    }
    /// Sends and receives at once (both directions of one exchange).
    task<> exchange(std::span<const std::byte> out, int dst, std::span<std::byte> in, int src,
                    std::uint32_t round, std::uint32_t chunk = 0) {
        co_await when_all(send(out, dst, round, chunk), recv(in, src, round, chunk));
    }
};

/// Element `[first, last)` bounds of block `i` when `count` elements are cut into `parts`
/// blocks as evenly as possible (the first `count % parts` blocks get one more).
inline std::pair<std::size_t, std::size_t> block_range(std::size_t count, std::size_t parts,
                                                       std::size_t i) noexcept {
    std::size_t base = count / parts, extra = count % parts;
    std::size_t first = i * base + std::min(i, extra);
    return {first, first + base + (i < extra ? 1 : 0)};
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
