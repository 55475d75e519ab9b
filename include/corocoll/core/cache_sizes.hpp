#pragma once

// The sizes of this machine's caches, as the kernel reports them in sysfs: what the size
// thresholds that depend on a cache (where a shared-memory algorithm's working set stops
// fitting a core's L2) are derived from, instead of one machine's constants.

#include <corocoll/version.hpp>

#include <cstddef>
#include <string>
#include <string_view>

COROCOLL_BEGIN_NAMESPACE

/// Bytes of one core's caches; 0 where a level is not known.
struct cache_sizes {
    std::size_t l1d = 0;  ///< level 1, data
    std::size_t l2 = 0;   ///< level 2 (unified, or data)
    std::size_t l3 = 0;   ///< level 3 (usually shared by several cores)
    /// Where the figures came from: the sysfs folder read, or "sysconf" (and ", L2 from
    /// COROCOLL_CACHE_L2" where that variable set `l2`), or "unknown".
    std::string source = "unknown";
};

namespace detail {
/// What a COROCOLL_CACHE_L2 that is refused should have been.
inline constexpr const char* cache_size_expected =
    "is not a size (bytes, or a whole number with K, M or G: '512K', '2M')";
}  // namespace detail

/// A size as sysfs and COROCOLL_CACHE_L2 write it: a whole number of bytes with an optional
/// binary suffix K, M or G ("48K", "2048K", "300M", "524288"); 0 for anything else.
COROCOLL_DECL std::size_t parse_cache_size(std::string_view text) noexcept;

/// Reads the caches of one CPU from its sysfs folder `dir` (normally
/// /sys/devices/system/cpu/cpu0/cache): each index<N>/ subfolder's `level`, `type` and
/// `size`. A folder that is missing or unreadable gives every size 0; never throws.
COROCOLL_DECL cache_sizes read_cache_sizes(const std::string& dir);

/// The caches as the C library's sysconf reports them (_SC_LEVEL1_DCACHE_SIZE,
/// _SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE: glibc reads CPUID on x86); source "sysconf",
/// or every size 0 and "unknown" where it does not know them. Never throws.
COROCOLL_DECL cache_sizes read_cache_sizes_sysconf() noexcept;

/// This machine's caches: cpu0's sysfs folder (or, where that has no cache sizes, as some
/// virtual machines do, `read_cache_sizes_sysconf`), read once per process, with `l2` replaced by
/// COROCOLL_CACHE_L2 where that is set (for virtual machines that report a cache the host
/// does not give them). A COROCOLL_CACHE_L2 that is not a size throws std::invalid_argument
/// naming the variable and its value.
COROCOLL_DECL const cache_sizes& machine_cache_sizes();

/// How a `cache_sizes` reads in logs and benchmark headers: "L1d 48 KiB, L2 2 MiB, L3 300 MiB
/// (/sys/devices/system/cpu/cpu0/cache)".
COROCOLL_DECL std::string describe(const cache_sizes& c);

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/core/impl/cache_sizes.ipp>
#endif
