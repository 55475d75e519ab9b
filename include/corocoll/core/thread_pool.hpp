#pragma once

#include <corocoll/core/event_loop.hpp>
#include <corocoll/version.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

/// A fixed set of worker threads that run `detail::work_item`s in FIFO order; what `offload`
/// runs CPU work on. Destruction finishes the queued items, then joins the threads.
/// Cost: one mutex lock and, when a worker sleeps, one condition-variable wake per item.
class thread_pool {
public:
    /// Starts `threads` workers (at least one).
    explicit thread_pool(std::size_t threads);
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;
    ~thread_pool();

    /// Number of worker threads.
    std::size_t size() const noexcept { return workers_.size(); }

    /// Queues `item`; a worker calls `item.run_(&item)` soon. Thread-safe.
    void submit(detail::work_item& item);

    /// The pool that `offload` uses when given none: as many threads as the machine has cores,
    /// created on first use and joined at program exit.
    static thread_pool& default_pool();

private:
    void work();

    std::mutex mutex_;
    std::condition_variable cv_;
    detail::work_item* head_ = nullptr;
    detail::work_item* tail_ = nullptr;
    bool stopping_ = false;
    std::vector<std::thread> workers_;
};

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

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

#endif  // COROCOLL_DEFINE_BODIES
