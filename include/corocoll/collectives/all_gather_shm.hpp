#pragma once

// All-gather through the group's shared arena (transport/shm/arena.hpp), for a group whose
// ranks all share one host: every rank copies its block into its slot of the arena, meets the
// others at one step, and copies every block out. A block of up to 32 bytes goes in the
// rank's own line, and one of `all_gather_shm_lines_from` up to shm_arena::line_bytes (4 KiB)
// in its step's lines; a block larger than a slot (the arena's data set / n) goes in pieces
// of a slot, one step each.
// From the group's single-copy size (shm_arena::single_copy), where every rank may read every
// other's memory, the arena carries only the blocks' addresses instead: each rank copies its
// own block into place, then every other block straight from its rank's buffer
// (process_vm_readv), and waits at a second step until every rank is done with its block.
// Every other such call goes through the same copies backward (shm_arena::next_sweep_backward):
// a loop that reuses its buffers then finds in cache what the last call touched last.
// Cost: one step per piece; each rank writes its block once and reads the n blocks once: no
// block is copied more than once per reader, with no message. With single copies: two steps,
// n copies of a block per rank (none into the arena).
// Chosen: on a group with an arena, by size (see select.hpp).

#include <corocoll/collectives/context.hpp>
#include <corocoll/transport/shm/arena.hpp>
#include <corocoll/version.hpp>

#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Blocks from this many bytes up to shm_arena::line_bytes go in the ranks' step lines rather
/// than the data set's slots. Measured with coll_perf on 2 ranks (an Intel Xeon, 2 MiB L2;
/// docs/performance.md, "all_gather of 2 ranks in the step lines"): from 1 KiB blocks the
/// lines led (1 KiB 0.76 against 0.87 µs, 2 KiB 0.98 against 1.33, 4 KiB 1.46 against 1.62);
/// at 512 bytes the two were even, below it the slots led (32 bytes 0.33 against 0.43).
inline constexpr std::size_t all_gather_shm_lines_from = 1024;

/// `out` gets the n blocks of `in.size()` bytes in rank order.
COROCOLL_DECL task<> all_gather_shm(context& c, std::span<std::byte> out,
                                    std::span<const std::byte> in);

/// The single-copy step both all_gather_shm and all_to_all_shm take, after `settle` and
/// `declare`: offers `offered` (this rank's buffer), copies `own` into block `rank` of `out`
/// and, from every other rank r, the `block` bytes at `read_at` of r's offered buffer into
/// block r of `out` (process_vm_readv), then waits until every rank is done with its buffer.
/// Every other call backward (shm_arena::next_sweep_backward).
COROCOLL_DECL task<> gather_single_copies(context& c, std::span<const std::byte> offered,
                                          std::size_t read_at, std::span<const std::byte> own,
                                          std::span<std::byte> out);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/all_gather_shm.ipp>
#endif
