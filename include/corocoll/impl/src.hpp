#pragma once

// corocoll's non-template function bodies, compiled once: in a build that defines
// COROCOLL_SEPARATE_COMPILATION for every translation unit, exactly one source file includes
// this header (src/corocoll.cpp is that file). See "Separate compilation" in the README.

#if defined(COROCOLL_DEFINE_BODIES)
#error "<corocoll/impl/src.hpp> must be included before any other corocoll header"
#endif

#define COROCOLL_SOURCE 1

// g++ warns (-Wsubobject-linkage) that the frame of a coroutine with external linkage defined
// in a header holds a lambda, a type without linkage. These bodies are compiled in this one
// translation unit only, so no second definition of the frame can exist to disagree.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wsubobject-linkage"
#endif

#include <corocoll/version.hpp>

#if !defined(COROCOLL_SEPARATE_COMPILATION)
#error "<corocoll/impl/src.hpp> is for builds that define COROCOLL_SEPARATE_COMPILATION"
#endif

#include <corocoll/corocoll.hpp>
