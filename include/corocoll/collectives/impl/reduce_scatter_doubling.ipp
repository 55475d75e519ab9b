// The bodies of the non-template functions declared in
// <corocoll/collectives/reduce_scatter_doubling.hpp>: inline where corocoll is header-only,
// compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/reduce_scatter_doubling.hpp>

#include <corocoll/collectives/all_reduce_recursive_doubling.hpp>
#include <corocoll/core/copy.hpp>

#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> reduce_scatter_doubling(context& c, std::span<std::byte> out,
                                             std::span<const std::byte> in, const reduction& red) {
    const int n = c.size(), r = c.rank();
    const std::size_t elem = red.elem();
    // The group's slot: the all_reduce inside uses the algorithm slot for what it receives.
    std::span<std::byte> work = c.scratch(context::group_slot, in.size());
    if (!in.empty()) copy_bytes(work.data(), in.data(), in.size());
    co_await all_reduce_recursive_doubling(c, work, red);  // finished there
    auto [first, last] =
        block_range(in.size() / elem, static_cast<std::size_t>(n), static_cast<std::size_t>(r));
    if (last > first) copy_bytes(out.data(), work.data() + first * elem, (last - first) * elem);
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
