#pragma once

// Copying between a caller's buffer and shared memory without the slow case of the C
// library's memcpy. On some processors REP MOVSB, which glibc's memcpy uses for copies from a
// few KiB up to a bound (on AMD: the L2's size, glibc 2.33 and later), runs many times slower
// when the destination sits 1 to 31 bytes past the source, modulo a 4 KiB page (glibc bug
// 30994, "REP MOVSB performance suffers from page aliasing on Zen 4"; seen with glibc 2.36 on an
// AMD EPYC of family 25); the kernel's copies (process_vm_readv, sockets) use it too. A large
// buffer from malloc starts 16 bytes into a page (glibc maps it with a 16-byte header), and the
// arena's sets and the channels' rings start on lines whose place in a page is fixed: a copy from
// shared memory into such a buffer can sit 16 bytes past its source on every call. `copy_bytes`
// copies such a range 64 bytes at a time with vector moves where a probe found the slow case on
// this machine (docs/performance.md, "Copies whose destination sits just past their source";
// `benchmarks/misaligned_copy` measures both ways).

#include <corocoll/core/cache_sizes.hpp>
#include <corocoll/core/cheapest.hpp>
#include <corocoll/version.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

/// What the probe found: whether a memcpy whose destination sits 16 bytes past its source
/// (modulo a page) is slow here, and up to which size `copy_bytes` copies such ranges itself.
struct copy_probe {
    bool misaligned_slow = false;
    /// The bytes below which a slow offset is copied by lines: the L2's size (where glibc
    /// stops using REP MOVSB on AMD; above it memcpy is quick again and faster than the
    /// loop), `copy_probe_default_bound` where the L2 is not known.
    std::size_t below = 0;
};

/// Smallest copy that `copy_bytes` copies by lines: glibc's memcpy takes REP MOVSB from 2 KiB
/// and a bit (its default threshold with 32-byte vectors); below it memcpy is quick at any offset.
inline constexpr std::size_t copy_by_lines_from = 2048;
/// `copy_probe::below` where the L2 is not known.
inline constexpr std::size_t copy_probe_default_bound = std::size_t{512} << 10;
/// A memcpy at the slow offset counts as slow when it costs this many times an aligned one
/// of the same bytes (where it is slow it costs 5 to 25 times).
inline constexpr int misaligned_slow_factor = 3;

/// Whether the probe's two figures say the offset is slow (`misaligned_slow_factor`); false
/// where either is 0 (not measured).
constexpr bool misaligned_copy_slow(std::chrono::nanoseconds aligned,
                                    std::chrono::nanoseconds misaligned) noexcept {
    return aligned.count() > 0 && misaligned.count() > 0 &&
           misaligned.count() > misaligned_slow_factor * aligned.count();
}

/// Whether a copy to `to` from `from` sits at a slow offset: the destination 1 to 31 bytes
/// past the source, modulo a 4 KiB page.
inline bool slow_copy_offset(const void* to, const void* from) noexcept {
    const auto gap =
        (reinterpret_cast<std::uintptr_t>(to) - reinterpret_cast<std::uintptr_t>(from)) &
        std::uintptr_t{4095};
    return gap != 0 && gap < 32;
}

/// Whether `copy_bytes` copies `n` bytes from `from` to `to` by lines under `probe`.
inline bool copies_by_lines(const copy_probe& probe, void* to, const void* from,
                            std::size_t n) noexcept {
    return probe.misaligned_slow && n >= copy_by_lines_from && n < probe.below &&
           slow_copy_offset(to, from);
}

/// Calls of `copy_by_lines` in this process (relaxed: a count for tests and benchmarks).
inline std::atomic<std::uint64_t>& copies_by_lines() noexcept {
    static std::atomic<std::uint64_t> count{0};
    return count;
}

/// memcpy 64 bytes at a time (each a constant-size memcpy the compiler writes as vector
/// moves, never REP MOVSB), the tail by memcpy (under 64 bytes: quick at any offset).
inline void copy_by_lines(void* to, const void* from, std::size_t n) noexcept {
    copies_by_lines().fetch_add(1, std::memory_order_relaxed);
    auto* d = static_cast<std::byte*>(to);
    const auto* s = static_cast<const std::byte*>(from);
    std::size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __builtin_memcpy(d + i, s + i, 64);
        // Keeps the compiler from turning the loop back into one memcpy call (clang's and
        // g++'s loop idiom passes do at -O2 and above).
        asm volatile("");
    }
    if (i < n) std::memcpy(d + i, s + i, n - i);
}

/// Times memcpy of 16 KiB at offsets 0 and 16 (the cheapest of 16 each: 32 copies) once per
/// process and keeps what it found; the L2 from
/// `machine_cache_sizes` (where that throws, as for a bad COROCOLL_CACHE_L2, or knows no L2:
/// `copy_probe_default_bound`).
inline copy_probe& copy_probe_kept() noexcept {
    static copy_probe probe = [] {
        constexpr std::size_t bytes = std::size_t{16} << 10;
        copy_probe p;
        std::size_t l2 = 0;
        try {
            l2 = machine_cache_sizes().l2;
        } catch (...) {
        }
        p.below = l2 > 0 ? l2 : copy_probe_default_bound;
        // Without the room to measure in, the offset counts as quick (memcpy everywhere).
        const std::unique_ptr<std::byte[]> room(new (std::nothrow) std::byte[2 * bytes + 8192]());
        if (!room) return p;
        auto* src = reinterpret_cast<std::byte*>(
            (reinterpret_cast<std::uintptr_t>(room.get()) + 4095) & ~std::uintptr_t{4095});
        std::byte* dst = src + bytes;  // the same place in a page
        auto time_at = [&](std::size_t offset) {
            return cheapest_of(16, [&] {
                std::memcpy(dst + offset, src, bytes);
                asm volatile("" : : "r"(dst) : "memory");  // the copy is used
                return true;
            });
        };
        p.misaligned_slow = misaligned_copy_slow(time_at(0), time_at(16));
        return p;
    }();
    return probe;
}

/// What the probe found on this machine (`copy_probe_kept`).
inline const copy_probe& machine_copy_probe() noexcept { return copy_probe_kept(); }

/// Replaces what the probe found, for tests that take the other way on any machine: call it
/// before any thread copies.
inline void set_copy_probe(const copy_probe& p) noexcept { copy_probe_kept() = p; }

}  // namespace detail

/// Copies `n` bytes from `from` to `to` (which do not overlap), as memcpy does, but where this
/// machine's memcpy is slow at their offset (`detail::machine_copy_probe`, measured at the
/// first copy of 2 KiB or more), 64 bytes at a time. Costs one comparison more than memcpy.
inline void copy_bytes(void* to, const void* from, std::size_t n) noexcept {
    if (n >= detail::copy_by_lines_from && detail::slow_copy_offset(to, from) &&
        detail::copies_by_lines(detail::machine_copy_probe(), to, from, n)) {
        detail::copy_by_lines(to, from, n);
        return;
    }
    std::memcpy(to, from, n);
}

COROCOLL_END_NAMESPACE
