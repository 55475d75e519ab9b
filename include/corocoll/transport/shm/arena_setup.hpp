#pragma once

// Handing the group's arena (shm/arena.hpp) to every rank at set-up, after the pairs' segments
// (phase 7 of transport/setup.hpp): rank 0 creates it as a memfd and passes its descriptor on
// the pairs' unix sockets (shm/setup.hpp), each rank maps it and checks the nonce in it.

#include <corocoll/core/task.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/transport/options.hpp>
#include <corocoll/transport/shm/arena.hpp>
#include <corocoll/transport/shm/setup.hpp>
#include <corocoll/transport/tcp/mesh.hpp>
#include <corocoll/version.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace transport {
namespace detail {

// The size from which use `u` copies straight from the ranks' buffers in an arena of `ranks`
// ranks (shm_arena::single_copy; 0: never), given `engine_options::shm_arena_single_copy_bytes`
// (`option`): that value for every use, or where it is `automatic_single_copy`, what measured
// faster (docs/performance.md, "Single copies of scatter and all_to_all on 3 to 8 ranks"):
// every use from 16 KiB on 2 ranks but all_gather from 8 KiB blocks and all_reduce from a buffer
// the size of the L2 (`l2_bytes`, 2 MiB where not known: "all_reduce of 2 ranks by single
// copies"); on 3 to 8 ranks scatter's blocks from 64 KiB and all_to_all's from 24 KiB (broadcast,
// gather and all_gather measured slower there), none beyond 8 ranks (not measured). all_reduce
// makes single copies on 2 ranks only, whatever the option: on more it measured slower (4 ranks),
// and there every rank reads every other's buffer, so that a rank leaving the call after another
// was killed made a third blame it, not the killed one.
// Where one process_vm_readv costs `slow_single_copy` or more before it copies a byte
// (`copy_cost`, `single_copy_cost()`: a VM that traps system calls), the 2-rank sizes of
// broadcast, gather and scatter move up to where the arena's two copies outgrow the L2:
// broadcast from a buffer of the L2, gather, scatter and all_to_all from blocks of half of it
// (a whole buffer of the L2; all_to_all up to `single_copy_below_for`); 2-rank all_gather and
// all_reduce, where both ranks read from each other at once, make none (the kernel's copy there
// cost 2-4x a memcpy of the same bytes, and the pair's ring or the arena's data sets led at
// every size: docs/performance.md, "No single copies both ways where a process_vm_readv is
// slow"); on 3 to 8 ranks scatter from
// blocks of the L2 over the ranks (a whole buffer of the L2), never below the size above
// (docs/performance.md, "Single copies where a system call is slow"), and all_to_all none (the
// pairwise exchange led it from 128 KiB to 16 MiB blocks: "No single copies of all_to_all on 3
// to 8 ranks where a process_vm_readv is slow").
COROCOLL_DECL std::size_t single_copy_from_for(single_copy_use u, int ranks, std::size_t option,
                                               std::size_t l2_bytes,
                                               std::chrono::nanoseconds copy_cost = {});

// The size (as `single_copy_from_for` measures it) from which use `u` of `ranks` ranks makes
// no single copies again; 0: no bound. Where a process_vm_readv is slow (`copy_cost`), an
// all_to_all of 2 ranks sends blocks of 8 L2s or more through the pair's ring again: on an AMD
// EPYC VM with a 1 MiB L2 single copies led the ring for blocks of 512 KiB to 4 MiB (4 MiB in
// all: 133-181 us against 191-209), tied at 8 MiB blocks and trailed from 16 MiB ones (64 MiB
// in all: 5.7-6.0 ms against 5.1-5.4; docs/performance.md, "Single copies of all_to_all of 2 ranks
// between half the L2 and 8 L2s where a process_vm_readv is slow"). Not a set size
// (`option`), not elsewhere.
COROCOLL_DECL std::size_t single_copy_below_for(single_copy_use u, int ranks, std::size_t option,
                                                std::size_t l2_bytes,
                                                std::chrono::nanoseconds copy_cost = {});

// From this cost of a process_vm_readv of a few bytes, single copies of 2 ranks wait for larger
// buffers (`single_copy_from_for`): an AMD EPYC VM whose getppid took 1.0 us paid 1.9-2.1 us,
// and lost to the arena's two copies from 16 KiB up to 256 KiB-1 MiB by 2-3x.
inline constexpr std::chrono::nanoseconds slow_single_copy{1000};

// What one process_vm_readv of 64 bytes of this process's own memory costs: the cheapest of 32,
// measured once (the first call) and kept; 0 where the kernel refuses it.
COROCOLL_DECL std::chrono::nanoseconds single_copy_cost() noexcept;

// A fresh arena for `ranks` ranks with data sets of `set_bytes`, with `nonce`, the
// group's single-copy sizes (`single_copy_from_for` of `single_copy_bytes`, see
// shm_arena::single_copy) and this core's L2 (`l2_bytes`) in it.
COROCOLL_DECL mapping create_arena(int ranks, std::size_t set_bytes, std::uint64_t nonce,
                                   std::size_t single_copy_bytes, std::size_t l2_bytes,
                                   fd_guard& memfd);

// Maps the arena rank 0 passed; empty with `why` when it is not what `intro` says.
COROCOLL_DECL mapping map_arena(int fd, const shm_intro& intro, int ranks, std::string& why);

// The arena's hand-over, on the pairs' unix sockets before the channels take them: rank 0
// offers it to every rank (or says it has none) when every rank is on this host and all its
// pairs share memory; a rank takes it when all its own pairs do too. Where connections open on
// first use (`mo.lazy`), only ring neighbours have a unix socket at set-up: each rank passes
// what it got to the next, and a pair left for first use counts as sharing memory.
COROCOLL_DECL task<> share_arena(io::reactor& r, rendezvous::store& store, int rank, int size,
                                 const mesh_options& mo, std::size_t arena_bytes,
                                 std::size_t arena_single_copy_bytes,
                                 const std::vector<std::string>* hosts,
                                 std::vector<pair_plan>& plan, std::uint64_t group,
                                 std::unique_ptr<shm_arena>& arena);

}  // namespace detail
}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/shm/impl/arena_setup.ipp>
#endif
