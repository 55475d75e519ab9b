#pragma once

// What the process group sends and receives: the `buffer` concept, the byte views of a
// buffer, and `p2p_op`, one entry of batch_isend_irecv.

#include <corocoll/collectives/checks.hpp>
#include <corocoll/version.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

/// A contiguous range: what corocoll sends and receives (`std::vector<T>`, `std::array<T,
/// N>`, `std::span<T>`, C arrays; not `std::vector<bool>`, which packs bits). Its elements
/// must be trivially copyable, which each operation checks with one static_assert that
/// points to the object collectives (strings, containers, your own types) otherwise.
template <class R>
concept buffer = std::ranges::contiguous_range<R> && std::ranges::sized_range<R>;

namespace detail {

/// Why a buffer of non-trivially-copyable elements is refused: the one line a compiler
/// prints for it.
template <class R>
constexpr bool trivially_copyable_elements =
    std::is_trivially_copyable_v<std::ranges::range_value_t<R>>;
#define COROCOLL_CHECK_BUFFER(R)                                                \
    static_assert(                                                              \
        ::corocoll::detail::trivially_copyable_elements<R>,                     \
        "corocoll: buffers hold trivially copyable elements; for std::string, " \
        "containers and your own types use the object collectives "             \
        "(broadcast_object_list, all_gather_object, gather_object, scatter_object_list)")

// No check here (the public operation made it, once): a refused type gets one error.
template <buffer R>
std::span<const std::byte> bytes_of(const R& r) {
    if constexpr (trivially_copyable_elements<R>) {
        return std::as_bytes(std::span(std::ranges::data(r), std::ranges::size(r)));
    } else {
        return {};
    }
}

template <buffer R>
std::span<std::byte> writable_bytes_of(R& r) {
    static_assert(!std::is_const_v<std::remove_reference_t<decltype(*std::ranges::data(r))>>,
                  "corocoll: a receive buffer must be writable");
    if constexpr (trivially_copyable_elements<R>) {
        return std::as_writable_bytes(std::span(std::ranges::data(r), std::ranges::size(r)));
    } else {
        return {};
    }
}

// The list forms of the collectives (torch's lists of tensors) run the flat forms: these
// build the flat buffer and take it apart again.

template <buffer R>
std::vector<std::size_t> sizes_of(const std::vector<R>& list) {
    std::vector<std::size_t> out;
    out.reserve(list.size());
    for (const auto& b : list) out.push_back(std::ranges::size(b));
    return out;
}

// The entries of `list` one after another; with `each` != npos, every entry must have that
// many elements (errors say "`what`: `name` entry has ...", as the checks do).
template <buffer R>
std::vector<std::ranges::range_value_t<R>> concat(int rank, const char* what, const char* name,
                                                  const std::vector<R>& list,
                                                  std::size_t each = std::size_t(-1)) {
    if (each != std::size_t(-1)) {
        std::string entry = std::string(name) + " entry";
        for (const auto& b : list) {
            collectives::check_size(rank, what, entry.c_str(), std::ranges::size(b), each);
        }
    }
    std::vector<std::ranges::range_value_t<R>> flat;
    for (const auto& b : list) flat.insert(flat.end(), std::ranges::begin(b), std::ranges::end(b));
    return flat;
}

// Copies consecutive pieces of `flat` into the entries of `list`, each as long as it is.
template <class T, buffer R>
void split_into(const std::vector<T>& flat, std::vector<R>& list) {
    std::size_t at = 0;
    for (auto& b : list) {
        std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(at), std::ranges::size(b),
                    std::ranges::begin(b));
        at += std::ranges::size(b);
    }
}

// Refuses a list with an entry that does not hold `count` elements (the output lists of the
// gathering collectives; checked before anything is sent).
template <buffer R>
void check_entries(int rank, const char* what, const std::vector<R>& list, std::size_t count) {
    for (const auto& b : list) {
        collectives::check_size(rank, what, "output list entry", std::ranges::size(b), count);
    }
}

}  // namespace detail

/// One operation of `batch_isend_irecv`, like torch's `P2POp`.
struct p2p_op {
    /// Whether the operation sends or receives.
    enum class kind { isend, irecv };
    /// Send or receive.
    kind action;
    /// The bytes to send, or where the received ones go.
    std::span<std::byte> data;  // only read for isend
    /// The other rank.
    int peer;
    /// Matches a send with a receive, as in `isend`/`irecv`.
    std::int64_t tag = 0;

    template <buffer R>
    /// torch's `P2POp(dist.isend, buf, peer, tag=tag)`: `buf` must outlive the batch.
    static p2p_op isend(const R& buf, int peer, std::int64_t tag = 0) {
        COROCOLL_CHECK_BUFFER(R);
        auto b = detail::bytes_of(buf);
        return {kind::isend, {const_cast<std::byte*>(b.data()), b.size()}, peer, tag};
    }
    template <buffer R>
    /// torch's `P2POp(dist.irecv, buf, peer, tag=tag)`: `buf` must outlive the batch.
    static p2p_op irecv(R& buf, int peer, std::int64_t tag = 0) {
        COROCOLL_CHECK_BUFFER(R);
        return {kind::irecv, detail::writable_bytes_of(buf), peer, tag};
    }
};

COROCOLL_END_NAMESPACE
