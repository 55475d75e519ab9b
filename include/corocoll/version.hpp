#pragma once

// Every corocoll header includes this one first, so a compiler in an older mode stops here
// with one message instead of thousands of lines (g++ 12 with -std=c++17 -fcoroutines, as its
// own advice suggests, gave 4,310). The missing header after #error ends the compilation at
// once, as #error alone does not.
#if __cplusplus < 202002L
#error "corocoll needs C++20: compile with -std=c++20 (or -std=gnu++20, or later)"
#include <corocoll/compile_with_-std=c++20>
#endif

/// corocoll's version, as numbers and as the name of the inline namespace that holds every
/// public entity. Two copies of corocoll of different versions can meet in one binary (two
/// vendored libraries, say) without an ODR clash: their symbols live in different namespaces.
#define COROCOLL_VERSION_MAJOR 0
#define COROCOLL_VERSION_MINOR 1
#define COROCOLL_VERSION_PATCH 0
#define COROCOLL_VERSION_STRING "0.1.0"

#define COROCOLL_ABI_NAMESPACE v0_1

/// Opens `namespace corocoll` with the versioned inline namespace inside.
#define COROCOLL_BEGIN_NAMESPACE \
    namespace corocoll {         \
    inline namespace COROCOLL_ABI_NAMESPACE {
#define COROCOLL_END_NAMESPACE \
    }                          \
    }

/// Separate compilation (like Asio's): the bodies of a header's non-template functions live
/// beside it in impl/<name>.ipp, which the header includes at its end when
/// COROCOLL_DEFINE_BODIES is 1. A build that defines COROCOLL_SEPARATE_COMPILATION everywhere
/// sees only the declarations, and compiles the bodies once, in one source file that includes
/// <corocoll/impl/src.hpp> (src/corocoll.cpp). Without it, corocoll is header-only and every
/// body is an inline definition (COROCOLL_DECL is `inline`).
#if defined(COROCOLL_SEPARATE_COMPILATION)
#define COROCOLL_DECL
#if defined(COROCOLL_SOURCE)
#define COROCOLL_DEFINE_BODIES 1
#else
#define COROCOLL_DEFINE_BODIES 0
#endif
#else
#define COROCOLL_DECL inline
#define COROCOLL_DEFINE_BODIES 1
#endif
