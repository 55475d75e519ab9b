#include <corocoll/core/prefetch.hpp>
#include <corocoll/corocoll.hpp>

#include <doctest/doctest.h>

#include <stdlib.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace cc = corocoll;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kib = std::size_t{1} << 10;
constexpr std::size_t mib = std::size_t{1} << 20;

// A folder laid out as sysfs lays out one CPU's caches, removed when the test ends.
struct fake_cache_dir {
    fake_cache_dir() {
        std::string pattern = (std::filesystem::temp_directory_path() / "cache_sizes.XXXXXX");
        if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
        path = pattern;
    }
    fake_cache_dir(const fake_cache_dir&) = delete;
    fake_cache_dir& operator=(const fake_cache_dir&) = delete;
    ~fake_cache_dir() { std::filesystem::remove_all(path); }
    void add(int index, const char* level, const char* type, const char* size) const {
        auto dir = path / ("index" + std::to_string(index));
        std::filesystem::create_directories(dir);
        std::ofstream(dir / "level") << level << "\n";
        std::ofstream(dir / "type") << type << "\n";
        std::ofstream(dir / "size") << size << "\n";
    }
    std::filesystem::path path;
};

}  // namespace

TEST_CASE("cache sizes are read as sysfs writes them: bytes with K, M or G") {
    CHECK(cc::parse_cache_size("48K") == 48 * kib);
    CHECK(cc::parse_cache_size("2048K\n") == 2 * mib);
    CHECK(cc::parse_cache_size("300M") == 300 * mib);
    CHECK(cc::parse_cache_size("1G") == std::size_t{1} << 30);
    CHECK(cc::parse_cache_size("524288") == 512 * kib);
    for (const char* bad : {"", "K", "2MB", "2 M", "-1", "1.5M", "2k", "99999999999999999999"}) {
        CAPTURE(bad);
        CHECK(cc::parse_cache_size(bad) == 0);
    }
}

TEST_CASE("a CPU's sysfs cache folder gives L1d, L2 and L3, leaving the instruction cache out") {
    fake_cache_dir dir;
    dir.add(0, "1", "Data", "32K");
    dir.add(1, "1", "Instruction", "64K");
    dir.add(2, "2", "Unified", "512K");
    dir.add(3, "3", "Unified", "8192K");
    auto c = cc::read_cache_sizes(dir.path.string());
    CHECK(c.l1d == 32 * kib);
    CHECK(c.l2 == 512 * kib);
    CHECK(c.l3 == 8 * mib);
    CHECK(c.source == dir.path.string());
    CHECK(cc::describe(c) == "L1d 32 KiB, L2 512 KiB, L3 8 MiB (" + dir.path.string() + ")");

    SUBCASE("a level without a size stays unknown") {
        dir.add(3, "3", "Unified", "");
        auto d = cc::read_cache_sizes(dir.path.string());
        CHECK(d.l3 == 0);
        CHECK(d.l2 == 512 * kib);
    }
}

TEST_CASE("a missing sysfs folder gives unknown sizes, and thresholds as measured") {
    auto c = cc::read_cache_sizes("/nonexistent/cpu0/cache");
    CHECK(c.l1d == 0);
    CHECK(c.l2 == 0);
    CHECK(c.l3 == 0);
    CHECK(c.source == "unknown");
    auto t = cc::collectives::thresholds::for_l2(c.l2);
    cc::collectives::thresholds measured;
    CHECK(t.shm_pair_ring_from == measured.shm_pair_ring_from);
    CHECK(t.shm_pair_ring_below == measured.shm_pair_ring_below);
    CHECK(t.shm_pair_single_copy_tree_from == measured.shm_pair_single_copy_tree_from);
}

