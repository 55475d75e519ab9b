// The bodies of the non-template functions declared in <corocoll/transport/frame.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/transport/frame.hpp>

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
    h.dtype = static_cast<std::uint8_t>(cause);
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
    auto cause = h.dtype == static_cast<std::uint8_t>(failure_cause::rank_failed) ||
                         h.dtype == static_cast<std::uint8_t>(failure_cause::revoked)
                     ? static_cast<failure_cause>(h.dtype)
                     : failure_cause::blamed;
    return abort_notice{h.root, static_cast<int>(static_cast<std::uint32_t>(h.count)), h.op == 1,
                        h.length, cause};
}

COROCOLL_DECL std::uint64_t hash64(const std::string& s) noexcept {
    std::uint64_t h = 14695981039346656037ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

}  // namespace transport

COROCOLL_END_NAMESPACE
