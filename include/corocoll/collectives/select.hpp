#pragma once

// Which algorithm each collective runs: the choice by size, group shape and transport, and
// its override by COROCOLL_ALGORITHM or `process_group::set_algorithm`. The measurements behind
// the thresholds are in docs/architecture.md ("When they are chosen").

#include <corocoll/collectives/dtype.hpp>
#include <corocoll/collectives/reduce_op.hpp>
#include <corocoll/collectives/topology.hpp>
#include <corocoll/transport/frame.hpp>
#include <corocoll/version.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Which collective a frame belongs to (part of the metadata every rank must agree on).
enum class collective_kind : std::uint8_t {
    barrier = 1,
    broadcast,
    reduce,
    all_reduce,
    all_gather,
    gather,
    scatter,
    reduce_scatter,
    all_to_all,
    monitored_barrier,
    broadcast_object,
    gather_object,
    all_gather_object,
    scatter_object,
};
inline constexpr std::size_t collective_kinds = 15;

COROCOLL_DECL const char* kind_name(collective_kind k) noexcept;

/// The algorithms, one file each (see their header comments for costs).
enum class algorithm : std::uint8_t {
    automatic = 0,       ///< chosen by size and world size
    ring = 1,            ///< all_reduce, all_gather, reduce_scatter
    recursive_doubling,  ///< all_reduce
    binomial,            ///< broadcast, reduce, gather, scatter
    chain,               ///< broadcast
    bruck,               ///< all_gather
    linear,              ///< gather, scatter
    pairwise,            ///< all_to_all
    dissemination,       ///< barrier
    hierarchical,        ///< all_reduce, broadcast, all_gather across hosts (see topology.hpp)
    /// all_reduce, broadcast, all_gather, reduce_scatter, all_to_all through a one-host group's
    /// shared arena
    shm,
};
/// The last algorithm of the enumeration.
inline constexpr algorithm last_algorithm = algorithm::shm;

COROCOLL_DECL const char* algorithm_name(algorithm a) noexcept;

/// True when collective `k` can run algorithm `a`.
COROCOLL_DECL bool supports(collective_kind k, algorithm a) noexcept;

