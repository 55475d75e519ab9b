// The bodies of the non-template functions declared in <corocoll/core/frame_pool.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/frame_pool.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL std::uint64_t& frame_pool::made() noexcept {
    thread_local std::uint64_t n = 0;
    return n;
}

COROCOLL_DECL frame_pool::lists::~lists() {
    closed = true;
    for (auto*& h : head) {
        while (h != nullptr) {
            block* next = h->next;
            ::operator delete(h);
            h = next;
        }
    }
}

COROCOLL_DECL auto frame_pool::mine() noexcept -> lists& {
    thread_local lists l;
    return l;
}

}  // namespace detail

COROCOLL_END_NAMESPACE