TEST_CASE("where sysfs gives no cache sizes, the machine's come from sysconf") {
    // Some virtual machines have no /sys/devices/system/cpu/cpu0/cache (an AMD EPYC VM here:
    // the thresholds stayed as measured on a 2 MiB L2 while getconf said 1 MiB).
    auto from_sysfs = cc::read_cache_sizes("/sys/devices/system/cpu/cpu0/cache");
    auto from_sysconf = cc::read_cache_sizes_sysconf();
    const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    CHECK(from_sysconf.l2 == (l2 > 0 ? static_cast<std::size_t>(l2) : 0));
    CHECK(from_sysconf.source ==
          (from_sysconf.l1d + from_sysconf.l2 + from_sysconf.l3 > 0 ? "sysconf" : "unknown"));
    if (std::getenv("COROCOLL_CACHE_L2") != nullptr) return;
    // Asked in a rank of its own: this process never asks (the test below needs it so).
    cc::spawn_options o;
    o.timeout = 60s;
    auto result = cc::spawn_ranks(
        1,
        [&](cc::process_group&) -> cc::task<> {
            const auto& machine = cc::machine_cache_sizes();
            const auto& want =
                from_sysfs.l1d + from_sysfs.l2 + from_sysfs.l3 > 0 ? from_sysfs : from_sysconf;
            if (machine.l2 != want.l2 || machine.source != want.source) {
                throw std::runtime_error("machine_cache_sizes: " + cc::describe(machine) +
                                         ", expected " + cc::describe(want));
            }
            co_return;
        },
        o);
    MESSAGE("sysfs: " << cc::describe(from_sysfs) << "; sysconf: " << cc::describe(from_sysconf));
    CAPTURE(result.ranks.at(0).describe());
    CHECK(result.ranks.at(0).ok());
}

TEST_CASE("the L2-bound thresholds follow the L2, to a power of two, within 4x either way") {
    using cc::collectives::thresholds;
    struct row {
        std::size_t l2, ring_from, ring_below, tree_from;
    };
    const row rows[] = {
        {2 * mib, 512 * kib, 4 * mib, 2 * mib},      // the machine they were measured on
        {512 * kib, 128 * kib, 1 * mib, 512 * kib},  // a quarter
        {1280 * kib, 256 * kib, 2 * mib, 1 * mib},   // 1.25 MiB: nearest power of two, a half
        {1 * mib, 256 * kib, 2 * mib, 1 * mib},     {4 * mib, 1 * mib, 8 * mib, 4 * mib},
        {256 * kib, 128 * kib, 1 * mib, 512 * kib},  // kept at a quarter
        {64 * mib, 2 * mib, 16 * mib, 8 * mib},      // kept at four times
    };
    for (const auto& r : rows) {
        CAPTURE(r.l2);
        auto t = thresholds::for_l2(r.l2);
        CHECK(t.shm_pair_ring_from == r.ring_from);
        CHECK(t.shm_pair_ring_below == r.ring_below);
        CHECK(t.shm_pair_single_copy_tree_from == r.tree_from);
        CHECK(t.shm_pair_rooted_below == r.tree_from / 2);  // half the L2, scaled alike
        CHECK(t.shm_rooted_below == r.tree_from / 2);       // on 3 to 8 ranks too
        // Thresholds of TCP and of more than 2 ranks do not depend on a core's L2, nor does
        // the 2-rank all_reduce's window (measured on two CPUs whose L2 differs).
        CHECK(t.all_reduce_ring_bytes == thresholds{}.all_reduce_ring_bytes);
        CHECK(t.shm_pair_all_reduce_ring_from == 128 * kib);
        CHECK(t.shm_pair_all_reduce_ring_below == 4 * mib);
        CHECK(t.shm_broadcast_tree_below == thresholds{}.shm_broadcast_tree_below);
        // Nor does the 2-rank message window (a cost per call).
        CHECK(t.shm_pair_message_from == thresholds{}.shm_pair_message_from);
        CHECK(t.shm_pair_gather_message_from == thresholds{}.shm_pair_gather_message_from);
        CHECK(t.shm_pair_message_below == thresholds{}.shm_pair_message_below);
    }
}

