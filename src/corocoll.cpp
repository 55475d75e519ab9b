// The one translation unit that holds corocoll's non-template function bodies in a build with
// COROCOLL_SEPARATE_COMPILATION (Meson: -Dseparate_compilation=true; CMake: the
// corocoll::compiled target).

#include <corocoll/impl/src.hpp>
