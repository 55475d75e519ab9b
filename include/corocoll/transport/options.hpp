#pragma once

// The settings of a group's transport: those of its set-up (which channel each pair gets, the
// rings, the arena, the send buffers, the host tag) and those of its engine (message and
// buffering limits, the hold of early messages, the stall checks). One struct,
// `engine_options`, that `init_options::limits` carries to both.

#include <corocoll/transport/channel.hpp>
#include <corocoll/version.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// A short name held inline (at most `capacity` bytes): what `engine_options::host_tag` holds,
/// so that engine_options stays trivially copyable. g++ 12 copies an aggregate made in a
/// `co_await` expression (`co_await build_group(..., {}, ...)`) into the coroutine's frame
/// bit for bit, which a std::string member does not survive (its buffer pointer still points
/// at the temporary): see docs/architecture.md, "Compiler workarounds".
class inline_name {
public:
    /// The longest name it holds.
    static constexpr std::size_t capacity = 63;
    /// Empty.
    constexpr inline_name() noexcept = default;
    /// Holds `name`; a longer one than `capacity` throws `std::invalid_argument`.
    inline_name(std::string_view name) {  // NOLINT(google-explicit-constructor): a string stands in
        if (name.size() > capacity) {
            throw std::invalid_argument("corocoll: engine_options::host_tag '" + std::string(name) +
                                        "' is longer than " + std::to_string(capacity) + " bytes");
        }
        std::memcpy(text_, name.data(), name.size());
        size_ = static_cast<unsigned char>(name.size());
    }
    /// Holds `name` (see the string_view form).
    inline_name(const char* name) : inline_name(std::string_view(name)) {}  // NOLINT: as above
    /// Holds `name` (see the string_view form).
    inline_name(const std::string& name) : inline_name(std::string_view(name)) {}  // NOLINT
    /// The name.
    std::string_view view() const noexcept { return {text_, size_}; }
    /// True when no name is held.
    bool empty() const noexcept { return size_ == 0; }

private:
    char text_[capacity] = {};
    unsigned char size_ = 0;
};

/// When the connections of a group open (TCP, and the shared-memory segments of pairs on one
/// host).
enum class connect_mode {
    /// All at set-up, a full mesh: every pair proven before the first call (n - 1 connections
    /// and, on one host, n - 1 segments of 2 x `shm_ring_bytes` per rank).
    eager,
    /// On first use, the default: set-up publishes where each rank listens and connects only
    /// each rank's two neighbours on the ring of ranks; a rank dials a peer when it first sends
    /// to it or posts a receive from it (a message, a collective step, a status question), and
    /// a pair on one host maps its segment then. A ring at n ranks opens 2 connections per
    /// rank, not n - 1.
    lazy,
};

