#pragma once

// gather_object and all_gather_object: every rank sends its serialized object straight to each
// rank that collects (the root, or everyone), its length in round 0 and its bytes in round 1;
// all sends and receives of a rank run at once.
// Cost: 2 rounds. gather: the root receives n - 1 lengths and objects over n - 1 connections;
// all_gather: every rank sends and receives n - 1 of each, (n - 1) * object bytes, O(n^2)
// messages in the group. Chosen: always for the object collectives that gather (objects are
// small, and their lengths differ, which rules out the fixed-size algorithms).

#include <corocoll/collectives/context.hpp>
#include <corocoll/core/when_all.hpp>
#include <corocoll/version.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Gathers one byte string per rank into `out` (resized to n; slot r is rank r's): on `root`
/// only, or on every rank when `all`. `mine` ends up in this rank's slot.
COROCOLL_DECL task<> gather_object_direct(context& c, std::string mine, int root, bool all,
                                          std::vector<std::string>& out);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/gather_object_direct.ipp>
#endif
