#pragma once

// Broadcast along a pipelined chain: root -> root+1 -> ... -> root-1, the buffer cut into
// chunks; every rank forwards chunk k while it receives chunk k+1, so all links carry data at
// once after the pipeline fills.
// Cost: (n - 2 + chunks) chunk-steps; each rank sends and receives bytes once (the root only
// sends, the last only receives): time ~ bytes / bandwidth + (n - 2) * chunk / bandwidth.
// Chosen: when n > 2 and its chunks outnumber (n - 2) / (log2(n) - 1), where it moves fewer
// bytes one after another than the binomial tree (`chain_pieces_needed`, select.hpp).

#include <corocoll/collectives/context.hpp>
#include <corocoll/version.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> broadcast_chain(context& c, std::span<std::byte> data, int root,
                                     std::uint32_t round = 0);

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/broadcast_chain.ipp>
#endif
