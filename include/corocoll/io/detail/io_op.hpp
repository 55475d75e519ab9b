#pragma once

// The base of every operation the reactor submits: where a completion is delivered.

#include <corocoll/version.hpp>

#include <liburing.h>

COROCOLL_BEGIN_NAMESPACE

namespace io::detail {

/// The base of every operation the reactor submits. An operation lives in the frame of the
/// coroutine that awaits it (no allocation); the SQE's `user_data` points at it, and the
/// reactor calls `complete_` with the CQE's result. The SQEs are taken only when the reactor
/// submits the operation (`prepare_` fills them), so an operation that finds the submission
/// queue full waits in the reactor's backlog, linked through `prev_`/`next_`, and loses nothing.
struct io_op {
    /// Fills `sqes_` consecutive SQEs taken from `ring`; the reactor has checked they are free.
    void (*prepare_)(io_op* self, io_uring* ring) noexcept = nullptr;
    /// Called on the reactor's thread with the CQE's `res`.
    void (*complete_)(io_op* self, int res) noexcept = nullptr;
    io_op* prev_ = nullptr;
    io_op* next_ = nullptr;
    unsigned sqes_ = 1;
    bool queued_ = false;  // in the reactor's backlog
    bool tracked_ = true;  // its CQE carries user_data = this (counted as in flight)
};

/// `user_data` of SQEs whose completions nobody waits for (linked timeouts, cancel requests).
inline constexpr __u64 ignored_user_data = 0;

}  // namespace io::detail

COROCOLL_END_NAMESPACE
