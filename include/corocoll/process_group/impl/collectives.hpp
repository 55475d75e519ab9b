#pragma once

// The templates of `process_group` defined outside the class: `collective`, which runs every
// collective (in issue order, numbered, with the metadata every rank must agree on), and the
// collectives that are coroutines of their own: the list forms (torch's all_gather, gather,
// scatter, reduce_scatter and all_to_all with lists of tensors, over the flat forms) and the
// object collectives (serialized through collectives/object.hpp). process_group.hpp includes
// this at its end.

#include <corocoll/process_group/process_group.hpp>

COROCOLL_BEGIN_NAMESPACE

template <class Body>
task<> process_group::collective(collectives::collective_kind kind, dtype type, std::size_t count,
                                 std::uint8_t redop, int root, Body body,
                                 collectives::algorithm algo) {
    check_open(collectives::kind_name(kind));
    co_await collective_lock_.lock();
    // The next collective gets the lock through the reactor's queue, after our caller
    // has resumed: so collectives complete in issue order even when the next one could
    // finish at once from buffered data.
    struct release {
        process_group& g;
        ~release() {
            g.engine_.end_collective();
            // Nobody to overtake when nobody waits: the lock comes free at once, without
            // a trip through the queue.
            if (g.collective_lock_.has_waiters()) {
                g.reactor_.post(g.unlock_item_);
            } else {
                g.collective_lock_.unlock();
            }
        }
    } release_at_end{*this};
    transport::collective_meta meta = begin_call(static_cast<std::uint8_t>(kind), type, count,
                                                 redop, root, static_cast<std::uint8_t>(algo));
    collectives::context c{engine_, meta, deadline(), chunk_bytes_, &scratch_};
    c.arena = arena_.get();
    co_await body(c);
    scratch_.trim();
    // A call whose last message arrived after the group failed (a rank that was stopped
    // and woke up) is not done: the other ranks reported it failed.
    if (engine_.must_catch_up()) co_await engine_.catch_up();
    engine_.raise_if_failed(meta);
}

template <buffer R>
task<> process_group::all_gather_run(std::vector<R>& outs, const R& in) {
    check_size("all_gather", "output list", outs.size(), static_cast<std::size_t>(size()));
    detail::check_entries(rank(), "all_gather", outs, std::ranges::size(in));
    std::vector<std::ranges::range_value_t<R>> flat(std::ranges::size(in) * size());
    co_await all_gather_into(flat, in);
    detail::split_into(flat, outs);
}

template <buffer R>
task<> process_group::gather_run(const R& in, std::vector<R>& gather_list, int dst) {
    std::vector<std::ranges::range_value_t<R>> flat(rank() == dst ? std::ranges::size(in) * size()
                                                                  : 0);
    if (rank() == dst) {
        check_size("gather", "gather_list", gather_list.size(), static_cast<std::size_t>(size()));
        detail::check_entries(rank(), "gather", gather_list, std::ranges::size(in));
    }
    co_await gather_into(in, flat, dst);
    if (rank() == dst) detail::split_into(flat, gather_list);
}

template <buffer R>
task<> process_group::scatter_run(R& out, const std::vector<R>& scatter_list, int src) {
    std::vector<std::ranges::range_value_t<R>> flat;
    if (rank() == src) {
        check_size("scatter", "scatter_list", scatter_list.size(),
                   static_cast<std::size_t>(size()));
        flat =
            detail::concat(rank(), "scatter", "scatter_list", scatter_list, std::ranges::size(out));
    }
    co_await scatter_from(out, flat, src);
}

template <buffer R>
task<> process_group::reduce_scatter_run(R& out, const std::vector<R>& in_list, reduce_op op) {
    check_size("reduce_scatter", "input list", in_list.size(), static_cast<std::size_t>(size()));
    auto flat =
        detail::concat(rank(), "reduce_scatter", "input list", in_list, std::ranges::size(out));
    co_await reduce_scatter_into(out, flat, op);
}

template <buffer R>
task<> process_group::all_to_all_run(std::vector<R>& outs, const std::vector<R>& ins) {
    check_size("all_to_all", "input list", ins.size(), static_cast<std::size_t>(size()));
    check_size("all_to_all", "output list", outs.size(), static_cast<std::size_t>(size()));
    std::vector<std::size_t> in_splits = detail::sizes_of(ins);
    std::vector<std::size_t> out_splits = detail::sizes_of(outs);
    auto in_flat = detail::concat(rank(), "all_to_all", "input list", ins);
    std::vector<std::ranges::range_value_t<R>> out_flat(
        std::accumulate(out_splits.begin(), out_splits.end(), std::size_t{0}));
    co_await all_to_all_single(out_flat, in_flat, out_splits, in_splits);
    detail::split_into(out_flat, outs);
}

template <class T>
task<> process_group::broadcast_object_list_run(std::vector<T>& objects, int src) {
    check_root("broadcast_object_list", src);
    std::string bytes = rank() == src ? to_bytes(objects) : std::string{};
    co_await object_collective(
        collectives::collective_kind::broadcast_object, objects.size(), src,
        [&](collectives::context& c) { return collectives::broadcast_object(c, bytes, src); });
    if (rank() != src) {
        auto got = from_bytes<std::vector<T>>(bytes);
        check_size("broadcast_object_list", "object list", objects.size(), got.size());
        objects = std::move(got);
    }
}

template <class T>
task<> process_group::gather_object_run(const T& object, std::vector<T>& out, int dst) {
    check_root("gather_object", dst);
    std::vector<std::string> all;
    co_await object_collective(
        collectives::collective_kind::gather_object, 1, dst, [&](collectives::context& c) {
            return collectives::gather_object(c, to_bytes(object), dst, false, all);
        });
    if (rank() == dst) out = detail::decode_all<T>(all);
}

template <class T>
task<> process_group::all_gather_object_run(std::vector<T>& out, const T& object) {
    std::vector<std::string> all;
    co_await object_collective(
        collectives::collective_kind::all_gather_object, 1, 0, [&](collectives::context& c) {
            return collectives::gather_object(c, to_bytes(object), 0, true, all);
        });
    out = detail::decode_all<T>(all);
}

template <class T>
task<> process_group::scatter_object_list_run(T& out, const std::vector<T>& in, int src) {
    check_root("scatter_object_list", src);
    if (rank() == src)
        check_size("scatter_object_list", "input list", in.size(),
                   static_cast<std::size_t>(size()));
    std::vector<std::string> parts;
    if (rank() == src) {
        for (const auto& object : in) parts.push_back(to_bytes(object));
    }
    std::string mine;
    co_await object_collective(
        collectives::collective_kind::scatter_object, 1, src,
        [&](collectives::context& c) { return collectives::scatter_object(c, parts, mine, src); });
    out = from_bytes<T>(mine);
}

COROCOLL_END_NAMESPACE