TEST_CASE(
    "a 2-rank all_reduce goes by the ring from 128 KiB up to 4 MiB on any L2, by the arena "
    "elsewhere, and by the arena's single copies from the L2's size") {
    // Before, its window followed the L2 (256 KiB to 2 MiB on a 1 MiB L2), and on an AMD EPYC
    // with a 1 MiB L2 the arena took 240 us at 2 MiB where the ring took 175.
    using namespace cc::collectives;
    using cc::transport::single_copy_use;
    const algorithm_choice none;
    auto pick = [&](std::size_t bytes, std::size_t l2, std::size_t single, int n = 2) {
        return select(collective_kind::all_reduce, bytes, n, none, thresholds::for_l2(l2), nullptr,
                      true, single);
    };
    for (std::size_t l2 : {std::size_t{0}, 512 * kib, 1 * mib, 2 * mib, 4 * mib}) {
        CAPTURE(l2);
        // Without single copies.
        CHECK(pick(64 * kib, l2, 0) == algorithm::shm);
        CHECK(pick(128 * kib, l2, 0) == algorithm::ring);
        CHECK(pick(2 * mib, l2, 0) == algorithm::ring);
        CHECK(pick(4 * mib - 4, l2, 0) == algorithm::ring);
        CHECK(pick(4 * mib, l2, 0) == algorithm::shm);
        CHECK(pick(1 * mib, l2, 0, 3) == algorithm::shm);  // 2 ranks only
        // With them, as the arena of a 2-rank group sets them by default: from the L2's size
        // (2 MiB where it is not known), the ring's window ending there.
        const std::size_t single = cc::transport::detail::single_copy_from_for(
            single_copy_use::all_reduce, 2, cc::transport::engine_options::automatic_single_copy,
            l2);
        CHECK(single == (l2 > 0 ? l2 : 2 * mib));
        CHECK(pick(128 * kib, l2, single) == algorithm::ring);
        CHECK(pick(single - 4, l2, single) == algorithm::ring);
        CHECK(pick(single, l2, single) == algorithm::shm);
        CHECK(pick(64 * mib, l2, single) == algorithm::shm);
        // None on more ranks, by default or set.
        CHECK(cc::transport::detail::single_copy_from_for(
                  single_copy_use::all_reduce, 3,
                  cc::transport::engine_options::automatic_single_copy, l2) == 0);
        CHECK(cc::transport::detail::single_copy_from_for(single_copy_use::all_reduce, 4, 16 * kib,
                                                          l2) == 0);
        CHECK(cc::transport::detail::single_copy_from_for(single_copy_use::all_reduce, 2, 16 * kib,
                                                          l2) == 16 * kib);
        // Where a process_vm_readv costs 1 us or more before it copies (a VM that traps system
        // calls: 1.9-2.1 us, and single copies lost by 2-3x from 16 KiB to 256 KiB-1 MiB), the
        // 2-rank sizes of broadcast, gather, scatter and all_to_all move up with the L2, and
        // all_gather and all_reduce of 2 ranks make none (the pair's ring, both ranks copying at
        // once, led them at every size); not on more ranks, not a set one.
        const std::size_t m = l2 > 0 ? l2 : 2 * mib;
        for (auto cost : {std::chrono::nanoseconds{999}, std::chrono::nanoseconds{1000},
                          std::chrono::nanoseconds{2100}}) {
            const long long ns = cost.count();
            CAPTURE(ns);
            const bool slow = cost >= cc::transport::detail::slow_single_copy;
            auto from = [&](single_copy_use u, int n, std::size_t option) {
                return cc::transport::detail::single_copy_from_for(u, n, option, l2, cost);
            };
            const std::size_t automatic = cc::transport::engine_options::automatic_single_copy;
            CHECK(from(single_copy_use::broadcast, 2, automatic) == (slow ? m : 16 * kib));
            CHECK(from(single_copy_use::all_gather, 2, automatic) == (slow ? 0 : 8 * kib));
            CHECK(from(single_copy_use::gather, 2, automatic) == (slow ? m / 2 : 16 * kib));
            CHECK(from(single_copy_use::scatter, 2, automatic) == (slow ? m / 2 : 16 * kib));
            CHECK(from(single_copy_use::all_to_all, 2, automatic) == (slow ? m / 2 : 16 * kib));
            CHECK(from(single_copy_use::all_reduce, 2, automatic) == (slow ? 0 : m));
            CHECK(from(single_copy_use::all_reduce, 2, 16 * kib) == 16 * kib);
            CHECK(from(single_copy_use::all_to_all, 2, 16 * kib) == 16 * kib);
            // 3 to 8 ranks: scatter from blocks of the L2 over the ranks (never below the size
            // of a quick process_vm_readv); all_to_all from 24 KiB blocks, none where slow (the
            // messages led from 128 KiB blocks to 16 MiB ones).
            for (int n : {3, 4, 8}) {
                CAPTURE(n);
                const std::size_t per_rank = m / static_cast<std::size_t>(n);
                CHECK(from(single_copy_use::scatter, n, automatic) ==
                      (slow ? std::max(64 * kib, per_rank) : 64 * kib));
                CHECK(from(single_copy_use::all_to_all, n, automatic) == (slow ? 0 : 24 * kib));
                CHECK(from(single_copy_use::all_to_all, n, 64 * kib) == 64 * kib);
                CHECK(from(single_copy_use::broadcast, n, automatic) == 0);
                CHECK(from(single_copy_use::all_to_all, 9, automatic) == 0);
            }
            // Where it is slow, all_to_all of 2 ranks ends its single copies at blocks of 8 L2s
            // (the pair's ring led from 16 MiB blocks on a 1 MiB L2); no other use, no other
            // group size, no set size, no bound where it is quick.
            auto below = [&](single_copy_use u, int n, std::size_t option) {
                return cc::transport::detail::single_copy_below_for(u, n, option, l2, cost);
            };
            for (int n : {2, 3, 4, 8, 9}) {
                CAPTURE(n);
                const bool bounded = slow && n == 2;
                CHECK(below(single_copy_use::all_to_all, n, automatic) == (bounded ? 8 * m : 0));
                CHECK(below(single_copy_use::all_to_all, n, 64 * kib) == 0);
                for (auto u : {single_copy_use::broadcast, single_copy_use::all_gather,
                               single_copy_use::gather, single_copy_use::scatter,
                               single_copy_use::all_reduce}) {
                    CHECK(below(u, n, automatic) == 0);
                }
            }
            CHECK(from(single_copy_use::broadcast, 2, 16 * kib) == 16 * kib);
        }
    }
}

