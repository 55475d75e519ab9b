#include <corocoll/core/copy.hpp>
#include <corocoll/corocoll.hpp>

#include "../support/ranks.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace cc = corocoll;
using namespace corocoll_test;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kib = std::size_t{1} << 10;

// Two page-aligned areas with room for `bytes` at any offset in a page; the source holds a
// pattern that differs at every byte of a run, the destination a filler to find overruns in.
struct areas {
    explicit areas(std::size_t bytes)
        : room_(bytes + 3 * 4096),
          from_room_(new std::byte[room_]),
          to_room_(new std::byte[room_]) {
        from = page_of(from_room_.get());
        to = page_of(to_room_.get());
        for (std::size_t i = 0; i < bytes + 4096; ++i) {
            from[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
        }
    }
    void fill_to() {
        for (std::size_t i = 0; i < room_ - 4096; ++i) to[i] = std::byte{0xee};
    }
    static std::byte* page_of(std::byte* p) {
        return reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(p) + 4095) &
                                            ~std::uintptr_t{4095});
    }
    std::size_t room_;
    std::unique_ptr<std::byte[]> from_room_, to_room_;
    std::byte* from = nullptr;
    std::byte* to = nullptr;
};

// Whether `to[at, at + n)` holds `from[src, src + n)` and the 64 bytes either side still hold
// the filler.
bool copied_exactly(const areas& a, std::size_t at, std::size_t src, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        if (a.to[at + i] != a.from[src + i]) return false;
    }
    for (std::size_t i = 1; i <= 64 && i <= at; ++i) {
        if (a.to[at - i] != std::byte{0xee}) return false;
    }
    for (std::size_t i = 0; i < 64; ++i) {
        if (a.to[at + n + i] != std::byte{0xee}) return false;
    }
    return true;
}

}  // namespace

TEST_CASE("copy_bytes copies every byte and nothing beside it at every offset and size") {
    // Sizes: 0, 1, about a line, just below, at and above the size from which a slow offset
    // is copied by lines, and larger ones with tails; offsets of the destination past the
    // source modulo a page: the slow ones (1-31), the quick ones around them, a page apart.
    const std::vector<std::size_t> sizes = {
        0, 1, 63, 64, 65, 2047, 2048, 2049, 4096, 4096 + 17, 9 * kib + 5, 64 * kib, 64 * kib + 63};
    const std::vector<std::size_t> dst_at = {0, 1, 15, 16, 17, 31, 32, 33, 48, 63, 64, 4095};
    const std::vector<std::size_t> src_at = {0, 16, 40};
    areas a(64 * kib + 128);
    for (std::size_t n : sizes) {
        for (std::size_t s : src_at) {
            for (std::size_t d : dst_at) {
                a.fill_to();
                const std::size_t at = 64 + d;  // room for the guard below
                cc::copy_bytes(a.to + at, a.from + s, n);
                CAPTURE(n);
                CAPTURE(s);
                CAPTURE(d);
                CHECK(copied_exactly(a, at, s, n));
            }
        }
    }
}

TEST_CASE("copy_by_lines copies what memcpy copies, tail included") {
    areas a(8 * kib);
    for (std::size_t n :
         {std::size_t{0}, std::size_t{64}, std::size_t{100}, 2 * kib + 1, 8 * kib - 1}) {
        a.fill_to();
        cc::detail::copy_by_lines(a.to + 80, a.from + 3, n);
        CAPTURE(n);
        CHECK(copied_exactly(a, 80, 3, n));
    }
}

TEST_CASE("a slow offset is a destination 1 to 31 bytes past its source, modulo a page") {
    std::vector<std::byte> room(3 * 4096);
    std::byte* base = areas::page_of(room.data());
    CHECK_FALSE(cc::detail::slow_copy_offset(base, base));
    CHECK(cc::detail::slow_copy_offset(base + 1, base));
    CHECK(cc::detail::slow_copy_offset(base + 16, base));
    CHECK(cc::detail::slow_copy_offset(base + 31, base));
    CHECK_FALSE(cc::detail::slow_copy_offset(base + 32, base));
    CHECK_FALSE(cc::detail::slow_copy_offset(base + 64, base));
    // A page and 16 bytes apart is 16 modulo a page; 16 bytes before is 4080.
    CHECK(cc::detail::slow_copy_offset(base + 4096 + 16, base));
    CHECK_FALSE(cc::detail::slow_copy_offset(base, base + 16));
    CHECK(cc::detail::slow_copy_offset(base + 4096 + 8, base + 4096 + 4096 - 8 - 4096));
}

