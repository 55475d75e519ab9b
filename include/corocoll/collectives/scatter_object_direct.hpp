#pragma once

// scatter_object_list: the root sends each rank its serialized object directly, its length in
// round 0 and its bytes in round 1, to every rank at once.
// Cost: 2 rounds; the root sends n - 1 lengths and objects over n - 1 connections; each other
// rank receives one. Chosen: always for scatter_object_list.

#include <corocoll/collectives/context.hpp>
#include <corocoll/core/when_all.hpp>
#include <corocoll/version.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// `parts` (n byte strings, read on `root` only) go out so that rank r gets `parts[r]` in
/// `mine`.
COROCOLL_DECL task<> scatter_object_direct(context& c, const std::vector<std::string>& parts,
                                           std::string& mine, int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/scatter_object_direct.ipp>
#endif
