#pragma once

// What the collectives of one group share: its engine, its rank and size, the topology, the
// arena, and the buffers they reuse from call to call.

#include <corocoll/core/task.hpp>
#include <corocoll/core/when_all.hpp>
#include <corocoll/transport/engine.hpp>
#include <corocoll/transport/frame.hpp>
#include <corocoll/version.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace transport {
class shm_arena;
}  // namespace transport

namespace collectives {

/// Buffers that the collectives of one group reuse from call to call (they run one at a
/// time), so that a loop of collectives neither allocates nor faults in fresh pages for its
/// temporaries. Contents are left as the last user left them.
class scratch_buffers {
public:
    /// Buffers up to this size stay between calls; larger ones go once `idle_calls` calls in
    /// a row did not use them: a loop of large calls, with a barrier or a small call between
    /// them, keeps its temporaries (fresh pages at every call cost a 4-rank reduce of 64 MiB
    /// over TCP 436 ms a call against 42, docs/performance.md, "Large temporaries kept while
    /// they are used"), and a group whose calls got smaller gives them back.
    static constexpr std::size_t kept_bytes = std::size_t{8} << 20;
    /// See `kept_bytes`.
    static constexpr unsigned idle_calls = 16;

    scratch_buffers() = default;
    /// Moves the buffers; the source keeps none.
    scratch_buffers(scratch_buffers&&) noexcept = default;
    /// Moves the buffers; the source keeps none.
    scratch_buffers& operator=(scratch_buffers&&) noexcept = default;
    scratch_buffers(const scratch_buffers&) = delete;
    scratch_buffers& operator=(const scratch_buffers&) = delete;
    ~scratch_buffers() = default;

    /// Slot `slot`'s buffer with room for `bytes`. Algorithms that run inside one another use
    /// different slots (see `context::scratch`).
    std::span<std::byte> get(std::size_t slot, std::size_t bytes);

    /// Ends a call: frees the buffers larger than `kept_bytes` that the last `idle_calls`
    /// calls did not use (`get`); the group calls it after each collective.
    void trim() noexcept;

    /// Bytes of the buffers held now.
    std::size_t held_bytes() const noexcept;

private:
    struct buffer {
        std::unique_ptr<std::byte[]> data;
        std::size_t size = 0;
        unsigned idle = 0;  // trims since the last use (`get` sets 0)
    };
    std::vector<buffer> slots_;
};

/// What one call of a collective algorithm works with: the group's transport, this call's
/// metadata (checked by every receiver), its deadline and the chunk size that large transfers
/// are cut into. Algorithms address their messages by (round, chunk), which become the
/// frame's step; within one collective no two messages between the same pair share a step.
struct context {
    /// What `recv` returns: the posted receive, awaited for its length.
    using recv_operation = transport::recv_op<transport::recv_yields::length>;

    /// The group's transport: every message of the collective goes through it.
    transport::engine& net;
    /// What every frame of this collective carries and the receiver checks.
    transport::collective_meta meta;
    /// When a receive of this collective stops waiting (see `soft_deadline`).
    std::chrono::steady_clock::time_point deadline;
    /// Bytes per pipelined chunk of the ring and chain algorithms.
    std::size_t chunk_bytes = std::size_t{1} << 20;
    /// The group's reusable buffers; null gives the call (and its copies) buffers of its own.
    scratch_buffers* scratch_pool = nullptr;
    /// Buffers this call owns when `scratch_pool` is null.
    std::shared_ptr<scratch_buffers> own_scratch{};
    /// The deadline ends only the receive that reaches it: for a wait with a bound of its own
    /// that it survives (monitored_barrier). Otherwise a receive past its deadline fails the
    /// group, naming the rank to blame.
    bool soft_deadline = false;

