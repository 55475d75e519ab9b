#pragma once

// The frame: the header before every message on every channel, collective metadata, and the
// abort notice.

#include <corocoll/version.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// "CCOL", the first four bytes of every frame.
inline constexpr std::uint32_t frame_magic = 0x4c4f4343;
/// Bumped whenever the frame layout or the meaning of a field changes, or the layout of what
/// peers share (version 5: the shared-memory rings' records, shm/segment.hpp); peers with
/// different versions refuse each other at connection time. Version 6: an abort notice says
/// what kind of failure it reports (`failure_cause`, in `dtype`). Version 7: the shared
/// arena's header holds a single-copy size per kind of call (shm/arena.hpp, `arena_header`).
/// Version 8: one kind more there (all_reduce). Version 9: a step place of the arena records
/// the call in 24 bytes (`step_call`) and holds 32 bytes of data in its first line. Version 10:
/// the arena's header bounds each kind's single copies from above too (`single_copy_below_kib`).
inline constexpr std::uint16_t protocol_version = 10;

enum class frame_kind : std::uint8_t {
    hello = 1,       ///< first frame on a connection: who is calling, for which group
    p2p = 2,         ///< a point-to-point message; `length` payload bytes follow
    collective = 3,  ///< a collective's message (layer 5)
    goodbye = 4,     ///< the sender closed its process group; nothing follows
    /// "what are you doing?": asked when a wait stalls or times out (`seq`: the question's
    /// number); nothing follows
    status_query = 5,
    /// the answer to a status query (`seq` repeats the question's number); a `rank_status`
    /// of `length` bytes follows
    status_reply = 6,
};

/// `flags` of a goodbye: the sender's group failed because of rank `root` (error code in
/// `count`, `op` 1 for a corocoll code, 0 for an errno value, `dtype` the `failure_cause`).
inline constexpr std::uint8_t goodbye_abort = 1;

/// What kind of failure ended a group, as every rank reports it.
enum class failure_cause : std::uint8_t {
    /// A rank is to blame but may well be alive: it called another collective, broke the
    /// protocol, gave up on the group (`engine::abandon`), or did not send in time.
    blamed = 0,
    /// The rank named is gone: its process ended (its connection closed without a goodbye,
    /// its memory could not be read) or stopped (it did not answer a status query). Such a
    /// rank is in `engine::failed_ranks`.
    rank_failed = 1,
    /// The rank named revoked the group (`engine::revoke`): nobody failed.
    revoked = 2,
    /// The group was closed on this rank (never sent: a peer that closes says goodbye).
    closed = 3,
};

/// The fixed 64-byte header in front of every message between ranks, in the sender's byte
/// order (all ranks of a job run on one architecture). `checksum` covers the 60 bytes before
/// it, so a stream that lost its framing is detected at the next header instead of being
/// read as garbage.
struct frame_header {
    /// `frame_magic`: a header that lost its framing fails here.
    std::uint32_t magic = frame_magic;
    /// `protocol_version` of the sender.
    std::uint16_t version = protocol_version;
    /// What the frame carries.
    frame_kind kind = frame_kind::p2p;
    /// Per kind: the algorithm of a collective, the end of a stream, ...
    std::uint8_t flags = 0;
    std::uint32_t src = 0;     ///< sender's rank in the group
    std::uint32_t dst = 0;     ///< receiver's rank in the group
    std::int64_t tag = 0;      ///< p2p tag
    std::uint64_t length = 0;  ///< payload bytes after the header
    std::uint64_t seq = 0;     ///< collective sequence number; hello: group id
    std::uint64_t count = 0;   ///< collective element count; hello: world size
    std::uint32_t root = 0;    ///< collective root
    std::uint8_t op = 0;       ///< collective kind / reduce op
    std::uint8_t dtype = 0;    ///< element type
    /// Collective: the reduce op.
    std::uint16_t reserved0 = 0;
    std::uint32_t history = 0;  ///< collective: fingerprint of the sender's earlier collectives
    /// FNV-1a of the words before it (see `compute_checksum`).
    std::uint32_t checksum = 0;

