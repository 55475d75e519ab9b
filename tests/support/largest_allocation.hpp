#pragma once

// Replaces the global operator new and delete to record the largest single allocation since
// the last reset (`corocoll_test::largest_allocation = 0`). Include it in exactly one
// translation unit of a test executable. Every replaceable form that can pair with another is
// replaced, so that new and delete stay matched under ASan.

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace corocoll_test {

/// The largest single allocation (bytes) since it was last set to 0, over every thread.
inline std::atomic<std::size_t> largest_allocation{0};

namespace detail {

inline void* counted_alloc(std::size_t size) noexcept {
    std::size_t seen = largest_allocation.load(std::memory_order_relaxed);
    while (size > seen && !largest_allocation.compare_exchange_weak(seen, size)) {
    }
    return std::malloc(size == 0 ? 1 : size);
}

// Out of line: GCC 12 inlines the replaced operator delete into std::allocator and then warns
// (-Wmismatched-new-delete) about free() on memory from operator new.
[[gnu::noinline]] inline void counted_free(void* p) noexcept { std::free(p); }

}  // namespace detail
}  // namespace corocoll_test

void* operator new(std::size_t size) {
    if (void* p = corocoll_test::detail::counted_alloc(size)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
    if (void* p = corocoll_test::detail::counted_alloc(size)) return p;
    throw std::bad_alloc();
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    return corocoll_test::detail::counted_alloc(size);
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
    return corocoll_test::detail::counted_alloc(size);
}
void operator delete(void* p) noexcept { corocoll_test::detail::counted_free(p); }
void operator delete[](void* p) noexcept { corocoll_test::detail::counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { corocoll_test::detail::counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { corocoll_test::detail::counted_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept {
    corocoll_test::detail::counted_free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
    corocoll_test::detail::counted_free(p);
}
