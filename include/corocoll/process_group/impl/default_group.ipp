// The bodies of the non-template functions declared in <corocoll/process_group/default_group.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/process_group/default_group.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL default_group_state& default_group_ref() {
    thread_local default_group_state state;
    return state;
}

COROCOLL_DECL process_group& require_default_group(const char* what) {
    auto& g = default_group_ref().group;
    if (!g) {
        throw std::logic_error(std::string("corocoll: ") + what +
                               ": the default process group is not initialized "
                               "(call init_process_group first)");
    }
    return *g;
}

}  // namespace detail

COROCOLL_DECL process_group& init_process_group(init_options o) {
    auto& state = detail::default_group_ref();
    if (state.group) throw std::logic_error("corocoll: init_process_group: already initialized");
    io::reactor* r = io::reactor::current();
    if (r == nullptr) {
        state.owned_reactor = std::make_unique<io::reactor>();
        r = state.owned_reactor.get();
    }
    state.group = sync_wait(init_process_group(*r, std::move(o)));
    return *state.group;
}

COROCOLL_DECL int get_rank() noexcept {
    auto& g = detail::default_group_ref().group;
    return g ? g->rank() : 0;
}

COROCOLL_DECL int get_world_size() noexcept {
    auto& g = detail::default_group_ref().group;
    return g ? g->size() : 1;
}

COROCOLL_DECL void destroy_process_group() {
    auto& state = detail::default_group_ref();
    if (state.group) {
        sync_wait(state.group->close());
        state.group.reset();
    }
    state.owned_reactor.reset();
}

COROCOLL_DECL void barrier() { sync_wait(detail::require_default_group("barrier").barrier()); }

COROCOLL_DECL void monitored_barrier(std::chrono::milliseconds timeout) {
    sync_wait(detail::require_default_group("monitored_barrier").monitored_barrier(timeout));
}

COROCOLL_DECL std::shared_ptr<process_group> new_group(std::vector<int> ranks) {
    return sync_wait(detail::require_default_group("new_group").new_group(std::move(ranks)));
}

COROCOLL_END_NAMESPACE
