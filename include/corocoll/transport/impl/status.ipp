// The bodies of the non-template functions declared in <corocoll/transport/status.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/status.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace transport {
namespace detail {

COROCOLL_DECL const collective_meta* rank_status::call(std::uint64_t seq) const noexcept {
    if (in_collective && current.seq == seq) return &current;
    for (const auto& m : recent) {
        if (m.seq == seq) return &m;
    }
    return nullptr;
}

COROCOLL_DECL std::string rank_status::describe(describer d) const {
    if (left) return "closed its process group";
    std::string s;
    if (in_collective) {
        s = "#" + std::to_string(current.seq) + " " + d(current);
    } else if (done > 0) {
        const collective_meta* last = call(done);
        s = "in no collective, after #" + std::to_string(done) + (last ? " " + d(*last) : "");
    } else {
        s = "in no collective, none run yet";
    }
    if (!sending_to.empty()) s += ", sending to " + ranks(sending_to);
    if (!waiting_for.empty()) {
        s += p2p_wait ? ", waiting in a recv (tag " + std::to_string(p2p_tag) + ") for "
                      : ", waiting for ";
        s += ranks(waiting_for);
    } else if (in_collective && sending_to.empty()) {
        s += ", waiting for nobody";
    }
    return s;
}

COROCOLL_DECL std::string rank_status::ranks(const std::vector<std::int32_t>& list) {
    std::string s = list.size() > 1 ? "ranks " : "";
    for (std::size_t i = 0; i < list.size(); ++i) {
        if (i > 0) s += i + 1 == list.size() ? " and " : ", ";
        if (list[i] == any_source) {
            s += "any rank";
        } else {
            s += (list.size() == 1 ? "rank " : "") + std::to_string(list[i]);
        }
    }
    return s;
}

COROCOLL_DECL std::string rank_status::encode() const {
    fixed f;
    f.in_collective = in_collective ? 1 : 0;
    f.p2p_wait = p2p_wait ? 1 : 0;
    f.recent = static_cast<std::uint16_t>(recent.size());
    f.waiting = static_cast<std::uint16_t>(waiting_for.size());
    f.sending = static_cast<std::uint16_t>(sending_to.size());
    f.fingerprint = fingerprint;
    f.done = done;
    f.p2p_tag = p2p_tag;
    f.current = current;
    std::string out(sizeof(f) + recent.size() * sizeof(collective_meta) +
                        (waiting_for.size() + sending_to.size()) * sizeof(std::int32_t),
                    '\0');
    char* at = out.data();
    std::memcpy(at, &f, sizeof(f));
    at += sizeof(f);
    if (!recent.empty()) std::memcpy(at, recent.data(), recent.size() * sizeof(collective_meta));
    at += recent.size() * sizeof(collective_meta);
    if (!waiting_for.empty())
        std::memcpy(at, waiting_for.data(), waiting_for.size() * sizeof(std::int32_t));
    at += waiting_for.size() * sizeof(std::int32_t);
    if (!sending_to.empty())
        std::memcpy(at, sending_to.data(), sending_to.size() * sizeof(std::int32_t));
    return out;
}

COROCOLL_DECL std::optional<rank_status> rank_status::decode(std::string_view bytes) {
    fixed f;
    if (bytes.size() < sizeof(f)) return std::nullopt;
    std::memcpy(&f, bytes.data(), sizeof(f));
    if (f.recent > remembered ||
        bytes.size() != sizeof(f) + f.recent * sizeof(collective_meta) +
                            (f.waiting + f.sending) * sizeof(std::int32_t)) {
        return std::nullopt;
    }
    rank_status s;
    s.in_collective = f.in_collective != 0;
    s.p2p_wait = f.p2p_wait != 0;
    s.fingerprint = f.fingerprint;
    s.done = f.done;
    s.p2p_tag = f.p2p_tag;
    s.current = f.current;
    s.recent.resize(f.recent);
    s.waiting_for.resize(f.waiting);
    s.sending_to.resize(f.sending);
    const char* at = bytes.data() + sizeof(f);
    if (f.recent > 0) std::memcpy(s.recent.data(), at, f.recent * sizeof(collective_meta));
    at += f.recent * sizeof(collective_meta);
    if (f.waiting > 0) std::memcpy(s.waiting_for.data(), at, f.waiting * sizeof(std::int32_t));
    at += f.waiting * sizeof(std::int32_t);
    if (f.sending > 0) std::memcpy(s.sending_to.data(), at, f.sending * sizeof(std::int32_t));
    return s;
}

COROCOLL_DECL std::size_t rank_status::max_bytes(int group_size) noexcept {
    return sizeof(fixed) + remembered * sizeof(collective_meta) +
           static_cast<std::size_t>(2 * group_size + 1) * sizeof(std::int32_t);
}

COROCOLL_DECL status_verdict judge_status(const std::vector<std::optional<rank_status>>& all,
                                          int me, status_reason why, int waited_for,
                                          const std::string& waiting,
                                          std::chrono::milliseconds window, describer d) {
    auto rank_name = [](int r) { return "rank " + std::to_string(r); };
    // What every rank was doing, at most 32 of them listed.
    std::string report = "what each rank was doing: ";
    int listed = 0;
    for (std::size_t r = 0; r < all.size(); ++r) {
        if (listed == 32) {
            report += "; ...";
            break;
        }
        report += (listed++ > 0 ? "; " : "") + rank_name(static_cast<int>(r)) + ": " +
                  (all[r] ? all[r]->describe(d) : "no answer");
    }

    status_verdict v;
    std::vector<std::int32_t> silent;
    for (std::size_t r = 0; r < all.size(); ++r) {
        if (!all[r]) silent.push_back(static_cast<int>(r));
    }
    if (!silent.empty()) {
        v.fail = true;
        v.timed_out = true;
        v.stopped = true;
        v.culprit = silent.front();
        v.text = rank_status::ranks(silent) +
                 " stopped responding: no answer to a status query within " +
                 std::to_string(window.count()) + " ms (asked by " + rank_name(me) +
                 ", waiting in " + waiting + "); " + report;
        return v;
    }

    // The first collective that two ranks called differently, or whose earlier history
    // differs (same call, different fingerprint before it).
    std::optional<std::uint64_t> first_seq;
    int first_rank = -1, other_rank = -1;
    std::map<std::uint64_t, std::pair<int, collective_meta>> seen;
    for (std::size_t r = 0; r < all.size(); ++r) {
        if (all[r]->left) continue;
        auto consider = [&](const collective_meta& m) {
            auto [at, fresh] = seen.try_emplace(m.seq, static_cast<int>(r), m);
            if (fresh || at->second.second.same_call(m)) return;
            if (!first_seq || m.seq < *first_seq) {
                first_seq = m.seq;
                first_rank = at->second.first;
                other_rank = static_cast<int>(r);
            }
        };
        for (const auto& m : all[r]->recent) consider(m);
        if (all[r]->in_collective) consider(all[r]->current);
    }
    if (first_seq) {
        const collective_meta& a = *all[static_cast<std::size_t>(first_rank)]->call(*first_seq);
        const collective_meta& b = *all[static_cast<std::size_t>(other_rank)]->call(*first_seq);
        v.fail = true;
        v.culprit = other_rank;
        v.text = "collective #" + std::to_string(*first_seq) +
                 " does not match across ranks: " + rank_name(first_rank) + " called " + d(a) +
                 ", " + rank_name(other_rank) + " called " + d(b) + "; " + report;
        return v;
    }
    // Same calls where they remember them, but different histories before those.
    for (std::size_t r = 1; r < all.size(); ++r) {
        const rank_status& a = *all[0];
        const rank_status& b = *all[r];
        if (a.left || b.left) continue;
        if (a.done == b.done && a.fingerprint != b.fingerprint) {
            v.fail = true;
            v.culprit = static_cast<int>(r);
            v.text = "rank 0 and " + rank_name(static_cast<int>(r)) +
                     " ran different collectives before #" +
                     std::to_string(a.done - std::min<std::uint64_t>(a.done, a.recent.size())) +
                     " (their fingerprints of collectives 1 to " + std::to_string(a.done) +
                     " differ); " + report;
            return v;
        }
    }
    // A rank that waits in collective #k for a rank that has finished #k waits for a message
    // that was never sent.
    for (std::size_t r = 0; r < all.size(); ++r) {
        const rank_status& s = *all[r];
        if (!s.in_collective) continue;
        for (std::int32_t q : s.waiting_for) {
            if (q < 0 || static_cast<std::size_t>(q) >= all.size()) continue;
            if (!all[static_cast<std::size_t>(q)]->left &&
                all[static_cast<std::size_t>(q)]->done >= s.current.seq) {
                v.fail = true;
                v.culprit = q;
                v.text = rank_name(static_cast<int>(r)) + " waits in collective #" +
                         std::to_string(s.current.seq) + " for " + rank_name(q) +
                         ", which finished it without sending to it; " + report;
                return v;
            }
        }
    }
    // A rank outside any collective that waits in a recv only for ranks that are themselves
    // stuck in a collective waits forever: they cannot send until it joins (it skipped the
    // collective, or called it later than a recv that depends on it).
    for (std::size_t r = 0; r < all.size(); ++r) {
        const rank_status& s = *all[r];
        if (s.left || s.in_collective || s.waiting_for.empty()) continue;
        bool stuck = true;
        for (std::size_t q = 0; q < all.size() && stuck; ++q) {
            if (q == r) continue;
            bool waited_for = std::find(s.waiting_for.begin(), s.waiting_for.end(),
                                        static_cast<std::int32_t>(q)) != s.waiting_for.end() ||
                              std::find(s.waiting_for.begin(), s.waiting_for.end(), any_source) !=
                                  s.waiting_for.end();
            if (waited_for && !(all[q]->in_collective && !all[q]->waiting_for.empty()))
                stuck = false;
        }
        if (stuck) {
            v.fail = true;
            v.culprit = static_cast<int>(r);
            v.text = rank_name(static_cast<int>(r)) +
                     " is in no collective and waits in a recv for ranks that wait in a "
                     "collective for it: it skipped a collective or calls it too late; " +
                     report;
            return v;
        }
    }
    if (why == status_reason::stalled) {
        v.text = "every rank answered and their calls agree; " + report;
        return v;
    }
    v.fail = true;
    v.timed_out = true;
    v.culprit = waited_for >= 0 ? waited_for : me;
    // The ranks that have not called this rank's collective yet (alive, idle or busy with
    // something else): the usual reason for a collective's timeout.
    std::vector<std::int32_t> behind;
    const rank_status& mine = *all[static_cast<std::size_t>(me)];
    if (mine.in_collective) {
        for (std::size_t r = 0; r < all.size(); ++r) {
            const rank_status& s = *all[r];
            if (static_cast<int>(r) == me || s.left || s.done >= mine.current.seq) continue;
            if (s.in_collective && s.current.seq >= mine.current.seq) continue;
            behind.push_back(static_cast<std::int32_t>(r));
        }
    }
    if (!behind.empty() && std::find(behind.begin(), behind.end(),
                                     static_cast<std::int32_t>(v.culprit)) == behind.end()) {
        v.culprit = behind.front();
    }
    v.text = rank_name(me) + " timed out waiting in " + waiting +
             (waited_for >= 0 ? " for " + rank_name(waited_for) : std::string()) +
             " (the operation's timeout passed); " +
             (behind.empty() ? std::string("every rank answered and their calls agree")
                             : rank_status::ranks(behind) + " answered but " +
                                   (behind.size() == 1 ? "has" : "have") + " not called it yet") +
             "; " + report;
    return v;
}

}  // namespace detail
}  // namespace transport

COROCOLL_END_NAMESPACE
