// The bodies of the non-template functions declared in <corocoll/transport/posted_recv.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/posted_recv.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {
namespace detail {

COROCOLL_DECL std::string describe_raw(const collective_meta& m) {
    return "collective " + std::to_string(m.collective) + "(op " + std::to_string(m.redop) +
           ", dtype " + std::to_string(m.dtype) + ", root " + std::to_string(m.root) + ", count " +
           std::to_string(m.count) + ")";
}

COROCOLL_DECL std::string op_label::spell(describer describe) const {
    std::string who = peer == any_source ? std::string("any rank") : "rank " + std::to_string(peer);
    if (collective && place != nullptr) return describe(meta) + ": " + place;
    if (collective) return describe(meta) + (sending ? ": send to " : ": recv from ") + who;
    if (sending) {
        return "send to " + who + " (tag " + std::to_string(tag) + ", " + std::to_string(bytes) +
               " bytes)";
    }
    return "recv from " + who + " (tag " + std::to_string(tag) + ")";
}

COROCOLL_DECL bool posted_recv::matches(int p, const frame_header& h) const noexcept {
    return (src == p || src == any_source) && kind == h.kind && tag == h.tag &&
           (h.kind != frame_kind::collective || seq == h.seq);
}

COROCOLL_DECL void recv_queue::push_back(posted_recv& pr) noexcept {
    pr.prev = tail_;
    pr.next = nullptr;
    (tail_ != nullptr ? tail_->next : head_) = &pr;
    tail_ = &pr;
    pr.linked = true;
}

COROCOLL_DECL void recv_queue::remove(posted_recv& pr) noexcept {
    if (!pr.linked) return;
    (pr.prev != nullptr ? pr.prev->next : head_) = pr.next;
    (pr.next != nullptr ? pr.next->prev : tail_) = pr.prev;
    pr.prev = pr.next = nullptr;
    pr.linked = false;
}

COROCOLL_DECL posted_recv* recv_queue::first_match(int p, const frame_header& h) const noexcept {
    for (posted_recv* pr = head_; pr != nullptr; pr = pr->next) {
        if (pr->matches(p, h)) return pr;
    }
    return nullptr;
}

}  // namespace detail
}  // namespace transport

COROCOLL_END_NAMESPACE