/// Sizes at which the automatic choice switches to the bandwidth-bound algorithm. Two
/// (`all_reduce_ring_bytes`, `all_gather_ring_bytes`) were measured on 2-8 ranks; on more,
/// `select` moves them up by `rank_growth`. The broadcast's switch follows its pieces.
struct thresholds {
    /// all_reduce: from this many bytes the ring, below it recursive doubling.
    std::size_t all_reduce_ring_bytes = std::size_t{256} << 10;
    /// broadcast: the pipelined chain, n - 2 + k steps of a k-th of the message, against the
    /// binomial tree's log2(n) steps of the whole, from where the k pieces of
    /// `chain_piece_bytes` outnumber `chain_pieces_needed(n)` = (n - 2) / (log2(n) - 1) (the
    /// chain then moves fewer bytes one after another than the tree), and never below this
    /// many bytes (each piece also pays a message's latency).
    std::size_t broadcast_chain_bytes = std::size_t{512} << 10;
    /// The chain's pieces: the group's `chunk_bytes` (`process_group::set_chunk_bytes` keeps
    /// the two alike).
    std::size_t chain_piece_bytes = std::size_t{1} << 20;
    std::size_t all_gather_ring_bytes = std::size_t{256} << 10;  ///< of the gathered total
    std::size_t linear_block_bytes = std::size_t{64} << 10;      ///< gather/scatter, per block
    /// all_to_all of equal blocks on more than 2 ranks without a shared arena: blocks below
    /// this size go all at once (all_to_all_linear.hpp), larger ones by the pairwise
    /// exchange. On 4 ranks over TCP (coll_perf, AMD EPYC, docs/performance.md) all at once
    /// took 61-104 us against the exchange's 102-140 up to 8 KiB blocks and 91-99 against
    /// 135-157 at 32 KiB blocks; at 64 KiB blocks the two took turns.
    std::size_t all_to_all_linear_block_below = std::size_t{64} << 10;
    /// reduce_scatter without a shared arena, on 4 ranks: below this many bytes (a rank's
    /// whole input) a whole all_reduce by recursive doubling (reduce_scatter_doubling.hpp),
    /// from it the ring. Measured over TCP (coll_perf, AMD EPYC): doubling took 85-118 us
    /// against the ring's 129-147 at 32 KiB, and the two took turns at 64 and 128 KiB. On n
    /// ranks `reduce_scatter_doubling_below` moves it by the model.
    std::size_t reduce_scatter_doubling_bytes = std::size_t{64} << 10;
    /// On a group with a shared arena, all_reduce, broadcast and all_gather go through it
    /// (the shm algorithms) at every size but these (measured with coll_perf on 2 and 4 ranks,
    /// docs/architecture.md, "The shared arena"). On 2 ranks the ring's all_gather, which
    /// streams both directions in 64 KiB pieces, stays ahead from this size (where the arena
    /// makes no single copies) ...
    std::size_t shm_pair_ring_from = std::size_t{512} << 10;
    /// ... up to (not including) this one where the arena makes single copies of all_gather
    /// from a larger block (an option), and at every size where it makes none (a slow or
    /// missing process_vm_readv: its data sets trailed the ring up to 16 MiB and tied from
    /// 32); a broadcast, one message, goes by the tree from `shm_pair_ring_from` on.
    std::size_t shm_pair_ring_below = std::size_t{4} << 20;
    /// On 2 ranks all_reduce goes by the ring from this size ...
    std::size_t shm_pair_all_reduce_ring_from = std::size_t{128} << 10;
    /// ... up to (not including) this one, by the arena elsewhere. Neither follows the L2: on
    /// an Intel Xeon (2 MiB L2) the ring led from 128 KiB to 1 MiB and the arena from 2 MiB, on
    /// an AMD EPYC (1 MiB L2) the ring from 128 KiB to 32 MiB (docs/performance.md, "Size
    /// thresholds from the machine's caches").
    std::size_t shm_pair_all_reduce_ring_below = std::size_t{4} << 20;
    /// On more than 8 ranks (where the arena keeps 8 step places per rank:
    /// transport::detail::arena_steps_for) a broadcast below this size goes by the binomial
    /// tree, whose root hands its message to two children and returns. With 32 places or more (up
    /// to 8 ranks) the arena's queue of small broadcasts wins at every size (docs/performance.md,
    /// "Deeper arena steps for small groups").
    std::size_t shm_broadcast_tree_below = std::size_t{4} << 10;
    /// Where the arena copies straight from the ranks' buffers (2 ranks from 16 KiB by
    /// default: `engine_options::shm_arena_single_copy_bytes`), its
    /// all_gather stays ahead of the ring at every size, and its broadcast up to (not
    /// including) this size, from which the tree's pipelined pieces win again.
    std::size_t shm_pair_single_copy_tree_from = std::size_t{2} << 20;
    /// On a group with a shared arena, reduce_scatter and all_to_all (equal blocks) of inputs
    /// below this many bytes (a rank's whole input) go through it (exchange_shm.hpp), larger
    /// ones by the ring and the pairwise exchange: on 2 ranks ...
    std::size_t shm_pair_exchange_below = std::size_t{64} << 10;
    /// ... and on more (measured with coll_perf, docs/performance.md, "reduce_scatter and
    /// all_to_all through the arena").
    std::size_t shm_exchange_below = std::size_t{512} << 10;
    /// On a group with a shared arena of 3 to 8 ranks, an all_to_all past those data sets that
    /// makes no single copies sends every block at once (all_to_all_linear: every channel's
    /// ring busy together) for blocks below this size, by the pairwise exchange from there:
    /// measured with coll_perf, forced, on 3, 4 and 8 ranks (docs/performance.md,
    /// "all_to_all of 3 to 8 ranks all at once on one host"). A cost of n - 1 streams at
    /// once against n - 1 rounds, not a cache size: not scaled with the L2.
    std::size_t shm_all_to_all_linear_block_below = std::size_t{16} << 20;
    /// On a group with a shared arena, reduce, gather and scatter whose rank-written part fits
    /// a step's lines (rooted_shm.hpp) go through it, but for 2-rank gathers and scatters in
    /// the message window below (`shm_pair_message_from`); on 2 ranks gather also goes through
    /// its data sets or single copies below this many bytes (the whole gathered buffer: half
    /// the L2, as the root's working set, its gathered buffer, its own block and the block it
    /// reads from the other, is twice that), where a pair's message gathers faster from there
    /// (coll_perf on two CPUs, docs/performance.md, "Gather of 2 ranks leaves the arena at
    /// half the L2"). Scatter of 2 ranks goes through the arena at every size outside that
    /// window ("Scatter of 2 ranks through the arena at every size").
    std::size_t shm_pair_rooted_below = std::size_t{1} << 20;
    /// On 3 to 8 ranks gather and scatter beyond the lines go through the arena too (its data
    /// sets or single copies) below this many bytes in all (the gathered or scattered buffer),
    /// by messages from there: measured with coll_perf, forced, on 3, 4 and 8 ranks against the
    /// binomial tree and the linear gather and scatter (docs/performance.md, "Gather and scatter
    /// of 3 to 8 ranks through the arena below 1 MiB"). Half the L2, as on 2 ranks, and scaled
    /// with it alike; on more ranks nothing was measured, and messages stay.
    std::size_t shm_rooted_below = std::size_t{1} << 20;
    /// On 3 to 8 ranks a reduce beyond the lines goes through the arena's data sets from this
    /// many bytes (reduce_shm: every rank reduces a slice, the root copies the result out),
    /// by the binomial tree below: measured with coll_perf, forced, on 3, 4 and 8 ranks
    /// (docs/performance.md, "Reduce of 3 to 8 ranks through the arena's data sets"). On 2
    /// ranks the tree's one message led at every size, and on more ranks nothing was
    /// measured. Where the tree's messages cost more than two steps and a copy in by every
    /// rank, not a cache size: not scaled with the L2.
    std::size_t shm_reduce_sliced_from = std::size_t{128} << 10;
    /// On 2 ranks, a broadcast or scatter whose one message (the broadcast's buffer, one
    /// block of the scatter) has from this many bytes ...
    std::size_t shm_pair_message_from = std::size_t{512};
    /// ... a gather whose block has from this many (the first block that leaves a step's
    /// lines, `transport::shm_arena::line_bytes`, 4 KiB: through the lines the arena's gather
    /// led, 4 KiB blocks 0.47 against 0.54 µs; through its data sets it trailed, 5 KiB 0.87
    /// against 0.73; docs/performance.md, "Gather of 2 ranks in the lines up to 4 KiB") ...
    std::size_t shm_pair_gather_message_from = (std::size_t{4} << 10) + 1;
    /// ... up to (not including) this many goes as that message through the pair's channel
    /// (binomial, linear), not through the arena: measured faster with coll_perf. Below the
    /// window the arena's call, with no header and no channel between the two, was as fast
    /// or faster; from 32 KiB its single copies lead (docs/performance.md, "Broadcast, scatter
    /// and gather of 2 ranks as one message up to 32 KiB"). A cost per call, not a cache
    /// size: not scaled with the L2.
    std::size_t shm_pair_message_below = std::size_t{32} << 10;

