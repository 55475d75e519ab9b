// The bodies of <corocoll/transport/status_round.hpp>.
// Inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/status_round.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

COROCOLL_DECL void status_round::take_answer(int p, std::uint64_t id, const std::string& bytes) {
    if (!running_ || id != id_ || answers_[static_cast<std::size_t>(p)]) return;
    auto status = detail::rank_status::decode(bytes);
    if (!status) return;
    answers_[static_cast<std::size_t>(p)] = std::move(*status);
    if (--missing_ == 0) wake_.request_stop();
}

COROCOLL_DECL task<> status_round::run(std::chrono::milliseconds window,
                                       detail::describer describe) {
    running_ = true;
    id_ += 1;
    wake_ = std::stop_source();
    answers_.assign(static_cast<std::size_t>(size_), std::nullopt);
    answers_[static_cast<std::size_t>(rank_)] = host_.status_now();
    missing_ = 0;
    time_point until = std::chrono::steady_clock::now() + window;
    for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        if (!host_.can_ask(p)) {
            detail::rank_status gone;
            gone.left = true;
            answers_[static_cast<std::size_t>(p)] = gone;
            continue;
        }
        ++missing_;
        host_.ask(p, id_, until);
    }
    if (missing_ > 0) {
        try {
            co_await reactor_.sleep_until(until, wake_.get_token());
        } catch (const std::system_error&) {
            // every answer came (or the group failed)
        }
    }
    running_ = false;
    if (host_.ended()) co_return;
    subject s = host_.round_subject();
    auto verdict =
        detail::judge_status(answers_, rank_, s.why, s.waited_for, s.waiting, window, describe);
    if (verdict.fail) {
        host_.fail_group(verdict.culprit,
                         verdict.timed_out ? std::make_error_code(std::errc::timed_out)
                                           : make_error_code(corocoll::errc::protocol_error),
                         verdict.text, verdict.stopped);
    } else {
        host_.stall_explained(verdict.text);
    }
}

}  // namespace transport

COROCOLL_END_NAMESPACE
