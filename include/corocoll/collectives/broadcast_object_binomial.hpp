#pragma once

// broadcast_object_list: the root's serialized list goes out in two broadcasts, its length in
// round 0 (binomial tree) so that every rank can size its buffer, then its bytes from round 1:
// by the chain (pipelined) where `select` would take it for a broadcast of that many bytes
// (its pieces of the call's chunk size outnumber what the ranks need), otherwise by the
// binomial tree.
// Cost: the length costs ceil(log2 n) rounds of 8 bytes; the bytes cost what
// broadcast_binomial or broadcast_chain costs for them. Chosen: always for
// broadcast_object_list.

#include <corocoll/collectives/broadcast_binomial.hpp>
#include <corocoll/collectives/broadcast_chain.hpp>
#include <corocoll/collectives/context.hpp>
#include <corocoll/collectives/select.hpp>
#include <corocoll/version.hpp>

#include <cstdint>
#include <span>
#include <string>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Every rank's `bytes` becomes `root`'s (resized as needed).
COROCOLL_DECL task<> broadcast_object_binomial(context& c, std::string& bytes, int root);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/broadcast_object_binomial.ipp>
#endif
