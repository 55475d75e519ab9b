#pragma once

// The hook by which other threads hand work to a thread's event loop (its reactor): an
// intrusive work item and the loop's post.

#include <corocoll/version.hpp>

#include <atomic>
#include <chrono>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

/// A unit of work handed to an event loop from any thread. It is intrusive: the item lives in
/// the frame of the coroutine that posts it, so posting allocates nothing. `run_` is called
/// once, on the loop's thread.
struct work_item {
    work_item* next_ = nullptr;
    void (*run_)(work_item*) noexcept = nullptr;
};

/// What the core layer needs from an event loop, without knowing what the loop is: the io
/// layer's reactor implements it. Keeping it abstract lets `sync_wait` and `offload` live in
/// core while the reactor lives above (a lower layer never includes a higher one).
class event_loop {
public:
    /// Queues `item` to run on the loop's thread and wakes the loop. Thread-safe. The loop
    /// stays alive until every `post` that started before it ran the item has returned, so
    /// a thread may post the last piece of work a loop waits for and go on using nothing else.
    virtual void post(work_item& item) noexcept = 0;
    /// Runs the loop on the calling thread until `done` is true. The loop sleeps in the kernel
    /// while nothing is ready; another thread that wants `done` seen posts a work item that
    /// sets it.
    virtual void run_until(const std::atomic<bool>& done) = 0;
    /// Runs the loop on the calling thread until `ready(arg)` is true or the steady clock
    /// reaches `deadline`, whichever is first; returns `ready(arg)`. `ready` is asked after
    /// every turn of the loop, so what makes it true must happen on this loop (a coroutine it
    /// resumes) or post to it.
    virtual bool run_until(bool (*ready)(const void* arg) noexcept, const void* arg,
                           std::chrono::steady_clock::time_point deadline) = 0;

    /// The loop bound to the calling thread, or null when it has none.
    static event_loop* current() noexcept { return current_ref(); }

    event_loop(const event_loop&) = delete;
    event_loop& operator=(const event_loop&) = delete;

protected:
    event_loop() = default;
    ~event_loop() = default;

    static event_loop*& current_ref() noexcept;
};

}  // namespace detail

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/core/impl/event_loop.ipp>
#endif
