#pragma once

// Asking a cache line for writing before the write: a store to a line that another core read
// last waits in the store buffer until this core owns the line, and x86 commits stores in
// order, so every later store (a push, a field of a private object) waits behind it. A
// prefetch for writing fetches ownership without a store: the stores that come later find the
// line ready. Used where a rank writes shared lines that a peer read a few calls before
// (transport/shm/arena.hpp: a rank's step places).

#include <corocoll/version.hpp>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

COROCOLL_BEGIN_NAMESPACE

namespace detail {

#if defined(__x86_64__) || defined(__i386__)
/// Whether this x86 processor has PREFETCHW (CPUID 0x80000001, ECX bit 8: Intel from
/// Broadwell, AMD since long before): without it the instruction is not defined.
inline bool has_prefetchw() noexcept {
    static const bool has = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;
        return __get_cpuid(0x80000001, &a, &b, &c, &d) != 0 && (c & (1u << 8)) != 0;
    }();
    return has;
}
#endif

}  // namespace detail

/// Asks for the cache line at `p` for writing, where the processor can (a hint: nothing
/// changes in memory, and nothing happens where it cannot).
inline void prefetch_for_write(const void* p) noexcept {
#if defined(__x86_64__) || defined(__i386__)
    // Inline, not __builtin_prefetch: that writes PREFETCHW only where the whole program is
    // built for it (-mprfchw), and a library whose users vendor its headers cannot ask that.
    if (detail::has_prefetchw()) asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
    __builtin_prefetch(p, 1, 3);
#endif
}

COROCOLL_END_NAMESPACE
