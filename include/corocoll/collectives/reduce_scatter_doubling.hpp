#pragma once

// Reduce-scatter as a whole all_reduce: every rank reduces the whole input by recursive
// doubling (all_reduce_recursive_doubling.hpp) on a copy in scratch and keeps its own block.
// Cost: log2(n) rounds (two more where n is no power of two) of the whole input, against the
// ring's n - 1 rounds of one block each: fewer latencies, more bytes. Chosen: for small
// inputs on 4 or more ranks without a shared arena (select.hpp, `reduce_scatter_crossover`);
// on 4 ranks over TCP the ring's third round cost as much as the whole call's reduction.

#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/reduction.hpp>
#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// reduce_scatter_into's form: `in` (n blocks; rank r's is `block_range` r of its elements)
/// is left as it was; rank r's reduced block (finished: avg divides) lands in `out`.
COROCOLL_DECL task<> reduce_scatter_doubling(context& c, std::span<std::byte> out,
                                             std::span<const std::byte> in, const reduction& red);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/reduce_scatter_doubling.ipp>
#endif
