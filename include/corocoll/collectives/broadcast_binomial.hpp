#pragma once

// Broadcast along a binomial tree rooted at `root`: a rank receives the whole buffer from its
// parent, then sends it to its children, largest subtree first.
// Cost: ceil(log2 n) rounds; the root sends ceil(log2 n) * bytes; n - 1 messages in all.
// Chosen: for small buffers (below broadcast's large threshold) and any world size; on 2
// ranks sharing an arena, for buffers of 512 B to 32 KiB (thresholds::shm_pair_message_from)
// and large ones (select.hpp).

#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> broadcast_binomial(context& c, std::span<std::byte> data, int root,
                                        std::uint32_t round = 0);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/broadcast_binomial.ipp>
#endif
