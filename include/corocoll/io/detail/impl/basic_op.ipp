// The bodies of the non-template functions declared in <corocoll/io/detail/basic_op.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/io/detail/basic_op.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace io {
namespace detail {

COROCOLL_DECL std::chrono::nanoseconds coarse_resolution() noexcept {
    static const std::chrono::nanoseconds r = [] {
        timespec res{};
        if (::clock_getres(CLOCK_MONOTONIC_COARSE, &res) != 0)
            return std::chrono::nanoseconds(10'000'000);
        return std::chrono::seconds(res.tv_sec) + std::chrono::nanoseconds(res.tv_nsec);
    }();
    return r;
}

COROCOLL_DECL __kernel_timespec to_kernel_time(std::chrono::steady_clock::time_point t) noexcept {
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
    if (ns < 0) ns = 0;
    return {ns / 1'000'000'000, ns % 1'000'000'000};
}

}  // namespace detail
}  // namespace io

COROCOLL_END_NAMESPACE
