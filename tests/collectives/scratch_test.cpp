// What the large collectives allocate once they run in a loop. A group keeps its temporaries of
// up to 8 MiB from call to call, and larger ones until 16 calls in a row have not used them
// (before, it freed those after each collective, so a collective that needed a temporary as
// large as its input paid for fresh pages at every call: a 4-rank reduce of 64 MiB). The
// large collectives also avoid such temporaries where they can: on 2 ranks
// reduce_scatter of 64 MiB copied its input into such a buffer and took 240-270 ms, against
// 3.4-4.5 ms at 16 MiB (issue 13); reduce took two such temporaries (58 ms at 64 MiB). Also:
// reduce_scatter_into whose output is its own block of the input (in place, as NCCL allows), which
// cannot take that path.

#include "../support/largest_allocation.hpp"
#include "../support/ranks.hpp"
#include "../support/sanitized.hpp"

#include <doctest/doctest.h>

#include <latch>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

using namespace corocoll_test;

namespace {

// Each rank's input: element i of rank r is r + 1 + (i % 7), exact in float for any sum here.
// Fills in place: no allocation while the test watches.
void fill_input(std::span<float> in, int rank) {
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(rank + 1 + (i % 7));
}

std::vector<float> input_of(int rank, std::size_t count) {
    std::vector<float> in(count);
    fill_input(in, rank);
    return in;
}

// The sum over `n` ranks of element `i` of their inputs.
float sum_of(int n, std::size_t i) {
    return static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7));
}

void require(bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error(what);
}

// Blocks of 5 MiB: an input of 2 or 3 blocks is above what the group keeps between calls.
constexpr std::size_t block_count = (std::size_t{5} << 20) / sizeof(float);

// World sizes of the loop: 2 and 3 ranks; 2 under sanitizers, where the 10-15 MiB inputs are
// filled and checked element by element through instrumented code (TSan: 101 s for both).
std::vector<int> worlds() {
    if (sanitized) return {2};
    return {2, 3};
}

}  // namespace

TEST_CASE(
    "reduce_scatter_into, all_reduce and reduce in a loop need no temporary larger than a block") {
    for (int n : worlds()) {
        CAPTURE(n);
        std::vector<std::size_t> largest(static_cast<std::size_t>(n) * 3);
        auto errors = run_threads(n, [&](cc::process_group& pg) -> cc::task<> {
            int r = pg.rank();
            std::size_t count = block_count * static_cast<std::size_t>(n);
            std::vector<float> in = input_of(r, count);
            std::vector<float> out(block_count);
            std::vector<float> data = input_of(r, count);
            // A first call of each sets up what later calls reuse.
            co_await pg.reduce_scatter_into(out, in);
            co_await pg.all_reduce(data);
            std::vector<float> reduced = input_of(r, count);
            co_await pg.reduce(reduced, 0);
            for (int which = 0; which < 3; ++which) {
                co_await pg.barrier();
                if (r == 0) largest_allocation = 0;
                co_await pg.barrier();
                for (int i = 0; i < 2; ++i) {
                    if (which == 0) {
                        co_await pg.reduce_scatter_into(out, in);
                    } else if (which == 1) {
                        fill_input(data, r);
                        co_await pg.all_reduce(data);
                    } else {
                        fill_input(reduced, r);
                        co_await pg.reduce(reduced, 0);
                    }
                }
                co_await pg.barrier();
                largest[static_cast<std::size_t>(r * 3 + which)] = largest_allocation;
            }
            for (std::size_t i = 0; i < block_count; ++i) {
                require(out[i] == sum_of(n, static_cast<std::size_t>(r) * block_count + i),
                        "reduce_scatter: wrong element " + std::to_string(i));
            }
            for (std::size_t i = 0; i < count; ++i) {
                require(data[i] == sum_of(n, i), "all_reduce: wrong element " + std::to_string(i));
                float want = r == 0 ? sum_of(n, i) : static_cast<float>(r + 1 + (i % 7));
                require(reduced[i] == want, "reduce: wrong element " + std::to_string(i));
            }
        });
        check_every_rank_ok(errors);
        for (std::size_t k = 0; k < largest.size(); ++k) {
            const char* const ops[] = {"reduce_scatter_into", "all_reduce", "reduce"};
            std::string op = ops[k % 3];
            CAPTURE(op);
            CAPTURE(largest[k]);
            CHECK(largest[k] <= block_count * sizeof(float));
        }
    }
}