    /// An FNV-1a-style hash of the 60 bytes before `checksum`, in four independent 64-bit
    /// lanes folded at the end (protocol version 4): a stream that lost its framing fails it
    /// at the next header, and a header costs two dependent multiplications per lane.
    std::uint32_t compute_checksum() const noexcept;
    /// Sets `checksum` for the header as it is now.
    void seal() noexcept { checksum = compute_checksum(); }

    /// Empty when the header is sound; otherwise what is wrong with it. Without `sealed`, the
    /// checksum is not looked at (see `sound_unsealed`).
    std::string problem(std::uint64_t max_length, bool sealed = true) const;
    /// True when `problem(max_length)` is empty, without making a string: what a reader asks
    /// of every frame.
    bool sound(std::uint64_t max_length) const noexcept {
        return magic == frame_magic && version == protocol_version &&
               checksum == compute_checksum() && length <= max_length;
    }
    /// `sound` without the checksum: for a channel that cannot lose its framing, whose
    /// senders leave `checksum` 0 (a tenth of a small message's time on shared memory).
    bool sound_unsealed(std::uint64_t max_length) const noexcept {
        return magic == frame_magic && version == protocol_version && length <= max_length;
    }
};
static_assert(sizeof(frame_header) == 64, "the wire header is 64 bytes");

/// What every rank's call of one collective must agree on; carried in each of its frames
/// (`op` = collective, `flags` = algorithm, `reserved0` = reduce op, `dtype`, `root`, `count`,
/// `seq`, `history`) and checked by the receiver against its own call. The values are the
/// collectives layer's enums.
struct collective_meta {
    /// The collective's kind (collectives layer's enum).
    std::uint8_t collective = 0;
    /// The reduce op, 0 where none.
    std::uint8_t redop = 0;
    /// The element type.
    std::uint8_t dtype = 0;
    std::uint8_t algorithm = 0;  ///< ranks that chose different algorithms disagree too
    /// The root rank, 0 where none.
    std::uint32_t root = 0;
    /// Elements in this rank's call.
    std::uint64_t count = 0;
    std::uint64_t seq = 0;  ///< the group's count of collectives so far, this one's number
    /// The fingerprint of every collective the rank ran before this one (`fold`): ranks whose
    /// earlier calls differed disagree here even when this call is the same.
    std::uint32_t history = 0;

    /// Writes the metadata into `h`'s fields.
    void apply_to(frame_header& h) const noexcept;
    /// Reads the metadata back from a received header.
    static collective_meta of(const frame_header& h) noexcept;
    /// Equal in every field: what a receiver checks.
    friend bool operator==(const collective_meta&, const collective_meta&) = default;
    /// The same call, whatever came before it.
    bool same_call(const collective_meta& o) const noexcept;

    /// `fingerprint` extended by this call (FNV-1a over its fields, `history` left out).
    std::uint32_t fold(std::uint32_t fingerprint) const noexcept;
};

/// The last words of a rank whose group failed: a goodbye frame with `goodbye_abort`, which
/// names the rank it blames (`root`) and the error (value in `count`, `op` 1 for a corocoll
/// code, 0 for an errno value), followed by `text_length` bytes of the error text. Peers
/// report that cause instead of blaming the sender when its connection closes.
struct abort_notice {
    /// The longest error text a notice carries.
    static constexpr std::size_t max_text = 4096;

    /// The rank the failure is blamed on.
    std::uint32_t culprit = 0;
    /// The error code value.
    int code = 0;
    /// True: `code` is in corocoll's category, else in the system category.
    bool corocoll_code = false;
    /// Bytes of text after the notice.
    std::uint64_t text_length = 0;
    /// What kind of failure it is (`closed` is never sent; read as `blamed`).
    failure_cause cause = failure_cause::blamed;

    /// The sealed header from `src` to `dst` that carries this notice.
    frame_header header(std::uint32_t src, std::uint32_t dst) const noexcept;

    /// The notice a goodbye header carries; nothing when it is a plain goodbye, or when the
    /// culprit is not a rank of a group of `group_size`.
    static std::optional<abort_notice> of(const frame_header& h, int group_size) noexcept;
};

/// A 64-bit FNV-1a hash: a group's name as it travels in hello frames.
COROCOLL_DECL std::uint64_t hash64(const std::string& s) noexcept;

}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/impl/frame.ipp>
#endif
