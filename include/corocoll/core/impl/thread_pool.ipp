// The bodies of the non-template functions declared in <corocoll/core/thread_pool.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/thread_pool.hpp>

COROCOLL_BEGIN_NAMESPACE

COROCOLL_DECL thread_pool::thread_pool(std::size_t threads) {
    threads = std::max<std::size_t>(threads, 1);
    workers_.reserve(threads);
    for (std::size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

COROCOLL_DECL thread_pool::~thread_pool() {
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
}

COROCOLL_DECL void thread_pool::submit(detail::work_item& item) {
    item.next_ = nullptr;
    {
        std::lock_guard lock(mutex_);
        if (tail_ != nullptr) {
            tail_->next_ = &item;
        } else {
            head_ = &item;
        }
        tail_ = &item;
    }
    cv_.notify_one();
}

COROCOLL_DECL thread_pool& thread_pool::default_pool() {
    static thread_pool pool(std::max(2u, std::thread::hardware_concurrency()));
    return pool;
}

COROCOLL_DECL void thread_pool::work() {
    for (;;) {
        detail::work_item* item = nullptr;
        {
            std::unique_lock lock(mutex_);
            cv_.wait(lock, [&] { return head_ != nullptr || stopping_; });
            if (head_ == nullptr) return;
            item = head_;
            head_ = item->next_;
            if (head_ == nullptr) tail_ = nullptr;
        }
        item->run_(item);
    }
}

COROCOLL_END_NAMESPACE
