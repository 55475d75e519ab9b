#pragma once

// What a rank says it is doing when a peer asks (a wait of the peer's stalled or timed out),
// and what the answers of a whole group add up to: who to blame, and the report that lists
// every rank.

#include <corocoll/transport/frame.hpp>
#include <corocoll/transport/posted_recv.hpp>
#include <corocoll/version.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace transport::detail {

/// One rank's answer to a status query.
struct rank_status {
    /// The collective it is in, if any.
    bool in_collective = false;
    collective_meta current;
    /// The number of the last collective it finished, and the fingerprint of all of them.
    std::uint64_t done = 0;
    std::uint32_t fingerprint = 0;
    /// The last collectives it finished (at most `remembered`), oldest first.
    std::vector<collective_meta> recent;
    /// The ranks its receives wait for (`any_source` for a receive from anyone).
    std::vector<std::int32_t> waiting_for;
    /// One of those receives is a point-to-point one, with this tag.
    bool p2p_wait = false;
    std::int64_t p2p_tag = 0;
    /// The ranks it is sending to, waiting for room (their side does not read).
    std::vector<std::int32_t> sending_to;
    /// Not sent: the asking rank's note that this rank closed its group (said goodbye).
    bool left = false;

    static constexpr std::size_t remembered = 16;

    /// The call it made as collective #`seq`, if it still remembers it.
    const collective_meta* call(std::uint64_t seq) const noexcept;

    /// "#3 broadcast(root 0, ...), waiting for rank 1", "idle after #2 all_reduce(...)".
    std::string describe(describer d) const;

    /// "rank 1", "ranks 1, 2 and 3", "any rank".
    static std::string ranks(const std::vector<std::int32_t>& list);

    std::string encode() const;

    /// Nothing when `bytes` is not a whole answer.
    static std::optional<rank_status> decode(std::string_view bytes);

    /// The largest encoding a peer may send (its waits are bounded by the group's size).
    static std::size_t max_bytes(int group_size) noexcept;

private:
    struct fixed {
        std::uint8_t in_collective = 0;
        std::uint8_t p2p_wait = 0;
        std::uint16_t recent = 0;
        std::uint16_t waiting = 0;
        std::uint16_t sending = 0;
        std::uint32_t fingerprint = 0;
        std::uint64_t done = 0;
        std::int64_t p2p_tag = 0;
        collective_meta current;
    };
};

/// Why the ranks were asked.
enum class status_reason {
    stalled,   ///< no progress for a stall interval; a consistent group keeps waiting
    deadline,  ///< a receive's deadline passed; the group fails whatever the answers
};

/// What a group's answers add up to.
struct status_verdict {
    bool fail = false;
    int culprit = -1;
    bool timed_out = false;  ///< the cause is a rank that did not answer or a deadline
    bool stopped = false;    ///< the cause is a rank that did not answer (it failed)
    std::string text;        ///< the cause, then what every rank was doing
};

/// Judges the answers `all` (indexed by rank, this rank's own included; empty where no answer
/// came within `window`) collected by rank `me`, which asked because of `why` while it waited
/// in `waiting` for rank `waited_for` (any_source: no particular one).
COROCOLL_DECL status_verdict judge_status(const std::vector<std::optional<rank_status>>& all,
                                          int me, status_reason why, int waited_for,
                                          const std::string& waiting,
                                          std::chrono::milliseconds window, describer d);

}  // namespace transport::detail

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/impl/status.ipp>
#endif
