// The bodies of the non-template functions declared in
// <corocoll/collectives/all_to_all_linear.hpp>: inline where corocoll is header-only, compiled
// once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/all_to_all_linear.hpp>

#include <corocoll/core/when_all.hpp>

#include <exception>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> all_to_all_linear(context& c, std::span<std::byte> out,
                                       const std::vector<std::size_t>& out_offsets,
                                       std::span<const std::byte> in,
                                       const std::vector<std::size_t>& in_offsets) {
    const int n = c.size(), r = c.rank();
    detail::copy_own_block(out, out_offsets, in, in_offsets, r);
    // Reserved whole: a started receive must not move. Rank r - s's block is received, and
    // rank r + s's sent, in the order of the pairwise exchange's rounds.
    std::vector<context::recv_operation> recvs;
    recvs.reserve(static_cast<std::size_t>(n > 0 ? n - 1 : 0));
    for (int s = 1; s < n; ++s) {
        const int src = (r - s + n) % n;
        recvs.push_back(c.recv(detail::offset_block(out, out_offsets, src), src, 0));
        recvs.back().start();
    }
    std::exception_ptr failed;
    try {
        for (int s = 1; s < n; ++s) {
            const int dst = (r + s) % n;
            co_await c.send(detail::offset_block(in, in_offsets, dst), dst, 0);
        }
    } catch (...) {
        failed = std::current_exception();
    }
    // The posted receives may be filling `out`: they end (the group has failed, if a send
    // did) before the buffer can go.
    try {
        co_await when_all(std::move(recvs));
    } catch (...) {
        if (!failed) failed = std::current_exception();
    }
    if (failed) std::rethrow_exception(failed);
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
