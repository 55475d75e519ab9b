#pragma once

// What a call costs on this machine: the cheapest of a few timed runs is one that nothing
// interrupted (no preemption, no interrupt), so it is the call's own cost. Read once by what
// derives a threshold from the machine (io/reactor.hpp: a hand-over; transport/shm/
// arena_setup.hpp: a single copy).

#include <corocoll/version.hpp>

#include <algorithm>
#include <chrono>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

/// The cheapest of `runs` timed calls of `call` (a callable returning whether it worked); 0
/// where one did not work.
template <class Call>
std::chrono::nanoseconds cheapest_of(int runs, Call&& call) noexcept {
    auto cheapest = std::chrono::nanoseconds::max();
    for (int i = 0; i < runs; ++i) {
        const auto before = std::chrono::steady_clock::now();
        if (!call()) return std::chrono::nanoseconds{0};
        cheapest =
            std::min<std::chrono::nanoseconds>(cheapest, std::chrono::steady_clock::now() - before);
    }
    return cheapest;
}

}  // namespace detail

COROCOLL_END_NAMESPACE