TEST_CASE("an all_to_all of 2 ranks leaves its single copies at the arena's bound") {
    // The block (a rank's share) from `single_copy_below` on goes pairwise, through the pair's
    // ring, as without an arena (the buffer is far past shm_pair_exchange_below); from
    // `single_copy_from` below it, and from there with no bound, by the arena's single copies;
    // below `single_copy_from` pairwise too, and through the data sets below the exchange's
    // bound.
    using namespace cc::collectives;
    // The window that both the arena and select read: from inclusive, below exclusive, 0 from
    // never, 0 below no bound.
    using cc::transport::in_single_copy_sizes;
    CHECK_FALSE(in_single_copy_sizes(1 * mib, 0, 0));
    CHECK_FALSE(in_single_copy_sizes(512 * kib - 1, 512 * kib, 8 * mib));
    CHECK(in_single_copy_sizes(512 * kib, 512 * kib, 8 * mib));
    CHECK_FALSE(in_single_copy_sizes(8 * mib, 512 * kib, 8 * mib));
    CHECK(in_single_copy_sizes(64 * mib, 512 * kib, 0));
    const algorithm_choice none;
    for (std::size_t l2 : {512 * kib, 1 * mib, 2 * mib}) {
        CAPTURE(l2);
        const thresholds t = thresholds::for_l2(l2);
        auto pick = [&](std::size_t block, std::size_t below) {
            return select(collective_kind::all_to_all, 2 * block, 2, none, t, nullptr, true, l2 / 2,
                          below);
        };
        CHECK(pick(16 * kib, 8 * l2) == algorithm::shm);  // the data sets
        CHECK(pick(64 * kib, 8 * l2) == algorithm::pairwise);
        CHECK(pick(l2 / 2 - 64, 8 * l2) == algorithm::pairwise);
        CHECK(pick(l2 / 2, 8 * l2) == algorithm::shm);  // single copies
        CHECK(pick(8 * l2 - 64, 8 * l2) == algorithm::shm);
        CHECK(pick(8 * l2, 8 * l2) == algorithm::pairwise);
        CHECK(pick(32 * l2, 8 * l2) == algorithm::pairwise);
        CHECK(pick(32 * l2, 0) == algorithm::shm);
    }
}

