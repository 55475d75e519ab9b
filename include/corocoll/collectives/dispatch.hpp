#pragma once

// One entry per collective: the process group chooses an algorithm (select.hpp) and calls the
// collective's entry here, which runs that algorithm's file. So the public class includes no
// algorithm header, and a new algorithm is a file of its own, a case in select.hpp and a case in
// its collective's entry (impl/dispatch.ipp), never an edit of process_group.hpp. Each entry
// returns the algorithm's task as it is (no coroutine frame of its own).

#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/reduction.hpp>
#include <corocoll/collectives/select.hpp>
#include <corocoll/collectives/topology.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/version.hpp>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// The dissemination barrier.
COROCOLL_DECL task<> barrier(context& c);

/// The monitored barrier (star through rank 0), which names the ranks that did not arrive.
COROCOLL_DECL task<> monitored_barrier(context& c, std::chrono::milliseconds timeout);

/// Broadcast of `data` from `root` with algorithm `a` (shm, hierarchical over `hosts`, chain or
/// binomial).
COROCOLL_DECL task<> broadcast(context& c, algorithm a, const topology& hosts,
                               std::span<std::byte> data, int root);

/// All-reduce of `data` in place with algorithm `a` (shm, hierarchical over `hosts`, ring or
/// recursive doubling).
COROCOLL_DECL task<> all_reduce(context& c, algorithm a, const topology& hosts,
                                std::span<std::byte> data, const reduction& red);

/// Reduce of `data` into `root`'s with algorithm `a` (shm where the buffer fits the arena's
/// step lines, else the binomial tree).
COROCOLL_DECL task<> reduce(context& c, algorithm a, std::span<std::byte> data,
                            const reduction& red, int root);

/// All-gather of every rank's `in` into `out` (blocks in rank order, elements of `elem` bytes)
/// with algorithm `a` (shm, hierarchical over `hosts`, Bruck or ring).
COROCOLL_DECL task<> all_gather(context& c, algorithm a, const topology& hosts,
                                std::span<std::byte> out, std::span<const std::byte> in,
                                std::size_t elem);

/// Gather of every rank's `in` into `root`'s `out` with algorithm `a` (linear or binomial).
COROCOLL_DECL task<> gather(context& c, algorithm a, std::span<const std::byte> in,
                            std::span<std::byte> out, int root);

/// Scatter of `root`'s `in` (blocks in rank order) into every rank's `out` with algorithm `a`
/// (linear or binomial).
COROCOLL_DECL task<> scatter(context& c, algorithm a, std::span<const std::byte> in,
                             std::span<std::byte> out, int root);

/// Reduce-scatter of `in` (blocks of out.size() bytes) into `out` with algorithm `a` (shm or
/// ring; shm goes by the ring where the arena cannot carry it: `exchange_shm_fits`).
COROCOLL_DECL task<> reduce_scatter(context& c, algorithm a, std::span<std::byte> out,
                                    std::span<const std::byte> in, const reduction& red);

/// All-to-all of the blocks of `in` at `in_offsets` into `out` at `out_offsets` with
/// algorithm `a` (shm, for equal blocks only, or pairwise exchange; shm goes pairwise where the
/// arena cannot carry it). Empty offsets mean equal blocks (out.size() / n bytes each, the
/// same in `in`); with offsets the exchange is pairwise whatever `a` says.
COROCOLL_DECL task<> all_to_all(context& c, algorithm a, std::span<std::byte> out,
                                const std::vector<std::size_t>& out_offsets,
                                std::span<const std::byte> in,
                                const std::vector<std::size_t>& in_offsets);

/// Broadcast of serialized objects (`bytes`, resized on the other ranks) from `root`.
COROCOLL_DECL task<> broadcast_object(context& c, std::string& bytes, int root);

/// Gather of every rank's serialized object into `out` on `root` (on every rank when `all`).
COROCOLL_DECL task<> gather_object(context& c, std::string mine, int root, bool all,
                                   std::vector<std::string>& out);

/// Scatter of `root`'s serialized objects `parts`, one per rank, into `mine`.
COROCOLL_DECL task<> scatter_object(context& c, const std::vector<std::string>& parts,
                                    std::string& mine, int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/dispatch.ipp>
#endif
