#pragma once

// Test data whose every byte depends on its position, so that data that arrives misplaced,
// mixed with another message or cut short shows. Test code only; not installed.

#include <cstddef>
#include <vector>

namespace corocoll_test {

/// `n` bytes that depend on their position, on `seed` and on `n` itself: two messages of
/// different seeds or sizes differ from their first byte on. Costs one pass over `n`.
inline std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
    std::vector<std::byte> v(n);
    unsigned x = seed * 2654435761u + static_cast<unsigned>(n);
    for (auto& b : v) {
        x = x * 1664525u + 1013904223u;
        b = static_cast<std::byte>(x >> 24);
    }
    return v;
}

}  // namespace corocoll_test
