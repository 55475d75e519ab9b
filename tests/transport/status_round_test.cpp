// The status round on its own: a host that stands in for the engine (status_round::host)
// records what the round asks and what verdict it hands back, and answers for the peers it
// is told to. What the round does with silence, agreement, a peer that left, a deadline
// and a group that ended meanwhile, counted through that interface.

#include <corocoll/corocoll.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

using namespace std::chrono_literals;

namespace cc = corocoll;

namespace {

namespace tr = cc::transport;

struct fake_host final : tr::status_round::host {
    std::vector<bool> askable;
    std::vector<std::pair<int, std::uint64_t>> asked;
    bool has_ended = false;
    tr::status_round::subject what;
    int failures = 0;
    int culprit = -2;
    std::error_code code;
    std::string text;
    bool stopped = false;
    int explained = 0;
    std::string report;

    explicit fake_host(int size) : askable(static_cast<std::size_t>(size), true) {}

    tr::detail::rank_status status_now() const override { return {}; }
    bool can_ask(int p) const noexcept override { return askable[static_cast<std::size_t>(p)]; }
    void ask(int p, std::uint64_t id, time_point /*until*/) override { asked.emplace_back(p, id); }
    bool ended() const noexcept override { return has_ended; }
    tr::status_round::subject round_subject() const override { return what; }
    void fail_group(int c, std::error_code ec, const std::string& t, bool s) override {
        ++failures;
        culprit = c;
        code = ec;
        text = t;
        stopped = s;
    }
    void stall_explained(const std::string& r) override {
        ++explained;
        report = r;
    }
};

// Answers, as idle ranks, every question asked of the ranks in `answering`, once the round
// waits (after a turn of the reactor, as a reader would).
cc::task<> answer(cc::io::reactor& r, fake_host& h, tr::status_round& round,
                  std::vector<int> answering) {
    co_await r.sleep_for(1ms);
    for (auto [p, id] : h.asked) {
        for (int a : answering) {
            if (a == p) round.take_answer(p, id, tr::detail::rank_status{}.encode());
        }
    }
}

}  // namespace

TEST_CASE("a status round blames the peer that did not answer within the window") {
    cc::io::reactor r;
    fake_host h(3);
    tr::status_round round(h, r, 0, 3);
    h.what.why = tr::detail::status_reason::deadline;
    h.what.waited_for = 1;
    h.what.waiting = "recv from rank 1 (tag 7)";
    // A window far longer than the 1 ms before rank 1 answers: its answer is in, however
    // loaded the machine, when the window ends.
    r.run(cc::when_all(round.run(1s, &tr::detail::describe_raw), answer(r, h, round, {1})));
    CHECK(h.asked == std::vector<std::pair<int, std::uint64_t>>{{1, 1}, {2, 1}});
    CHECK(h.failures == 1);
    CHECK(h.explained == 0);
    CHECK(h.culprit == 2);
    CHECK(h.code == std::errc::timed_out);
    CHECK(h.stopped);  // taken for failed, not only blamed
    CHECK(h.text.find("rank 2 stopped responding: no answer to a status query within 1000 ms "
                      "(asked by rank 0, waiting in recv from rank 1 (tag 7))") == 0);
    CHECK_FALSE(round.running());
}

TEST_CASE("a stall that every rank explains fails nobody, and a late answer is dropped") {
    cc::io::reactor r;
    fake_host h(3);
    tr::status_round round(h, r, 1, 3);
    r.run(cc::when_all(round.run(5s, &tr::detail::describe_raw), answer(r, h, round, {0, 2})));
    CHECK(h.asked == std::vector<std::pair<int, std::uint64_t>>{{0, 1}, {2, 1}});
    CHECK(h.failures == 0);
    CHECK(h.explained == 1);
    CHECK(h.report.find("rank 0: ") != std::string::npos);
    // An answer to that question, arriving after the round, changes nothing.
    round.take_answer(0, 1, tr::detail::rank_status{}.encode());
    CHECK(h.failures == 0);
    CHECK(h.explained == 1);
    // A second round asks question 2; a peer that cannot be asked (it left) is not asked.
    h.askable[2] = false;
    h.asked.clear();
    r.run(cc::when_all(round.run(5s, &tr::detail::describe_raw), answer(r, h, round, {0})));
    CHECK(h.asked == std::vector<std::pair<int, std::uint64_t>>{{0, 2}});
    CHECK(h.failures == 0);
    CHECK(h.explained == 2);
}

TEST_CASE("a deadline that every rank explains blames the rank waited for") {
    cc::io::reactor r;
    fake_host h(2);
    tr::status_round round(h, r, 0, 2);
    h.what.why = tr::detail::status_reason::deadline;
    h.what.waited_for = 1;
    h.what.waiting = "a shared-memory step of collective #4";
    r.run(cc::when_all(round.run(5s, &tr::detail::describe_raw), answer(r, h, round, {1})));
    CHECK(h.failures == 1);
    CHECK(h.explained == 0);
    CHECK(h.culprit == 1);
    CHECK(h.code == std::errc::timed_out);
    CHECK_FALSE(h.stopped);  // it answered: blamed, not failed
    CHECK(h.text.find("rank 0 timed out waiting in a shared-memory step of collective #4 for "
                      "rank 1 (the operation's timeout passed); every rank answered and their "
                      "calls agree; ") == 0);
}

TEST_CASE("a round whose group ended while it waited hands back no verdict") {
    cc::io::reactor r;
    fake_host h(2);
    tr::status_round round(h, r, 0, 2);
    auto end_group = [&]() -> cc::task<> {
        co_await r.sleep_for(1ms);
        h.has_ended = true;
        round.stop();
    };
    r.run(cc::when_all(round.run(30s, &tr::detail::describe_raw), end_group()));
    CHECK(h.asked.size() == 1);
    CHECK(h.failures == 0);
    CHECK(h.explained == 0);
    CHECK_FALSE(round.running());
}