/// Limits of the point-to-point engine. Trivially copyable (see `inline_name`).
struct engine_options {
    /// The largest message a peer may announce; a larger header fails the group (1 TiB).
    std::uint64_t max_message_bytes = std::uint64_t{1} << 40;
    /// Unexpected messages (arrived before a matching receive was posted) buffered per peer.
    /// Past this bound the peer's connection is not read until a matching receive is posted:
    /// TCP flow control then holds the sender back. A message is never dropped.
    std::size_t unexpected_bytes_per_peer = std::size_t{64} << 20;
    /// SO_SNDBUF for connections whose two ends have the same address (peers on this host;
    /// the kernel doubles it). A small send buffer keeps what a sender writes in the caches
    /// until the receiver copies it out (docs/performance.md, "Why the defaults").
    /// Connections to other hosts keep autotuning, which a long network path needs. 0:
    /// autotuning everywhere.
    std::size_t same_host_send_buffer = std::size_t{256} << 10;
    /// Which channel each pair of ranks gets at set-up (see `transport_choice`); unset:
    /// COROCOLL_TRANSPORT, auto when that is unset too.
    std::optional<transport_choice> transport;
    /// When the connections between ranks open (see `connect_mode`); unset: COROCOLL_CONNECT,
    /// lazy (on first use) when that is unset too.
    std::optional<connect_mode> connect;
    /// Bytes of each direction's ring of a shared-memory channel (a power of two, at least
    /// 64 KiB).
    std::size_t shm_ring_bytes = std::size_t{1} << 20;
    /// Payloads of at least this many bytes travel between ranks that share memory as one
    /// copy from the sender's buffer to the receiver's (process_vm_readv, where the kernel
    /// allows it); 0: always through the ring, two copies that the two ranks make at once.
    /// Off by default: process_vm_readv measured slower than the ring, whose two copies the
    /// two ranks make at once (docs/performance.md, "Why the defaults").
    std::size_t shm_single_copy_bytes = 0;
    /// Bytes of each of the two data sets of the arena that a group whose ranks all share
    /// one host maps (transport/shm/arena.hpp), where its shared-memory collectives put their
    /// data; the arena maps twice this plus each rank's step lines (130 KiB a rank in groups of
    /// up to 8 ranks, 33 KiB beyond: `shm_arena::rank_bytes`). 0: no arena (no shared-memory
    /// collectives).
    std::size_t shm_arena_bytes = std::size_t{1} << 20;
    /// `shm_arena_single_copy_bytes`' default, by the group's size and the call: every call
    /// from 16 KiB in a group of 2 ranks, but all_gather from blocks of 8 KiB and all_reduce
    /// from a buffer the size of the L2 (rank 0's; 2 MiB where not known; all_reduce on 2 ranks
    /// only, whatever this option says); in groups of 3 to 8,
    /// scatter from blocks of 64 KiB and all_to_all from blocks of 24 KiB, the others never
    /// (measured slower there); none beyond 8 ranks. Where a process_vm_readv is slow (1 µs or
    /// more before it copies a byte: a VM that traps system calls) these sizes grow with the L2,
    /// 2-rank all_to_all makes them only from blocks of half the L2 to blocks of 8 L2s, and
    /// 2-rank all_gather and all_reduce, and all_to_all of 3 to 8 ranks, make none
    /// (docs/performance.md, "Why the defaults", "Single copies of scatter and all_to_all on 3 to
    /// 8 ranks", "No single copies both ways where a process_vm_readv is slow", "No single
    /// copies of all_to_all on 3 to 8 ranks where ..." and "Single copies of all_to_all of 2
    /// ranks between half the L2 and 8 L2s where ..."; transport::detail::single_copy_from_for
    /// and single_copy_below_for).
    static constexpr std::size_t automatic_single_copy = ~std::size_t{0};
    /// From this many bytes (of the buffer a rank brings: a broadcast's or an all_reduce's, one
    /// block of an all_gather, gather, scatter or all_to_all) the arena's calls copy straight from
    /// the other ranks' buffers (process_vm_readv, one copy instead of two through the arena),
    /// where every rank may read every other's memory (probed at set-up). Rank 0's value holds
    /// for the group. 0: never; `automatic_single_copy`: by the group's size and the call.
    std::size_t shm_arena_single_copy_bytes = automatic_single_copy;
    /// A rank that waits on a shared-memory channel and has polled for its busy-poll time
    /// sleeps in its ring on an io_uring futex wait, which the peer ends with one FUTEX_WAKE,
    /// where the kernel has IORING_OP_FUTEX_WAIT (Linux 6.7, probed at run time); false, or
    /// an older kernel: it sleeps on a receive on the pair's socket, which the peer ends by
    /// sending one byte. Likewise at a step of the group's shared arena: it sleeps until the
    /// rank it waits for arrives, which wakes it (false, or an older kernel: it pauses
    /// between looks, at most 500 µs; shm_arena::sleep_on_futex).
    bool shm_futex_wait = true;
    /// A shared-memory channel's writer publishes what it wrote (and its reader the room it
    /// freed) with a plain store and a look at the peer's sleep flag, without a full fence,
    /// where both processes are registered for membarrier(2)'s global expedited barrier (Linux
    /// 4.16, probed at run time): a side about to sleep pays instead, one membarrier call
    /// between raising its flag and its last look (io/membarrier.hpp). false, or a kernel
    /// without it: every publish is a sequentially consistent store (a full fence, which waits
    /// for the message's lines to be owned before the writer goes on).
    bool shm_publish_without_fence = true;
    /// How long a large message that arrives before its receive is left in its channel
    /// (shared memory from 1 KiB: the sender waiting for room, or for its single copy; TCP
    /// from 64 KiB: the socket's buffer, flow control holding the sender; see
    /// `channel::worth_holding`) before it is buffered like any early message. Held, it goes
    /// straight into the receive when that comes; the bound keeps a program whose ranks all send
    /// before they receive from stalling. A receive from that peer that the held message does
    /// not match ends the hold at once (and one already waiting keeps it from starting): it
    /// may need what is behind. Once a hold runs out, the messages behind it from that peer
    /// are buffered at once until a receive from it has to wait for its message: what comes
    /// behind them waits out one hold, not one per message. 0: buffer at once.
    std::chrono::microseconds hold{1000};
    /// The same bound for a collective's message. A collective's ranks post their receives
    /// as they send, so a collective message that comes first is nearly always the next call's
    /// (or the next step's), sent while this rank still works on the one before, whose
    /// messages from that peer all came before it: holding it blocks nothing this rank waits
    /// for, and at 64 MiB the call before takes tens of milliseconds. Well inside the status
    /// rounds' answer window (at least 1 s; at most a quarter of it is used), which a status
    /// answer behind a held message waits out. 0: `hold`.
    std::chrono::microseconds collective_hold{250'000};
    /// When the receives of this rank have waited this long without a frame arriving, the
    /// ranks compare notes (see `engine`): a rank that does not answer, or ranks whose calls
    /// differ, fail the group now; a slow but consistent group is reported at WARN and waits
    /// on. Unset: COROCOLL_STALL_S (seconds), 60 s when that is unset too; 0: never.
    std::optional<std::chrono::milliseconds> stall;
    /// How long a rank that compares notes waits for the answers; a rank that has not
    /// answered by then is taken to be stopped. Unset: a quarter of the stall interval,
    /// between 1 and 10 s (3 s without stall checks).
    std::optional<std::chrono::milliseconds> answer_window;
    /// Splits this machine into hosts of the tag's name: ranks whose tags differ count as
    /// different hosts (they talk over TCP, and the group's topology puts them apart), even
    /// with one boot id and network namespace. Ranks never count as one host by their tags
    /// alone. For tests that lay out several hosts on one machine, and for jobs that want
    /// ranks kept apart (one tag per NUMA node). Empty: the boot id and network namespace
    /// decide. Blanks in it are read as '_'.
    inline_name host_tag;
};
static_assert(std::is_trivially_copyable_v<engine_options>,
              "engine_options must stay trivially copyable (see inline_name)");

/// The stall interval that a COROCOLL_STALL_S value `v` asks for (seconds, a number >= 0;
/// 0: no stall checks), 60 s for null or empty. A value that is not such a number is refused,
/// naming the variable.
COROCOLL_DECL std::chrono::milliseconds parse_stall(const char* v);

/// The stall interval from COROCOLL_STALL_S (see `parse_stall`).
inline std::chrono::milliseconds stall_from_env() {
    return parse_stall(std::getenv("COROCOLL_STALL_S"));
}

/// A COROCOLL_TRANSPORT value (`automatic` when empty); anything but auto, tcp and shm is an
/// error naming the variable.
COROCOLL_DECL transport_choice parse_transport(std::string_view v);

/// What COROCOLL_TRANSPORT says (`automatic` when unset); see `parse_transport`.
COROCOLL_DECL transport_choice transport_from_env();

COROCOLL_DECL const char* to_string(transport_choice c) noexcept;

/// A COROCOLL_CONNECT value (`lazy` when empty); anything but eager and lazy is an error
/// naming the variable.
COROCOLL_DECL connect_mode parse_connect(std::string_view v);

/// What COROCOLL_CONNECT says (`lazy` when unset); see `parse_connect`.
COROCOLL_DECL connect_mode connect_from_env();

}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/impl/options.ipp>
#endif
