// The bodies of the non-template functions declared in <corocoll/core/cache_sizes.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/cache_sizes.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

COROCOLL_BEGIN_NAMESPACE

COROCOLL_DECL std::size_t parse_cache_size(std::string_view text) noexcept {
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
    std::size_t value = 0;
    std::size_t i = 0;
    constexpr std::size_t most = std::size_t{1} << 50;
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
        value = value * 10 + static_cast<std::size_t>(text[i] - '0');
        if (value > most) return 0;
    }
    if (i == 0) return 0;
    if (i == text.size()) return value;
    if (i + 1 != text.size()) return 0;
    switch (text[i]) {
        case 'K':
            return value << 10;
        case 'M':
            return value << 20;
        case 'G':
            return value << 30;
        default:
            return 0;
    }
}

namespace detail {
// The first line of file `path`, or "" where it cannot be read.
inline std::string first_line(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line;
}
}  // namespace detail

COROCOLL_DECL cache_sizes read_cache_sizes(const std::string& dir) {
    cache_sizes out;
    std::error_code ec;
    std::filesystem::directory_iterator it(dir, ec);
    if (ec) return out;
    for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
        if (ec) break;
        const auto& p = it->path();
        if (p.filename().string().rfind("index", 0) != 0) continue;
        const std::string level = detail::first_line(p / "level");
        const std::string type = detail::first_line(p / "type");
        const std::size_t size = parse_cache_size(detail::first_line(p / "size"));
        if (type == "Instruction" || size == 0) continue;
        if (level == "1" && type == "Data") out.l1d = size;
        if (level == "2") out.l2 = size;
        if (level == "3") out.l3 = size;
    }
    if (out.l1d != 0 || out.l2 != 0 || out.l3 != 0) out.source = dir;
    return out;
}

COROCOLL_DECL cache_sizes read_cache_sizes_sysconf() noexcept {
    cache_sizes out;
    auto size = [](int name) {
        long v = ::sysconf(name);
        return v > 0 ? static_cast<std::size_t>(v) : std::size_t{0};
    };
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE) && \
    defined(_SC_LEVEL3_CACHE_SIZE)
    out.l1d = size(_SC_LEVEL1_DCACHE_SIZE);
    out.l2 = size(_SC_LEVEL2_CACHE_SIZE);
    out.l3 = size(_SC_LEVEL3_CACHE_SIZE);
#else
    (void)size;
#endif
    if (out.l1d != 0 || out.l2 != 0 || out.l3 != 0) out.source = "sysconf";
    return out;
}

COROCOLL_DECL const cache_sizes& machine_cache_sizes() {
    static const cache_sizes sizes = [] {
        cache_sizes c = read_cache_sizes("/sys/devices/system/cpu/cpu0/cache");
        // Some virtual machines give no cache folder in sysfs: the C library then asks the
        // processor (CPUID on x86, with glibc).
        if (c.l1d == 0 && c.l2 == 0 && c.l3 == 0) c = read_cache_sizes_sysconf();
        if (const char* v = std::getenv("COROCOLL_CACHE_L2"); v != nullptr && *v != '\0') {
            const std::size_t l2 = parse_cache_size(v);
            if (l2 == 0) {
                throw std::invalid_argument(std::string("corocoll: COROCOLL_CACHE_L2='") + v +
                                            "' " + detail::cache_size_expected);
            }
            c.l2 = l2;
            c.source = (c.source == "unknown" ? "" : c.source + ", ") + "L2 from COROCOLL_CACHE_L2";
        }
        return c;
    }();
    return sizes;
}

COROCOLL_DECL std::string describe(const cache_sizes& c) {
    auto size = [](std::size_t b) {
        if (b == 0) return std::string("unknown");
        if (b % (std::size_t{1} << 20) == 0) return std::to_string(b >> 20) + " MiB";
        if (b % (std::size_t{1} << 10) == 0) return std::to_string(b >> 10) + " KiB";
        return std::to_string(b) + " B";
    };
    return "L1d " + size(c.l1d) + ", L2 " + size(c.l2) + ", L3 " + size(c.l3) + " (" + c.source +
           ")";
}

COROCOLL_END_NAMESPACE
