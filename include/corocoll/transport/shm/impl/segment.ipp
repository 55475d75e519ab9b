// The bodies of the non-template functions declared in <corocoll/transport/shm/segment.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/shm/segment.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {
namespace detail {

COROCOLL_DECL std::byte* shm_segment::ring_data(int s) noexcept {
    return reinterpret_cast<std::byte*>(this) + data_offset +
           static_cast<std::size_t>(s) * ring_bytes;
}

}  // namespace detail
}  // namespace transport

COROCOLL_END_NAMESPACE