TEST_CASE("copy_bytes goes by lines only where the probe found the offset slow, within its sizes") {
    std::vector<std::byte> room(3 * 4096);
    std::byte* from = areas::page_of(room.data());
    std::byte* slow_to = from + 16;
    std::byte* quick_to = from + 48;
    const cc::detail::copy_probe slow{true, 512 * kib};
    CHECK_FALSE(
        cc::detail::copies_by_lines(slow, slow_to, from, cc::detail::copy_by_lines_from - 1));
    CHECK(cc::detail::copies_by_lines(slow, slow_to, from, cc::detail::copy_by_lines_from));
    CHECK(cc::detail::copies_by_lines(slow, slow_to, from, 512 * kib - 1));
    CHECK_FALSE(cc::detail::copies_by_lines(slow, slow_to, from, 512 * kib));
    CHECK_FALSE(cc::detail::copies_by_lines(slow, quick_to, from, 64 * kib));
    const cc::detail::copy_probe quick{false, 512 * kib};
    CHECK_FALSE(cc::detail::copies_by_lines(quick, slow_to, from, 64 * kib));
}

TEST_CASE("the probe calls an offset slow at more than three times the aligned copy's cost") {
    CHECK(cc::detail::misaligned_copy_slow(200ns, 5600ns));
    CHECK(cc::detail::misaligned_copy_slow(200ns, 601ns));
    CHECK_FALSE(cc::detail::misaligned_copy_slow(200ns, 600ns));
    CHECK_FALSE(cc::detail::misaligned_copy_slow(200ns, 280ns));
    // Not measured (a figure of 0): never slow.
    CHECK_FALSE(cc::detail::misaligned_copy_slow(0ns, 5600ns));
    CHECK_FALSE(cc::detail::misaligned_copy_slow(200ns, 0ns));
}

TEST_CASE("the probe bounds its sizes by this machine's L2, or 512 KiB where that is not known") {
    const auto& probe = cc::detail::machine_copy_probe();
    const std::size_t l2 = cc::machine_cache_sizes().l2;
    CHECK(probe.below == (l2 > 0 ? l2 : cc::detail::copy_probe_default_bound));
    // The same result on every call: measured once.
    CHECK(&cc::detail::machine_copy_probe() == &probe);
}

TEST_CASE("single copies into a buffer at a slow offset arrive whole, by lines only where slow") {
    // 2 ranks with single copies from 16 KiB: all_gather and all_to_all read each other's
    // blocks of 80 KiB (a sweep piece of 64 KiB and 16 KiB) straight from the other's buffer.
    // The outputs sit 16 bytes into a page and the inputs at a page's start: every copy's
    // destination is 16 bytes past its source modulo a page. Where the probe calls that slow,
    // each piece lands in the copier's own memory first and goes on by lines (counted); where
    // it does not, no copy goes by lines.
    const cc::detail::copy_probe found = cc::detail::machine_copy_probe();
    for (bool slow : {true, false}) {
        CAPTURE(slow);
        cc::detail::set_copy_probe({slow, std::size_t{512} << 10});
        thread_ranks_options o;
        o.limits.shm_arena_single_copy_bytes = 16 * kib;
        const std::uint64_t before = cc::detail::copies_by_lines().load();
        check_every_rank_ok(run_threads(
            2,
            [](cc::process_group& pg) -> cc::task<> {
                namespace coll = cc::collectives;
                for (auto k :
                     {coll::collective_kind::all_gather, coll::collective_kind::all_to_all})
                    pg.set_algorithm(k, coll::algorithm::shm);
                constexpr std::size_t count = 20 * 1024;  // int32: 80 KiB, 20 pages
                const int r = pg.rank();
                areas in_room(2 * count * 4), out_room(2 * count * 4 + 64);
                std::span<std::int32_t> in(reinterpret_cast<std::int32_t*>(in_room.from),
                                           2 * count);
                std::span<std::int32_t> out(reinterpret_cast<std::int32_t*>(out_room.to + 16),
                                            2 * count);
                auto value = [](int from, int to, std::size_t i) {
                    return from * 1000000 + to * 100000 + static_cast<std::int32_t>(i % 99991);
                };
                for (std::size_t i = 0; i < count; ++i) in[i] = value(r, 0, i);
                std::span<std::int32_t> mine = in.first(count);
                co_await pg.all_gather_into(out, mine);
                for (std::size_t i = 0; i < 2 * count; ++i) {
                    const int from = static_cast<int>(i / count);
                    if (out[i] != value(from, 0, i % count)) {
                        throw std::runtime_error("all_gather: element " + std::to_string(i));
                    }
                }
                for (std::size_t i = 0; i < 2 * count; ++i) {
                    in[i] = value(r, static_cast<int>(i / count), i % count);
                }
                co_await pg.all_to_all_single(out, in);
                for (std::size_t i = 0; i < 2 * count; ++i) {
                    const int from = static_cast<int>(i / count);
                    if (out[i] != value(from, r, i % count)) {
                        throw std::runtime_error("all_to_all: element " + std::to_string(i));
                    }
                }
            },
            o));
        const std::uint64_t by_lines = cc::detail::copies_by_lines().load() - before;
        if (slow) {
            // The bounces: each rank, the other's block of each call in two pieces (8 in
            // all), beside the local copies of each rank's own block (6 here without them).
            CHECK(by_lines >= 12);
        } else {
            CHECK(by_lines == 0);
        }
    }
    cc::detail::set_copy_probe(found);
}
