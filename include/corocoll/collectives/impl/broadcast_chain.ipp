// The bodies of the non-template functions declared in <corocoll/collectives/broadcast_chain.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/broadcast_chain.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> broadcast_chain(context& c, std::span<std::byte> data, int root,
                                     std::uint32_t round) {
    int n = c.size();
    int v = (c.rank() - root + n) % n;
    int prev = (c.rank() - 1 + n) % n, next = (c.rank() + 1) % n;
    std::size_t chunks =
        std::max<std::size_t>(1, (data.size() + c.chunk_bytes - 1) / c.chunk_bytes);
    auto piece = [&](std::size_t k) {
        auto [first, last] = block_range(data.size(), chunks, k);
        return data.subspan(first, last - first);
    };
    auto receive_all = [&]() -> task<> {
        if (v == 0) co_return;
        for (std::size_t k = 0; k < chunks; ++k)
            co_await c.recv(piece(k), prev, round, static_cast<std::uint32_t>(k));
    };
    if (v == n - 1) {
        co_await receive_all();
        co_return;
    }
    // Forward each chunk as soon as it is in: the receiving coroutine runs ahead of the
    // sending one by at most the chunks already here. A receive that fails (a deadline, a
    // group that failed, a rank that chose another algorithm) ends the sender too: it waits
    // for chunks with no deadline of its own, so it must not wait for ones that never come.
    std::size_t received = v == 0 ? chunks : 0;
    bool receive_failed = false;
    std::coroutine_handle<> sender_waiting;
    auto wake_sender = [&] {
        if (sender_waiting) std::exchange(sender_waiting, {}).resume();
    };
    auto receiver = [&]() -> task<> {
        if (v == 0) co_return;
        std::exception_ptr failure;
        try {
            for (std::size_t k = 0; k < chunks; ++k) {
                co_await c.recv(piece(k), prev, round, static_cast<std::uint32_t>(k));
                ++received;
                wake_sender();
            }
        } catch (...) {
            failure = std::current_exception();
        }
        if (failure) {
            receive_failed = true;
            wake_sender();
            std::rethrow_exception(failure);
        }
    };
    struct chunk_ready {
        const std::size_t& received;
        const bool& failed;
        std::size_t k;
        std::coroutine_handle<>& waiting;
        bool await_ready() const noexcept { return received > k || failed; }
        void await_suspend(std::coroutine_handle<> h) noexcept { waiting = h; }
        void await_resume() const noexcept {}
    };
    auto sender = [&]() -> task<> {
        for (std::size_t k = 0; k < chunks; ++k) {
            co_await chunk_ready{received, receive_failed, k, sender_waiting};
            if (received <= k) co_return;  // the receiver failed: its error is the call's
            co_await c.send(piece(k), next, round, static_cast<std::uint32_t>(k));
        }
    };
    co_await when_all(receiver(), sender());
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
