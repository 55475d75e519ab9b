// The bodies of the non-template functions declared in <corocoll/core/sync_wait.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/sync_wait.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL sync_wait_state::sync_wait_state(event_loop* loop) noexcept : loop_(loop) {
    run_ = [](work_item* self) noexcept {
        static_cast<sync_wait_state*>(self)->done_.store(true, std::memory_order_release);
    };
}

COROCOLL_DECL void sync_wait_state::wait() {
    if (loop_ != nullptr) {
        loop_->run_until(done_);
        return;
    }
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_.load(std::memory_order_acquire); });
}

COROCOLL_DECL void sync_wait_state::signal() noexcept {
    if (loop_ != nullptr) {
        if (event_loop::current() == loop_) {
            done_.store(true, std::memory_order_release);
        } else {
            loop_->post(*this);
        }
        return;
    }
    std::lock_guard lock(mutex_);
    done_.store(true, std::memory_order_release);
    cv_.notify_one();
}

}  // namespace detail

COROCOLL_END_NAMESPACE
