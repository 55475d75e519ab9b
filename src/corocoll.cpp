// The one translation unit that holds corocoll's non-template function bodies in a build with
// COROCOLL_SEPARATE_COMPILATION (Meson: -Dseparate_compilation, on by default in corocoll's own
// build; CMake: the corocoll::compiled target).

#include <corocoll/impl/src.hpp>
