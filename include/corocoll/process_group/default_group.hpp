#pragma once

// The default group, as torch's: init_process_group() from plain code sets it for this thread,
// and free functions (get_rank, all_reduce, ...) act on it, blocking.

#include <corocoll/core/sync_wait.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/process_group/process_group.hpp>
#include <corocoll/version.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

/// The default group of this thread, set by `init_process_group(options)` (ranks may run as
/// threads, so it is per thread), and the reactor it made if the thread had none.
struct default_group_state {
    std::unique_ptr<io::reactor> owned_reactor;
    std::shared_ptr<process_group> group;
};

COROCOLL_DECL default_group_state& default_group_ref();

COROCOLL_DECL process_group& require_default_group(const char* what);

}  // namespace detail

/// From plain code: sets up the default group of this thread (creating a reactor for the
/// thread if it has none) and returns it. The free functions below act on it.
COROCOLL_DECL process_group& init_process_group(init_options o = {});

/// True once this thread's default group is set up.
inline bool is_initialized() noexcept {
    return static_cast<bool>(detail::default_group_ref().group);
}

/// The default group's rank; 0 before init, as torch tutorials' helpers expect.
COROCOLL_DECL int get_rank() noexcept;

/// The default group's size; 1 before init.
COROCOLL_DECL int get_world_size() noexcept;

/// The default group (throws `std::logic_error` before init).
inline process_group& default_group() { return detail::require_default_group("default_group"); }

/// Closes and forgets the default group, and with it every group made from it (`new_group`,
/// `split`), as torch's does; then the reactor init made for it. A group kept past this
/// refuses every operation with an error that says it is closed, and may be dropped.
COROCOLL_DECL void destroy_process_group();

/// Blocking send on the default group.
template <buffer R>
void send(const R& buf, int dst, std::int64_t tag = 0) {
    sync_wait(detail::require_default_group("send").send(buf, dst, tag));
}

/// Blocking receive on the default group; returns the sender.
template <buffer R>
int recv(R& buf, int src = any_source, std::int64_t tag = 0) {
    return sync_wait(detail::require_default_group("recv").recv(buf, src, tag));
}

/// Non-blocking send on the default group: `.wait()` or `co_await` the result.
template <buffer R>
work<> isend(const R& buf, int dst, std::int64_t tag = 0) {
    return detail::require_default_group("isend").isend(buf, dst, tag);
}

/// Non-blocking receive on the default group.
template <buffer R>
work<int> irecv(R& buf, int src = any_source, std::int64_t tag = 0) {
    return detail::require_default_group("irecv").irecv(buf, src, tag);
}

// ---- collectives on the default group, blocking (the coroutine forms are the group's
// methods: `co_await cc::default_group().all_reduce(t)`) ----

/// Blocks until every rank of the default group arrives.
COROCOLL_DECL void barrier();

/// `monitored_barrier` on the default group.
COROCOLL_DECL void monitored_barrier(std::chrono::milliseconds timeout);

/// All-reduce in place on the default group.
template <buffer R>
void all_reduce(R& data, reduce_op op = reduce_op::sum) {
    sync_wait(detail::require_default_group("all_reduce").all_reduce(data, op));
}

/// Broadcast from `src` on the default group.
template <buffer R>
void broadcast(R& data, int src) {
    sync_wait(detail::require_default_group("broadcast").broadcast(data, src));
}

/// Reduce to `dst` on the default group.
template <buffer R>
void reduce(R& data, int dst, reduce_op op = reduce_op::sum) {
    sync_wait(detail::require_default_group("reduce").reduce(data, dst, op));
}

/// All-gather into a list on the default group.
template <buffer R>
void all_gather(std::vector<R>& outs, const R& in) {
    sync_wait(detail::require_default_group("all_gather").all_gather(outs, in));
}

/// All-gather into one buffer on the default group.
template <buffer O, buffer I>
void all_gather_into(O& out, const I& in) {
    sync_wait(detail::require_default_group("all_gather").all_gather_into(out, in));
}

/// Gather to `dst` on the default group.
template <buffer R>
void gather(const R& in, std::vector<R>& gather_list, int dst = 0) {
    sync_wait(detail::require_default_group("gather").gather(in, gather_list, dst));
}

/// Scatter from `src` on the default group.
template <buffer R>
void scatter(R& out, const std::vector<R>& scatter_list, int src = 0) {
    sync_wait(detail::require_default_group("scatter").scatter(out, scatter_list, src));
}

/// Reduce-scatter of a list on the default group.
template <buffer R>
void reduce_scatter(R& out, const std::vector<R>& in_list, reduce_op op = reduce_op::sum) {
    sync_wait(detail::require_default_group("reduce_scatter").reduce_scatter(out, in_list, op));
}

/// All-to-all of lists on the default group.
template <buffer R>
void all_to_all(std::vector<R>& outs, const std::vector<R>& ins) {
    sync_wait(detail::require_default_group("all_to_all").all_to_all(outs, ins));
}

/// All-to-all of one buffer (optionally with split sizes) on the default group.
template <buffer O, buffer I>
void all_to_all_single(O& out, const I& in, std::vector<std::size_t> out_splits = {},
                       std::vector<std::size_t> in_splits = {}) {
    sync_wait(detail::require_default_group("all_to_all")
                  .all_to_all_single(out, in, std::move(out_splits), std::move(in_splits)));
}

/// Object collectives on the default group.
template <class T>
void broadcast_object_list(std::vector<T>& objects, int src = 0) {
    sync_wait(
        detail::require_default_group("broadcast_object_list").broadcast_object_list(objects, src));
}
template <class T>
/// `gather_object` on the default group, blocking; see `process_group::gather_object`.
void gather_object(const T& object, std::vector<T>& out, int dst = 0) {
    sync_wait(detail::require_default_group("gather_object").gather_object(object, out, dst));
}
template <class T>
/// `all_gather_object` on the default group, blocking; see `process_group::all_gather_object`.
void all_gather_object(std::vector<T>& out, const T& object) {
    sync_wait(detail::require_default_group("all_gather_object").all_gather_object(out, object));
}
template <class T>
/// `scatter_object_list` on the default group, blocking; see `process_group::scatter_object_list`.
void scatter_object_list(T& out, const std::vector<T>& in, int src = 0) {
    sync_wait(
        detail::require_default_group("scatter_object_list").scatter_object_list(out, in, src));
}

/// A new group of the default group's `ranks` (every rank calls it); null for non-members.
COROCOLL_DECL std::shared_ptr<process_group> new_group(std::vector<int> ranks);

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/process_group/impl/default_group.ipp>
#endif
