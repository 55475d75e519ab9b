// The bodies of the non-template functions declared in <corocoll/process_group/parent_watch.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/process_group/parent_watch.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL std::system_error parent_failed_error(const transport::engine& parent,
                                                    const std::string& parent_name,
                                                    const std::string& what) {
    std::string culprit = parent.failed_peer() >= 0
                              ? "rank " + std::to_string(parent.failed_peer()) + " of "
                              : std::string();
    auto code = make_error_code(errc::connection_closed);
    // The parent's text ends with its code's words, which this error's what() adds again.
    std::string cause = parent.failure_what();
    std::string tail = ": " + code.message();
    if (cause.size() > tail.size() &&
        cause.compare(cause.size() - tail.size(), tail.size(), tail) == 0) {
        cause.resize(cause.size() - tail.size());
    }
    return std::system_error(code, "corocoll: rank " + std::to_string(parent.rank()) + ": " + what +
                                       ": stopped, " + culprit + "the parent group '" +
                                       parent_name + "' failed during set-up: " + cause);
}

COROCOLL_DECL void parent_watched_store::check_parent() const {
    if (parent_.failed()) throw parent_failed_error(parent_, parent_name_, what_);
}

COROCOLL_DECL task<> parent_watched_store::set(std::string key, std::string value) {
    check_parent();
    co_await base_->set(std::move(key), std::move(value));
}

COROCOLL_DECL task<std::string> parent_watched_store::get(std::string key) {
    std::vector<std::string> keys{key};
    co_await wait(std::move(keys), timeout());
    co_return co_await base_->get(std::move(key));
}

COROCOLL_DECL task<std::int64_t> parent_watched_store::add(std::string key, std::int64_t delta) {
    check_parent();
    co_return co_await base_->add(std::move(key), delta);
}

COROCOLL_DECL task<std::string> parent_watched_store::compare_set(std::string key,
                                                                  std::string expected,
                                                                  std::string desired) {
    check_parent();
    co_return co_await base_->compare_set(std::move(key), std::move(expected), std::move(desired));
}

COROCOLL_DECL task<> parent_watched_store::wait(std::vector<std::string> keys, duration timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
        check_parent();
        if (co_await base_->check(keys)) co_return;
        check_parent();
        auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
            corocoll::detail::throw_error(
                std::make_error_code(std::errc::timed_out),
                "corocoll: store: wait for " + rendezvous::detail::join_keys(keys) +
                    " timed out after " + std::to_string(timeout.count()) + " ms");
        }
        auto* r = io::reactor::current();
        if (r == nullptr) {
            // No reactor to pause on (a caller outside corocoll's loop): one plain wait.
            co_await base_->wait(std::move(keys), std::chrono::duration_cast<duration>(
                                                      deadline - now + duration(1)));
            co_return;
        }
        co_await r->sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
        pause = std::min(pause * 2, longest_pause);
    }
}

COROCOLL_DECL task<bool> parent_watched_store::check(std::vector<std::string> keys) {
    check_parent();
    co_return co_await base_->check(std::move(keys));
}

COROCOLL_DECL task<bool> parent_watched_store::delete_key(std::string key) {
    check_parent();
    co_return co_await base_->delete_key(std::move(key));
}

COROCOLL_DECL task<std::int64_t> parent_watched_store::num_keys() {
    co_return co_await base_->num_keys();
}

}  // namespace detail

COROCOLL_END_NAMESPACE