    /// The L2 (per core) of the machine the shared-memory thresholds above were measured on.
    /// Five of them mark where a call's working set (its buffers, the arena's slots, the
    /// other ranks' buffers read through the kernel) outgrows a core's L2:
    /// `shm_pair_ring_from`, `shm_pair_ring_below`, `shm_pair_single_copy_tree_from`,
    /// `shm_pair_rooted_below` and `shm_rooted_below`.
    static constexpr std::size_t measured_l2 = std::size_t{2} << 20;

    /// The thresholds for cores with `l2` bytes of L2: the five above scaled by `l2` over
    /// `measured_l2`, rounded to a power of two and kept between a quarter and four times
    /// (a 512 KiB L2 moves them to 128 KiB, 1 MiB, 512 KiB and 256 KiB); every other one, and
    /// all of them where `l2` is 0 (not known), as measured.
    static thresholds for_l2(std::size_t l2) noexcept;
};

/// How much further than on 8 ranks the switch to the algorithm that pays n - 1 latencies
/// (the ring) moves on `n` ranks: 1 up to 8 ranks, where the thresholds were measured;
/// beyond, the ratio of the two algorithms' alpha-beta crossovers on n and on 8 ranks (ring
/// against recursive doubling for all_reduce; ring against Bruck for all_gather, where the
/// ring's n - 1 - log2(n) extra latencies must stay the same share of the transfer). Neither
/// alpha nor beta is in the ratio, so no machine's figures are. 1 for every other collective
/// (broadcast's switch counts the chain's pieces at every n: `chain_pieces_needed`).
/// benchmarks/compare/cost_model.py checks the result against the model (docs/performance.md,
/// "A cost model").
COROCOLL_DECL double rank_growth(collective_kind k, int n) noexcept;

