#pragma once

// The status round: a receive's deadline passed, or this rank's receives made no progress for
// the stall interval, so the rank asks every peer what it is doing, waits for the answers (the
// answer window at most) and judges them: the rank to blame and the report, or nobody. A class
// with a narrow way back to the engine that runs it (`status_round::host`: this rank's own
// answer, which peers can be asked and how, what the round is about, where the verdict goes),
// as a pair calls back into its context in Gloo. The engine answers other ranks' questions
// itself (engine_status.ipp); this is the asking side.

#include <corocoll/core/error.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/transport/posted_recv.hpp>
#include <corocoll/transport/status.hpp>
#include <corocoll/version.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stop_token>
#include <string>
#include <system_error>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// The asking side of a status round (see the top of this file); one per engine, one round
/// at a time, on the engine's reactor.
class status_round {
public:
    /// Deadlines are points on the steady clock.
    using time_point = std::chrono::steady_clock::time_point;

    /// What a round is about, as the engine sees it once the answers are in.
    struct subject {
        /// A wait past its deadline, or a stall.
        detail::status_reason why = detail::status_reason::stalled;
        /// The rank waited for (any_source: no particular one).
        int waited_for = any_source;
        /// What waited ("collective #3 broadcast(...)", "its receives, with no progress
        /// for 1000 ms").
        std::string waiting;
    };

    /// What the round needs of the engine that runs it.
    class host {
    public:
        /// Deadlines are points on the steady clock.
        using time_point = std::chrono::steady_clock::time_point;

        /// This rank's own answer.
        virtual detail::rank_status status_now() const = 0;
        /// Whether peer `p` can be asked (connected, and it did not say goodbye).
        virtual bool can_ask(int p) const noexcept = 0;
        /// Sends question `id` to peer `p` (its answer comes to `take_answer`); gives up at
        /// `until`.
        virtual void ask(int p, std::uint64_t id, time_point until) = 0;
        /// True when the group failed or is closing: the round then judges nothing.
        virtual bool ended() const noexcept = 0;
        /// What the round is about, read after the answers came.
        virtual subject round_subject() const = 0;
        /// The verdict blames `culprit`: the group fails with exactly `text`. `stopped`: the
        /// culprit did not answer (it is taken for failed, not only blamed).
        virtual void fail_group(int culprit, std::error_code code, const std::string& text,
                                bool stopped) = 0;
        /// Nobody is to blame for a stall (every rank answered; they agree): `report` says
        /// what each rank does, the stall clock starts again.
        virtual void stall_explained(const std::string& report) = 0;

    protected:
        ~host() = default;
    };

    /// A round of rank `rank` of a group of `size`, run on `r`, for host `h`.
    status_round(host& h, io::reactor& r, int rank, int size) noexcept
        : host_(h), reactor_(r), rank_(rank), size_(size) {}
    status_round(const status_round&) = delete;
    status_round& operator=(const status_round&) = delete;

    /// One round runs at a time.
    bool running() const noexcept { return running_; }

    /// Asks every peer that can be asked, waits for their answers (`window` at most), then
    /// judges them and hands the verdict to the host. `describe` writes calls in the report.
    task<> run(std::chrono::milliseconds window, detail::describer describe);

    /// Peer `p`'s answer to question `id`: kept when it answers the running round's question.
    void take_answer(int p, std::uint64_t id, const std::string& bytes);

    /// The group failed: the running round stops waiting for answers.
    void stop() noexcept { wake_.request_stop(); }

private:
    host& host_;
    io::reactor& reactor_;
    int rank_;
    int size_;
    bool running_ = false;
    std::uint64_t id_ = 0;
    std::vector<std::optional<detail::rank_status>> answers_;
    int missing_ = 0;
    std::stop_source wake_;
};

}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/impl/status_round.ipp>
#endif