TEST_CASE("the cost of a process_vm_readv is measured once, and is 0 only where it is refused") {
    const auto first = cc::transport::detail::single_copy_cost();
    CHECK(cc::transport::detail::single_copy_cost() == first);
    char from[8] = {1, 2, 3};
    char to[8] = {};
    iovec local{to, sizeof(to)};
    iovec remote{from, sizeof(from)};
    const bool works = ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == 8;
    CHECK(works == (first.count() > 0));
    const std::string cost = "a process_vm_readv of 64 B: " + std::to_string(first.count()) + " ns";
    MESSAGE(cost);
}

// Children of spawn_ranks read the machine's caches afresh: this process never asks first.
TEST_CASE("COROCOLL_CACHE_L2 moves a group's thresholds, and the group still computes right") {
    ::setenv("COROCOLL_CACHE_L2", "512K", 1);
    cc::spawn_options o;
    o.timeout = 60s;
    auto result = cc::spawn_ranks(
        2,
        [](cc::process_group& pg) -> cc::task<> {
            if (cc::machine_cache_sizes().l2 != 512 * kib) {
                throw std::runtime_error("machine_cache_sizes: " +
                                         cc::describe(cc::machine_cache_sizes()));
            }
            const auto& t = pg.size_thresholds();
            if (t.shm_pair_ring_from != 128 * kib ||
                t.shm_pair_single_copy_tree_from != 512 * kib) {
                throw std::runtime_error("thresholds not derived from a 512 KiB L2: ring from " +
                                         std::to_string(t.shm_pair_ring_from));
            }
            // 256 KiB: the ring's all_reduce on any L2.
            std::vector<float> v(64 * 1024, static_cast<float>(pg.rank() + 1));
            co_await pg.all_reduce(v);
            for (float x : v) {
                if (x != 3.0f) throw std::runtime_error("all_reduce gave " + std::to_string(x));
            }
        },
        o);
    ::unsetenv("COROCOLL_CACHE_L2");
    for (const auto& rank : result.ranks) {
        CAPTURE(rank.describe());
        CHECK(rank.ok());
    }
}

TEST_CASE(
    "a prefetch for writing changes nothing, and faults on no page, not even a read-only one") {
    // A hint (core/prefetch.hpp), not a store: an arena rank asks for a step place it will
    // write two steps on, which a reader may still be reading.
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    void* p = ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    auto* bytes = static_cast<unsigned char*>(p);
    for (std::size_t i = 0; i < page; ++i) bytes[i] = static_cast<unsigned char>(i * 7);
    REQUIRE(::mprotect(bytes + page, page, PROT_READ) == 0);
    for (std::size_t i = 0; i < 2 * page; i += 64) cc::prefetch_for_write(bytes + i);
    std::size_t changed = 0;
    for (std::size_t i = 0; i < page; ++i) changed += bytes[i] != static_cast<unsigned char>(i * 7);
    for (std::size_t i = page; i < 2 * page; ++i) changed += bytes[i] != 0;
    CHECK(changed == 0);
    ::munmap(p, 2 * page);
}
