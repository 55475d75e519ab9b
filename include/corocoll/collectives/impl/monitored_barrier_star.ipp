// The bodies of the non-template functions declared in
// <corocoll/collectives/monitored_barrier_star.hpp>: inline where corocoll is header-only, compiled
// once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/monitored_barrier_star.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL task<> monitored_barrier_star(context& c, std::chrono::milliseconds timeout) {
    int n = c.size();
    if (c.rank() != 0) {
        // The verdict may already be here (a late rank's rank 0 may have left meanwhile):
        // post its receive first, and let a failed report not hide it.
        std::int64_t len = 0;
        auto verdict = c.recv(std::as_writable_bytes(std::span(&len, 1)), 0, 1);
        verdict.start();
        // Awaited whatever happens (a failed report fails the group, which ends the verdict's
        // receive too): a receive must not be dropped while its payload may be arriving.
        std::exception_ptr report_failed;
        try {
            co_await c.send({}, 0, 0);
        } catch (const std::system_error&) {
            report_failed = std::current_exception();
        }
        try {
            co_await verdict;
        } catch (const std::system_error&) {
            if (report_failed) std::rethrow_exception(report_failed);
            throw;
        }
        if (len == 0) co_return;
        std::string text(static_cast<std::size_t>(len), '\0');
        co_await c.recv(std::as_writable_bytes(std::span(text.data(), text.size())), 0, 2);
        corocoll::detail::throw_error(std::make_error_code(std::errc::timed_out), text);
    }
    context watch = c;
    watch.deadline = std::min(c.deadline, io::deadline_after(timeout));
    watch.soft_deadline = true;  // a rank that is late is reported, not a failure of the group
    std::vector<char> arrived(static_cast<std::size_t>(n), 0);
    arrived[0] = 1;
    std::vector<task<>> reports;
    for (int p = 1; p < n; ++p) {
        reports.push_back([](context& w, char& flag, int from) -> task<> {
            try {
                co_await w.recv({}, from, 0);
                flag = 1;
            } catch (const std::system_error& e) {
                if (e.code() != std::errc::timed_out) throw;
            }
        }(watch, arrived[static_cast<std::size_t>(p)], p));
    }
    co_await when_all(std::move(reports));
    std::string missing;
    for (int p = 1; p < n; ++p) {
        if (!arrived[static_cast<std::size_t>(p)])
            missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    }
    std::string text;
    if (!missing.empty()) {
        // Gloo's words too ("Rank 0 timed out in monitoredBarrier"), which torch's tests and
        // the programs written against them look for.
        text = "corocoll: monitored_barrier: rank(s) " + missing + " did not arrive within " +
               std::to_string(timeout.count()) + " ms (Rank 0 timed out in monitoredBarrier " +
               "after " + std::to_string(timeout.count()) + " ms)";
    }
    std::int64_t len = static_cast<std::int64_t>(text.size());
    std::vector<task<>> verdicts;
    for (int p = 1; p < n; ++p) {
        // Late ranks get the verdict when they arrive (it waits in their buffers).
        verdicts.push_back(
            [](context& cc, const std::int64_t& l, const std::string& t, int to) -> task<> {
                co_await cc.send(std::as_bytes(std::span(&l, 1)), to, 1);
                if (l > 0) co_await cc.send(std::as_bytes(std::span(t.data(), t.size())), to, 2);
            }(c, len, text, p));
    }
    co_await when_all(std::move(verdicts));
    if (!text.empty())
        corocoll::detail::throw_error(std::make_error_code(std::errc::timed_out), text);
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
