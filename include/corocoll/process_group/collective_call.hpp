#pragma once

// collective_call: what a collective returns, so that a forgotten co_await is caught.

#include <corocoll/core/task.hpp>
#include <corocoll/version.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

COROCOLL_BEGIN_NAMESPACE

/// A rooted call (broadcast, reduce, gather, scatter) described whole: what it is and on what.
/// Its group builds the call's task from it only when the task is needed (`make`), and may
/// run a small call at once when awaited, without any task, where nothing in it would wait
/// (process_group::run_at_once).
struct small_call {
    /// Runs the call now and returns true, or returns false having done nothing (its task
    /// runs it then). Null: the call always goes by its task.
    bool (*run)(const small_call&) = nullptr;
    /// Builds the call's task (not started). Null: the call came with its task.
    task<> (*make)(const small_call&) = nullptr;
    /// The group the call is on (what `run` runs it on).
    void* group = nullptr;
    /// What the call writes: a broadcast's or reduce's buffer, a gather's or scatter's output.
    std::span<std::byte> data;
    /// What the call only reads: a gather's or scatter's input.
    std::span<const std::byte> in;
    /// Elements, as the call's metadata counts them (collective_meta::count).
    std::uint64_t count = 0;
    /// The root rank.
    int root = 0;
    /// The collective (collectives::collective_kind).
    std::uint8_t kind = 0;
    /// The element type (dtype).
    std::uint8_t type = 0;
    /// The reduction (reduce_op; 0 where the call reduces nothing).
    std::uint8_t redop = 0;
    /// The algorithm chosen (collectives::algorithm).
    std::uint8_t algorithm = 0;
};

/// A collective called on a group and not yet run: what `pg.all_reduce(t)` and every other
/// collective return. `co_await` it (or pass it to `when_all`, `start`, `sync_wait`, or turn
/// it into a `task<T>`) to run it; it runs when awaited, as a `task` does.
///
/// One that is destroyed without ever being handed over, as in `pg.all_reduce(t);` with the
/// `co_await` forgotten, fails its group at once instead of silently skipping the collective
/// (which would leave the other ranks waiting in it): every pending and later operation of
/// this rank on the group throws "rank R: all_reduce on group 'G' was called but never awaited
/// (a forgotten co_await?)", and the other ranks' pending and later operations fail with the
/// same words, naming this rank. The group must then be closed, as after any failure. Costs a
/// pointer check in the destructor.
template <class T = void>
class [[nodiscard("a collective runs only when awaited: co_await it")]] collective_call {
public:
    /// Called with the owner and the collective's name when a call is dropped unawaited.
    using forgotten_fn = void (*)(void* owner, const char* what) noexcept;

    /// Takes `body`, not started; `forgotten(owner, what)` runs if the call is dropped unawaited.
    /// `small`: how it may run without `body` when awaited, and how `body` is built where it
    /// came empty (see `small_call`).
    collective_call(task<T> body, void* owner, forgotten_fn forgotten, const char* what,
                    small_call small = {}) noexcept
        : body_(std::move(body)),
          owner_(owner),
          forgotten_(forgotten),
          what_(what),
          small_(small) {}
    /// Takes over `o`'s call; `o` holds none.
    collective_call(collective_call && o) noexcept
        : body_(std::move(o.body_)),
          owner_(std::exchange(o.owner_, nullptr)),
          forgotten_(o.forgotten_),
          what_(o.what_),
          small_(o.small_) {}
    collective_call(const collective_call&) = delete;
    collective_call& operator=(const collective_call&) = delete;
    collective_call& operator=(collective_call&&) = delete;
    ~collective_call() {
        if (owner_ != nullptr) forgotten_(owner_, what_);
    }

    /// Runs the collective; yields its result or rethrows its error.
    auto operator co_await()&& noexcept {
        owner_ = nullptr;
        return awaiter{this};
    }

    /// The collective as a plain task (to keep in a `std::vector<task<T>>`); that task runs
    /// it when awaited, and is no longer watched for a forgotten co_await.
    operator task<T>()&& {  // NOLINT(google-explicit-constructor): a task stands in
        owner_ = nullptr;
        build();
        return std::move(body_);
    }

    /// The collective's name ("all_reduce").
    const char* name() const noexcept { return what_; }

private:
    using task_awaiter = decltype(std::declval<task<T>>().operator co_await());
    // The task, built from the small call where it came without one.
    void build() {
        if constexpr (std::is_void_v<T>) {
            if (!body_ && small_.make != nullptr) body_ = small_.make(small_);
        }
    }
    // The call is first offered to the small call: a call run at once is not suspended for,
    // and its task is never built (or, where it came with one, started: the call's end
    // destroys it). The call lives until the end of the co_await expression.
    struct awaiter {
        collective_call* call;
        task_awaiter inner{};
        bool ran = false;
        bool await_ready() {
            const small_call& small = call->small_;
            if (small.run != nullptr && small.run(small)) return ran = true;
            call->build();
            inner = std::move(call->body_).operator co_await();
            return inner.await_ready();
        }
        decltype(auto) await_suspend(std::coroutine_handle<> h) noexcept {
            return inner.await_suspend(h);
        }
        decltype(auto) await_resume() {
            if constexpr (std::is_void_v<T>) {
                if (ran) return;
            }
            return inner.await_resume();
        }
    };

    task<T> body_;
    void* owner_;
    forgotten_fn forgotten_;
    const char* what_;
    small_call small_;
};

COROCOLL_END_NAMESPACE
