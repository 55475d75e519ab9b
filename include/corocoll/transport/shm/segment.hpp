#pragma once

// The layout of a shared segment between two ranks on one host: a header, then two
// single-producer/single-consumer byte rings (one per direction), and the records that frames
// travel in through them. channel.hpp moves bytes through it; setup.hpp creates and maps it.
//
// Each ring is a power-of-two array of bytes with two running counters, each on a cache line
// of its own: `tail` (bytes the producer has written; only it stores) and `head` (bytes the
// consumer has taken; only it stores). Frames go in as the bytes of the stream, header
// inline, in records that start on cache lines, so a small message is one copy in and one
// copy out, and a large one flows through the ring in pieces as the consumer frees room (a
// pipelined copy). A record's first word is its stamp, which the producer stores last: the
// consumer polls the stamp where the next record will start, not the tail, so a message that
// fits in one line reaches it in one cache line's transfer instead of three. A point-to-point
// frame that goes as one small record (up to 1 KiB with its header) and whose header is plain
// goes compact, its header's zero fields left out (24 bytes instead of 64): one line up to 24
// bytes of payload, a line less above. Each side
// keeps its own counter and the last value it read of the other's in process-local memory,

#include <corocoll/transport/frame.hpp>
#include <corocoll/version.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

namespace detail {

/// "CCSHMSEG": the first word of a segment.
inline constexpr std::uint64_t shm_magic = 0x474553484d534343ull;

// The start of a shared segment; the two rings' bytes follow at `shm_segment::data_offset`.
// Lock-free atomics are address-free, so both processes may map it anywhere.
struct shm_segment {
    std::uint64_t magic = shm_magic;
    std::uint64_t probe = 0;       // the creator's nonce: proves that both map this memory
    std::uint64_t ring_bytes = 0;  // bytes of each ring (a power of two)
    struct alignas(64) flag {
        std::atomic<std::uint32_t> value{0};
    };
    // Side s's reactor may be asleep: the other side wakes it after news for it.
    flag asleep[2];
    struct alignas(64) counter {
        std::atomic<std::uint64_t> value{0};
    };
    // Ring s carries side s's bytes to the other side: its tail (written by side s) and its
    // head (written by the other), each on a line of its own.
    counter tail[2];
    counter head[2];
    // Single copies from side s's memory that the other side has finished, and the number of
    // the one side s gave up waiting for (its buffer may be gone: the copy is void).
    counter copied[2];
    counter withdrawn[2];
    // What side s said last (a header and a text), for the other side to read after the end.
    std::atomic<std::uint32_t> last_words_length[2] = {0, 0};
    char last_words[2][64 + 4096];
    // Whether side s may read the other side's memory (process_vm_readv, probed at set-up).
    std::atomic<std::uint32_t> can_read_peer[2] = {0, 0};
    // Whether side s sleeps on a futex wait on `asleep[s]` (wake it with FUTEX_WAKE) rather
    // than on the socket (wake it with a byte).
    std::atomic<std::uint32_t> futex_sleeper[2] = {0, 0};
    // Whether side s runs a barrier on the other side's processor before it sleeps
    // (io/membarrier.hpp): set once, before side s first sleeps. Where both are set, each side
    // publishes without a fence.
    std::atomic<std::uint32_t> fences_before_sleep[2] = {0, 0};
    std::int32_t pid[2] = {0, 0};

    static constexpr std::size_t data_offset = 16384;
    static std::size_t bytes_for(std::size_t ring_bytes) noexcept {
        return data_offset + 2 * ring_bytes;
    }
    std::byte* ring_data(int s) noexcept;
};
static_assert(sizeof(shm_segment) <= shm_segment::data_offset);

// What a ring carries: records that start on 64-byte lines, each a 16-byte head, then, for
// `inline_bytes`, `length` bytes of the stream; for `single_copy`, a descriptor of `length`
// bytes of the stream that the reader copies straight out of the writer's memory; for
// `compact`, a point-to-point frame's header without its zero fields (`shm_compact`), then
// its payload (`length` counts the 64 bytes of the whole header too). The head's first word,
// the stamp, is stored last (release): the record's place in the stream, mixed with the
// segment's nonce (`stamp_for`), so that nothing an earlier lap left there looks like it.
struct shm_record {
    enum kind_t : std::uint32_t { inline_bytes = 1, single_copy = 2, compact = 3 };
    std::uint64_t stamp = 0;
    std::uint64_t kind_length = 0;  // the kind in the top 8 bits, the length below

    static std::uint64_t pack(kind_t k, std::uint64_t length) noexcept {
        return (std::uint64_t{k} << 56) | length;
    }
    std::uint32_t kind() const noexcept { return static_cast<std::uint32_t>(kind_length >> 56); }
    std::uint64_t length() const noexcept { return kind_length & ((std::uint64_t{1} << 56) - 1); }
};
// A point-to-point frame's header as a compact record carries it (frame_header's other fields
// are what a default header has: no checksum on shared memory).
struct shm_compact {
    std::uint8_t kind = 0;
    std::uint8_t flags = 0;
    std::uint16_t reserved = 0;
    std::uint32_t src = 0;
    std::uint32_t dst = 0;
    std::uint32_t reserved2 = 0;
    std::int64_t tag = 0;
};
inline constexpr std::size_t shm_line = 64;
// Payload bytes a compact record carries within one line.
inline constexpr std::size_t shm_compact_payload = shm_line - 16 - sizeof(shm_compact);
// Payload bytes of the largest compact record: a frame that goes as one small record
// (shm_channel::small_record_bytes, with its 64-byte header).
inline constexpr std::size_t shm_compact_most = 1024 - 64;
struct shm_remote {
    std::uint64_t address = 0;
    std::uint64_t number = 0;  // the writer's count of single copies, this one included
};
static_assert(sizeof(shm_record) == 16 && sizeof(shm_remote) == 16 && sizeof(shm_compact) == 24);
inline constexpr std::size_t pad_line(std::size_t n) noexcept {
    return (n + shm_line - 1) & ~(shm_line - 1);
}
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

}  // namespace detail

}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/shm/impl/segment.ipp>
#endif
