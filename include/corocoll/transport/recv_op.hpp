#pragma once

// The receive operation that the engine's recv and recv_coll return. Its member functions
// that reach into the engine are defined in engine.hpp, after the engine class.

#include <corocoll/transport/frame.hpp>
#include <corocoll/transport/posted_recv.hpp>
#include <corocoll/version.hpp>

#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <utility>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

class engine;

/// What a receive operation yields when awaited.
enum class recv_yields {
    result,  ///< `recv_result`: sender and length
    source,  ///< the sender's rank (`int`), as torch's recv returns it
    length,  ///< the length (`std::size_t`)
};

/// A receive, as the operation that `co_await` runs: the posted receive lives in this object
/// (so in the awaiting coroutine's frame), and a receive costs no coroutine frame of its own.
/// `co_await` posts it (it is ready at once when a buffered message matches), waits for the reader
/// to fill the buffer, and yields the result or throws an error naming the operation. `start()`
/// posts it now, to be awaited later: that is how an algorithm keeps the next receive posted while
/// it works on the last one, without a coroutine or an allocation. Movable until started (moving a
/// started one terminates); once started it must stay where it is until it completes or is
/// destroyed. Destroying a started receive withdraws it if no message has matched it yet; if one
/// has, its payload may still be arriving, straight into the buffer, so the buffer must outlive the
/// message in flight, as an `irecv`'s must outlive its `work`. The deadline is the one given when
/// the operation was made. Await it once.
template <recv_yields Y>
class recv_op {
public:
    /// Takes over `o`'s receive, which must not have started.
    recv_op(recv_op&& o) noexcept : engine_(o.engine_), pr_(not_started(o.pr_)), what_(o.what_) {}
    recv_op& operator=(recv_op&&) = delete;
    recv_op(const recv_op&) = delete;
    recv_op& operator=(const recv_op&) = delete;
    ~recv_op();

    /// Posts the receive now (once; later calls do nothing). Throws, before anything is
    /// posted, if the peer is not a rank of the group or the group has failed.
    void start();

    // The awaiter is a pointer to the operation: g++ 12 copies an lvalue awaiter into the
    // frame (`co_await op` with `op` named), and the posted receive must not move.
    /// What `co_await` on a `recv_op` uses: posts the receive at suspension.
    struct awaiter {
        /// The receive awaited.
        recv_op* op;
        // A receive that cannot be posted (bad peer, failed group) is ready at once and
        // throws from await_resume, as every operation does.
        bool await_ready() noexcept {
            try {
                op->start();
            } catch (...) {
                op->early_ = std::current_exception();
                return true;
            }
            return op->pr_.state == detail::posted_recv::done;
        }
        void await_suspend(std::coroutine_handle<> h) noexcept { op->pr_.waiter = h; }
        auto await_resume() { return op->result(); }
    };
    /// Awaitable: posts the receive and yields its result.
    awaiter operator co_await() & noexcept { return {this}; }
    /// Awaitable: posts the receive and yields its result.
    awaiter operator co_await() && noexcept { return {this}; }

    /// True once the message is in the buffer (or the receive failed).
    bool is_completed() const noexcept { return pr_.state == detail::posted_recv::done; }

private:
    friend class engine;
    auto result();
    recv_op(engine& e, std::span<std::byte> buf, int src, frame_kind kind, std::uint64_t seq,
            std::int64_t tag, detail::op_label what, std::chrono::steady_clock::time_point deadline,
            bool soft_deadline = false)
        : engine_(&e), what_(what) {
        pr_.soft_deadline = soft_deadline;
        pr_.buf = buf;
        pr_.src = src;
        pr_.kind = kind;
        pr_.seq = seq;
        pr_.tag = tag;
        pr_.deadline = deadline;
    }
    // An idle request is plain data (nothing links to it yet); a started one must not move.
    static const detail::posted_recv& not_started(const detail::posted_recv& pr) noexcept {
        if (pr.state != detail::posted_recv::idle) std::terminate();
        return pr;
    }

    engine* engine_;
    detail::posted_recv pr_;
    detail::op_label what_;
    std::exception_ptr early_;
};

}  // namespace transport

COROCOLL_END_NAMESPACE
