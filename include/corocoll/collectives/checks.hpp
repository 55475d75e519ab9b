#pragma once

// The argument checks every backend makes before it starts a collective, so that a bad
// argument reads the same on each: "corocoll: rank R: WHAT: ...". They take the rank and the
// group size explicitly (no group type), throw `std::invalid_argument` and allocate only when
// they throw (all_to_all_offsets: its result).

#include <corocoll/collectives/dtype.hpp>
#include <corocoll/collectives/reduce_op.hpp>
#include <corocoll/version.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// "corocoll: rank `rank`: `what`: ", the start of every argument error. Allocates.
inline std::string error_prefix(int rank, const char* what) {
    return "corocoll: rank " + std::to_string(rank) + ": " + what + ": ";
}

/// Refuses a root outside [0, size): "root 7 is outside [0, 4)".
COROCOLL_DECL void check_root(int rank, int size, const char* what, int root);

/// Refuses a reduce op that `type` does not have (`op_supported`), with `unsupported_reason`.
COROCOLL_DECL void check_op(int rank, const char* what, reduce_op op, dtype type);

/// Refuses `got` != `expected`: "`name` has 5 elements, 8 expected".
COROCOLL_DECL void check_size(int rank, const char* what, const char* name, std::size_t got,
                              std::size_t expected);

/// Refuses a buffer `name` of all_to_all ("input", "output") of `total` elements that does not
/// split evenly over `size` ranks (as it must without split sizes).
COROCOLL_DECL void check_even_split(int rank, int size, const char* name, std::size_t total);

/// all_to_all's block offsets in bytes (size + 1 of them: block p is [off[p], off[p + 1])) for
/// a buffer `name` ("input", "output") of `total` elements of `elem` bytes. Empty `splits`
/// are filled with equal blocks, refused if `total` does not split evenly over `size` ranks;
/// given ones must have `size` entries that add up to `total`. O(size); allocates the result.
COROCOLL_DECL std::vector<std::size_t> all_to_all_offsets(int rank, int size, const char* name,
                                                          std::vector<std::size_t>& splits,
                                                          std::size_t total, std::size_t elem);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/checks.ipp>
#endif