/// reduce_scatter, without a shared arena: below this many bytes (a rank's whole input) a
/// whole all_reduce by recursive doubling (reduce_scatter_doubling.hpp), from it the ring.
/// `t.reduce_scatter_doubling_bytes` (measured on 4 ranks) times the ratio of the two
/// algorithms' alpha-beta crossovers on `n` and on 4 ranks (neither alpha nor beta is in the
/// ratio). 0 (the ring always) on 2, 3, 5 and 6 ranks, where doubling takes as many steps or
/// more; with the default thresholds 64 KiB on 4 ranks, 19 KiB on 7, 150 KiB on 8 and 287 KiB
/// on 16.
COROCOLL_DECL std::size_t reduce_scatter_doubling_below(const thresholds& t, int n) noexcept;

/// The pieces a broadcast's chain must be cut into on `n` ranks to move fewer bytes one after
/// another than the binomial tree: the least k with n - 2 + k < k log2(n), i.e. more than
/// (n - 2) / (log2(n) - 1) (2 on 3 ranks, 3 on 4, 4 on 8, 114 on 1,024); 0 where the chain
/// is never chosen (n <= 2, where it is the tree's one hop).
COROCOLL_DECL std::size_t chain_pieces_needed(int n) noexcept;

/// Algorithms forced per collective; `automatic` leaves the choice to size and world size.
class algorithm_choice {
public:
    /// Forces `a` for every later `k`; `automatic` gives the choice back. Throws
    /// `std::invalid_argument` when `k` has no algorithm `a`.
    void force(collective_kind k, algorithm a);
    /// The algorithm forced for `k`, or `automatic`.
    algorithm forced(collective_kind k) const noexcept {
        return forced_[static_cast<std::size_t>(k)];
    }

    /// Reads COROCOLL_ALGORITHM (see `parse_spec`); unset or empty: nothing forced.
    static algorithm_choice from_env();

    /// Parses a COROCOLL_ALGORITHM value: one algorithm name (forced on every collective that
    /// has it, e.g. "ring") or a list of collective=algorithm ("all_reduce=ring,broadcast=chain").
    /// An unknown name, or a collective without that algorithm, throws `std::invalid_argument`
    /// naming the variable, the value and the names that would do.
    static algorithm_choice parse_spec(std::string_view spec);

private:
    static std::optional<algorithm> find_algorithm(std::string_view name);
    static std::optional<collective_kind> find_kind(std::string_view name);
    // "known: ..." (every algorithm) or "it has: ..." (those of collective `k`).
    static std::string names_of(std::optional<collective_kind> k);

    std::array<algorithm, collective_kinds> forced_{};
};

/// The algorithm collective `k` uses for `bytes` (of one rank's buffer, or of the gathered
/// total for all_gather, or of one block for gather/scatter) on `n` ranks whose hosts `hosts`
/// describes (null: one host). A group that `topology::hierarchical` calls so gets the
/// hierarchical algorithm wherever the collective has one, at every size. A group with a
/// shared arena (`arena`: all its ranks share one host's memory) gets the shared-memory
/// algorithms, but where `thresholds` says otherwise; `single_copy_from` and
/// `single_copy_below` are the arena's (`process_group::arena_single_copy_from` and
/// `arena_single_copy_below` of the kind, 0: none, no bound), which change where they win.
COROCOLL_DECL algorithm select(collective_kind k, std::size_t bytes, int n,
                               const algorithm_choice& choice, const thresholds& t = {},
                               const topology* hosts = nullptr, bool arena = false,
                               std::size_t single_copy_from = 0, std::size_t single_copy_below = 0);

/// How a collective call reads in errors: "all_reduce(sum, float32 x 100, ring)".
COROCOLL_DECL std::string describe(const transport::collective_meta& m);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/select.ipp>
#endif
