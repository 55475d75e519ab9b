// The bodies of the non-template functions declared in <corocoll/transport/peer.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/copy.hpp>
#include <corocoll/transport/peer.hpp>

#include <algorithm>
#include <bit>
#include <cstring>

COROCOLL_BEGIN_NAMESPACE

namespace transport {
namespace detail {

COROCOLL_DECL bool peer::has_unexpected(frame_kind kind, std::uint64_t seq,
                                        std::int64_t tag) const noexcept {
    for (const auto& m : unexpected) {
        if (m.header.kind == kind && m.header.tag == tag &&
            (kind != frame_kind::collective || m.header.seq == seq)) {
            return true;
        }
    }
    return false;
}

COROCOLL_DECL std::span<std::byte> peer::staging_room() {
    if (!staged) staged = std::make_unique_for_overwrite<std::byte[]>(staging_size);
    std::byte* base = staged.get();
    if (staged_begin > 0) {
        std::memmove(base, base + staged_begin, staged_end - staged_begin);
        staged_end -= staged_begin;
        staged_begin = 0;
    }
    return {base + staged_end, staging_size - staged_end};
}

COROCOLL_DECL void peer::fit_staging(std::uint64_t frame_bytes) {
    if (frame_bytes <= staging_size || frame_bytes > staging_most) return;
    const std::size_t size =
        static_cast<std::size_t>(std::min<std::uint64_t>(std::bit_ceil(frame_bytes), staging_most));
    auto bigger = std::make_unique_for_overwrite<std::byte[]>(size);
    const std::size_t held = staged_end - staged_begin;
    if (held > 0) copy_bytes(bigger.get(), staged.get() + staged_begin, held);
    staged = std::move(bigger);
    staged_begin = 0;
    staged_end = held;
    staging_size = size;
}

COROCOLL_DECL void peer::take_header(frame_header& h) noexcept {
    std::memcpy(&h, staged.get() + staged_begin, sizeof(h));
    staged_begin += sizeof(h);
}

COROCOLL_DECL std::span<std::byte> peer::take_staged(std::span<std::byte> out) noexcept {
    std::size_t n = std::min(staged_end - staged_begin, out.size());
    if (n > 0) copy_bytes(out.data(), staged.get() + staged_begin, n);
    staged_begin += n;
    if (staged_begin == staged_end) staged_begin = staged_end = 0;
    return out.subspan(n);
}

COROCOLL_DECL task<std::string> peer::read_text(std::uint64_t length) {
    std::string text(std::min<std::uint64_t>(length, abort_notice::max_text), '\0');
    if (text.empty()) co_return text;
    try {
        co_await read_payload(std::as_writable_bytes(std::span(text.data(), text.size())),
                              io::deadline_after(std::chrono::seconds(5)));
    } catch (const std::system_error&) {
        text.clear();
    }
    co_return text;
}

COROCOLL_DECL bool peer::send_now(const frame_header& h, const std::string& text) noexcept {
    if (!send_lock.try_lock()) return false;
    iovec iov[2] = {{const_cast<frame_header*>(&h), sizeof(h)},
                    {const_cast<char*>(text.data()), text.size()}};
    link->send_now(iov);
    send_lock.unlock();
    return true;
}

COROCOLL_DECL task<> peer::reader_exit(io::reactor& reactor,
                                       std::chrono::steady_clock::time_point deadline) {
    if (reader_exited) co_return;
    struct exit_awaiter {
        peer& ps;
        bool await_ready() const noexcept { return ps.reader_exited; }
        void await_suspend(std::coroutine_handle<> h) noexcept { ps.exit_waiter = h; }
        void await_resume() const noexcept {}
    };
    std::stop_source timer_stop;
    auto timer = [&]() -> task<> {
        try {
            co_await reactor.sleep_until(deadline, timer_stop.get_token());
        } catch (const std::system_error&) {
            co_return;
        }
        if (exit_waiter) std::exchange(exit_waiter, {}).resume();
    };
    auto waiter = [&]() -> task<> {
        co_await exit_awaiter{*this};
        timer_stop.request_stop();
    };
    co_await when_all(waiter(), timer());
}

COROCOLL_DECL task<> peer::read_payload(std::span<std::byte> out, io::op_options o) {
    std::span<std::byte> rest = take_staged(out);
    // Usually the rest of a large payload already waits in the channel.
    if (!rest.empty()) rest = rest.subspan(link->try_recv(rest, true));
    if (!rest.empty()) co_await link->recv(rest, std::move(o));
}

COROCOLL_DECL std::span<std::byte> peer::grow_early(message_bytes& data, std::uint64_t length) {
    constexpr std::uint64_t first = std::uint64_t{1} << 20;
    const std::size_t have = data.size();
    data.resize(
        static_cast<std::size_t>(std::min(length, std::max<std::uint64_t>(first, 2 * have))));
    return std::span(data).subspan(have);
}

}  // namespace detail
}  // namespace transport

COROCOLL_END_NAMESPACE
