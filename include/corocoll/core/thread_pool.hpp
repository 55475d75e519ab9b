#pragma once

// A fixed set of worker threads, what `offload` runs CPU work on.

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

#if COROCOLL_DEFINE_BODIES
#include <corocoll/core/impl/thread_pool.ipp>
#endif