TEST_CASE("reduce_scatter_into with its output inside its input (in place)") {
    for (int n : {2, 3}) {
        CAPTURE(n);
        for (std::size_t per : {std::size_t{1}, std::size_t{1000}, std::size_t{600000}}) {
            CAPTURE(per);
            auto errors = run_threads(n, [&](cc::process_group& pg) -> cc::task<> {
                int r = pg.rank();
                std::vector<float> in = input_of(r, per * static_cast<std::size_t>(n));
                std::span<float> own(in.data() + static_cast<std::size_t>(r) * per, per);
                co_await pg.reduce_scatter_into(own, in);
                for (std::size_t i = 0; i < per; ++i) {
                    require(own[i] == sum_of(n, static_cast<std::size_t>(r) * per + i),
                            "wrong element " + std::to_string(i));
                }
            });
            check_every_rank_ok(errors);
        }
    }
}

TEST_CASE(
    "a temporary above what the group keeps stays while calls use it, and goes after "
    "idle_calls that do not") {
    cc::collectives::scratch_buffers s;
    const std::size_t large = cc::collectives::scratch_buffers::kept_bytes * 2;
    std::byte* first = s.get(cc::collectives::context::algorithm_slot, large).data();
    s.get(cc::collectives::context::ring_slot, 4096);
    s.trim();  // after a call that used it
    CHECK(s.held_bytes() == large + 4096);
    CHECK(s.get(cc::collectives::context::algorithm_slot, large).data() == first);
    s.trim();
    CHECK(s.held_bytes() == large + 4096);
    // Calls that do not use it (a barrier, a small all_reduce): it stays for idle_calls of
    // them, then goes; the small one stays.
    for (unsigned i = 1; i < cc::collectives::scratch_buffers::idle_calls; ++i) {
        s.get(cc::collectives::context::ring_slot, 4096);
        s.trim();
    }
    CHECK(s.held_bytes() == large + 4096);
    s.trim();
    CHECK(s.held_bytes() == 4096);
}

TEST_CASE("reduce on 4 ranks in a loop allocates its large temporary once") {
    // Rank 2 of 4 has a child in the binomial tree and reduces into a temporary as large as
    // the buffer (10 MiB here, above what the group keeps between unrelated calls). Freed
    // after every call, it cost fresh pages at every call: 350-380 ms a call at 64 MiB over
    // TCP, 33 ms kept.
    // (No barrier between the calls: it is a call too, and one that uses no temporary gives
    // them back. The ranks are threads: they meet on latches instead.)
    const std::size_t count = (std::size_t{10} << 20) / sizeof(float);
    std::latch set_up(4), counting(1), done(4);
    auto errors = run_threads(4, [&](cc::process_group& pg) -> cc::task<> {
        int r = pg.rank();
        // The tree, which an arena would not choose at this size.
        pg.set_algorithm(cc::collectives::collective_kind::reduce,
                         cc::collectives::algorithm::binomial);
        std::vector<float> data = input_of(r, count);
        co_await pg.reduce(data, 0);  // sets up what later calls reuse
        set_up.arrive_and_wait();
        if (r == 0) {
            largest_allocation = 0;
            counting.count_down();
        }
        counting.wait();
        for (int i = 0; i < 3; ++i) {
            fill_input(data, r);
            co_await pg.reduce(data, 0);
        }
        done.arrive_and_wait();
        if (r == 0) {
            std::size_t seen = largest_allocation;
            require(seen < count * sizeof(float),
                    "the loop allocated " + std::to_string(seen) + " bytes at once");
            for (std::size_t i = 0; i < count; i += 4099) {
                require(data[i] == sum_of(4, i), "reduce: wrong element " + std::to_string(i));
            }
        }
    });
    check_every_rank_ok(errors);
}
