#pragma once

// Whether this test program is built with ASan or TSan (g++ defines __SANITIZE_*__, clang
// answers __has_feature): tests size their matrices and intervals by it. Test code only.

namespace corocoll_test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool sanitized = true;
#else
inline constexpr bool sanitized = false;
#endif
#else
inline constexpr bool sanitized = false;
#endif

}  // namespace corocoll_test
