#pragma once

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
/// peers share (version 5: the shared-memory rings' records, shm_channel.hpp); peers with
/// different versions refuse each other at connection time.
inline constexpr std::uint16_t protocol_version = 5;

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
/// `count`, `op` 1 for a corocoll code, 0 for an errno value).
inline constexpr std::uint8_t goodbye_abort = 1;

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

    /// The sealed header from `src` to `dst` that carries this notice.
    frame_header header(std::uint32_t src, std::uint32_t dst) const noexcept;

    /// The notice a goodbye header carries; nothing when it is a plain goodbye, or when the
    /// culprit is not a rank of a group of `group_size`.
    static std::optional<abort_notice> of(const frame_header& h, int group_size) noexcept;
};

/// A 64-bit FNV-1a hash: a group's name as it travels in hello frames.
COROCOLL_DECL std::uint64_t hash64(const std::string& s) noexcept;

/// Compares two byte strings in time that depends only on their lengths, for job tokens.
COROCOLL_DECL bool constant_time_equal(const std::string& a, const std::string& b) noexcept;

}  // namespace transport

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace transport {

COROCOLL_DECL std::uint32_t frame_header::compute_checksum() const noexcept {
    // The 60 bytes before `checksum` as 7 words of 64 bits and one of 32, folded FNV-1a
    // style into four independent lanes: the chain of dependent multiplications is 2 long
    // instead of 15 (a third of the time per header, which every message pays twice).
    std::uint64_t words[8] = {};
    std::memcpy(words, this, offsetof(frame_header, checksum));
    constexpr std::uint64_t prime = 0x100000001b3ull;
    std::uint64_t lane[4] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull, 0x9ce484222325cbf2ull,
                             0x2325cbf29ce48422ull};
    for (int i = 0; i < 8; ++i) lane[i % 4] = (lane[i % 4] ^ words[i]) * prime;
    std::uint64_t h = lane[0];
    for (int i = 1; i < 4; ++i) h = (h ^ lane[i]) * prime;
    return static_cast<std::uint32_t>(h ^ (h >> 32));
}

COROCOLL_DECL std::string frame_header::problem(std::uint64_t max_length, bool sealed) const {
    if (magic != frame_magic) return "not a corocoll frame (bad magic)";
    if (version != protocol_version) {
        return "protocol version " + std::to_string(version) + ", this rank speaks " +
               std::to_string(protocol_version);
    }
    if (sealed && checksum != compute_checksum()) return "header checksum mismatch";
    if (length > max_length) {
        return "message of " + std::to_string(length) + " bytes exceeds the maximum of " +
               std::to_string(max_length);
    }
    return {};
}

COROCOLL_DECL void collective_meta::apply_to(frame_header& h) const noexcept {
    h.kind = frame_kind::collective;
    h.op = collective;
    h.flags = algorithm;
    h.reserved0 = redop;
    h.dtype = dtype;
    h.root = root;
    h.count = count;
    h.seq = seq;
    h.history = history;
}

COROCOLL_DECL collective_meta collective_meta::of(const frame_header& h) noexcept {
    return {
        h.op,     static_cast<std::uint8_t>(h.reserved0), h.dtype, h.flags, h.root, h.count, h.seq,
        h.history};
}

COROCOLL_DECL bool collective_meta::same_call(const collective_meta& o) const noexcept {
    return collective == o.collective && redop == o.redop && dtype == o.dtype &&
           algorithm == o.algorithm && root == o.root && count == o.count && seq == o.seq;
}

COROCOLL_DECL std::uint32_t collective_meta::fold(std::uint32_t fingerprint) const noexcept {
    std::uint32_t words[7] = {collective,
                              redop,
                              dtype,
                              algorithm,
                              root,
                              static_cast<std::uint32_t>(count),
                              static_cast<std::uint32_t>(count >> 32)};
    std::uint32_t h = fingerprint == 0 ? 2166136261u : fingerprint;
    for (std::uint32_t w : words) h = (h ^ w) * 16777619u;
    return (h ^ static_cast<std::uint32_t>(seq)) * 16777619u;
}

COROCOLL_DECL frame_header abort_notice::header(std::uint32_t src,
                                                std::uint32_t dst) const noexcept {
    frame_header h;
    h.kind = frame_kind::goodbye;
    h.flags = goodbye_abort;
    h.src = src;
    h.dst = dst;
    h.root = culprit;
    h.count = static_cast<std::uint64_t>(static_cast<std::uint32_t>(code));
    h.op = corocoll_code ? 1 : 0;
    h.length = text_length;
    h.seal();
    return h;
}

COROCOLL_DECL std::optional<abort_notice> abort_notice::of(const frame_header& h,
                                                           int group_size) noexcept {
    if (h.kind != frame_kind::goodbye || (h.flags & goodbye_abort) == 0 ||
        h.root >= static_cast<std::uint32_t>(group_size)) {
        return std::nullopt;
    }
    return abort_notice{h.root, static_cast<int>(static_cast<std::uint32_t>(h.count)), h.op == 1,
                        h.length};
}

COROCOLL_DECL std::uint64_t hash64(const std::string& s) noexcept {
    std::uint64_t h = 14695981039346656037ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

COROCOLL_DECL bool constant_time_equal(const std::string& a, const std::string& b) noexcept {
    unsigned char diff = a.size() == b.size() ? 0 : 1;
    std::size_t n = a.size() < b.size() ? a.size() : b.size();
    for (std::size_t i = 0; i < n; ++i) {
        diff |= static_cast<unsigned char>(a[i] ^ b[i]);
    }
    return diff == 0;
}

}  // namespace transport

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