    /// Slots of `scratch`: the ring steps use `ring_slot` and `ring_slot + 1`; an algorithm
    /// that calls no other uses `algorithm_slot` and `algorithm_slot + 1`; the group's own
    /// wrappers around an algorithm use `group_slot`.
    static constexpr std::size_t ring_slot = 0;
    static constexpr std::size_t algorithm_slot = 2;  ///< see `ring_slot`
    static constexpr std::size_t group_slot = 4;      ///< see `ring_slot`

    /// A temporary of `bytes` (contents unspecified) that later calls reuse.
    std::span<std::byte> scratch(std::size_t slot, std::size_t bytes);

    /// The ranks this call works among when an algorithm runs on part of the group (a phase
    /// of a hierarchical algorithm): rank i of the call is rank `members[i]` of the group.
    /// Empty: the whole group. See `among`.
    std::span<const int> members{};
    /// This rank's place in `members` (when `members` is not empty).
    int member_rank = 0;
    /// Added to every round this call addresses, so that the phases of one collective that
    /// run algorithms one after the other use steps of their own.
    std::uint32_t round_base = 0;
    /// The group's shared arena, where its ranks all share one host (null elsewhere): what
    /// the shared-memory algorithms work in. Never set on a call `among` part of the group.
    transport::shm_arena* arena = nullptr;

    /// This rank in the call (in the group, unless `members` says otherwise).
    int rank() const noexcept { return members.empty() ? net.rank() : member_rank; }
    /// Ranks in the call.
    int size() const noexcept {
        return members.empty() ? net.size() : static_cast<int>(members.size());
    }
    /// The group rank of rank `r` of the call.
    int group_rank(int r) const noexcept {
        return members.empty() ? r : members[static_cast<std::size_t>(r)];
    }
    /// The same call, restricted to `ranks` (distinct group ranks, this rank among them),
    /// its rounds starting at `first_round`: what a phase of a hierarchical algorithm runs an
    /// ordinary algorithm on. The scratch buffers stay shared (phases run one at a time).
    context among(std::span<const int> ranks, std::uint32_t first_round);

    /// The frame's step (its tag) for (round, chunk): the round in the top 12 bits, the chunk
    /// in the low 20. 2^20 chunks of the 1 MiB default are 1 TiB in one round, the engine's
    /// largest message. A round past 4095 (a ring over more than 2048 ranks) loses its top
    /// bits and may share a step with an earlier round of the same pair; that stays correct
    /// because one pair's messages with one step are matched in the order they were sent, and
    /// every algorithm posts its rounds' receives in round order.
    static std::uint32_t step(std::uint32_t round, std::uint32_t chunk = 0) noexcept {
        return (round << 20) | (chunk & 0xfffffu);
    }

    /// Sends `data` to `dst` as step (`round`, `chunk`) of this collective. One frame per call.
    task<> send(std::span<const std::byte> data, int dst, std::uint32_t round,
                std::uint32_t chunk = 0) {
        return net.send_coll(data, group_rank(dst), meta, step(round_base + round, chunk),
                             deadline);
    }
    /// Receives one message of this call; awaiting it yields the length. `start()` on the
    /// result posts the receive before it is awaited (see `transport::recv_op`).
    recv_operation recv(std::span<std::byte> buf, int src, std::uint32_t round,
                        std::uint32_t chunk = 0) {
        return net.recv_coll(buf, group_rank(src), meta, step(round_base + round, chunk), deadline,
                             soft_deadline);
    }
    /// Sends and receives at once (both directions of one exchange).
    task<> exchange(std::span<const std::byte> out, int dst, std::span<std::byte> in, int src,
                    std::uint32_t round, std::uint32_t chunk = 0);
};

/// Element `[first, last)` bounds of block `i` when `count` elements are cut into `parts`
/// blocks as evenly as possible (the first `count % parts` blocks get one more).
COROCOLL_DECL std::pair<std::size_t, std::size_t> block_range(std::size_t count, std::size_t parts,
                                                              std::size_t i) noexcept;

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/context.ipp>
#endif
