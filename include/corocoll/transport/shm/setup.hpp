#pragma once

// Handing a shared segment from one rank to another at set-up (phases 4-7 of
// transport/setup.hpp): the lower rank of a pair creates a memfd segment, writes a fresh nonce
// into it and passes its descriptor (SCM_RIGHTS) over an abstract unix socket of the higher
// rank (abstract names are per network namespace, so ranks in different namespaces cannot
// reach each other even on one kernel). It tells the higher rank the nonce over their TCP
// connection, which the job token already authenticated; the higher rank maps the segment,
// finds the nonce in it, and says so on the unix socket. Only then do both use shared memory;
// every other outcome leaves them on TCP, with the reason logged at INFO. The segment is a
// memfd: nothing is named in /dev/shm, and it is gone once both ranks have unmapped it or
// died. The group's arena goes to the others the same way (shm/arena_setup.hpp).

#include <corocoll/core/error.hpp>
#include <corocoll/core/log.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/io/socket.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/transport/channel.hpp>
#include <corocoll/transport/frame.hpp>
#include <corocoll/transport/shm/segment.hpp>
#include <corocoll/transport/tcp/mesh.hpp>
#include <corocoll/version.hpp>

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <random>
#include <sstream>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

namespace detail {

COROCOLL_DECL std::string boot_id();

// This process's network namespace ("net:[4026531840]"'s number), or "-" where /proc does not
// say.
COROCOLL_DECL std::string netns_id();

COROCOLL_DECL std::uint64_t fresh_nonce();

// An owned descriptor.
struct fd_guard {
    int fd = -1;
    fd_guard() = default;
    explicit fd_guard(int f) noexcept : fd(f) {}
    fd_guard(fd_guard&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
    fd_guard& operator=(fd_guard&& o) noexcept;
    ~fd_guard() { reset(); }
    void reset() noexcept {
        if (fd >= 0) ::close(std::exchange(fd, -1));
    }
    int release() noexcept { return std::exchange(fd, -1); }
};

// A mapping of a segment, unmapped unless released.
struct mapping {
    void* addr = nullptr;
    std::size_t bytes = 0;
    mapping() = default;
    mapping(void* a, std::size_t b) noexcept : addr(a), bytes(b) {}
    mapping(mapping&& o) noexcept : addr(std::exchange(o.addr, nullptr)), bytes(o.bytes) {}
    mapping& operator=(mapping&& o) noexcept;
    ~mapping() { reset(); }
    void reset() noexcept {
        if (addr != nullptr) ::munmap(std::exchange(addr, nullptr), bytes);
    }
};

COROCOLL_DECL sockaddr_un abstract_address(const std::string& name, socklen_t& len);

// Listens on a fresh abstract unix socket; its name goes to the store.
COROCOLL_DECL fd_guard listen_abstract(int backlog, std::string& name);

// What the lower rank of a pair says over TCP: whether it offers a segment, and its nonce.
struct shm_verdict {
    std::uint32_t magic = 0x4d485343;  // "CSHM"
    // 1: a segment is offered; otherwise why not (see `verdict_text`).
    std::uint32_t offered = 0;
    std::uint64_t nonce = 0;
};
enum : std::uint32_t { not_offered = 0, offered = 1, unreachable = 2, offer_failed = 3 };

COROCOLL_DECL std::string verdict_text(std::uint32_t v, int lower);

// What comes with the segment's descriptor on the unix socket.
struct shm_intro {
    std::uint64_t magic = shm_magic;
    std::uint64_t group = 0;
    std::uint64_t nonce = 0;
    std::uint64_t map_bytes = 0;
    std::uint64_t address = 0;  // where the creator mapped the segment (for the probe)
    std::uint32_t rank = 0;
    std::uint32_t reserved = 0;
};
// What the higher rank answers on the unix socket.
struct shm_reply {
    std::uint64_t mapped = 0;
    std::uint64_t address = 0;  // where it mapped the segment (for the creator's probe)
};

// Whether this process may read process `pid`'s memory at `address`, where a segment holding
// `nonce` is mapped (process_vm_readv: ptrace access, the same pid namespace).
COROCOLL_DECL bool can_read(int pid, std::uint64_t address, std::uint64_t nonce) noexcept;

// A fresh memfd named `name` of `bytes`, mapped shared and populated (`memfd` keeps it open);
// errors name `what` ("segment", "arena").
COROCOLL_DECL mapping create_shared(const char* name, std::size_t bytes, const char* what,
                                    fd_guard& memfd);

// Maps `fd` whole when its size is `bytes` (and at least `least`); empty with `why` when it is
// not, or when mmap refuses.
COROCOLL_DECL mapping map_shared(int fd, std::uint64_t bytes, std::size_t least, const char* what,
                                 std::string& why);

// A fresh segment of two rings of `ring_bytes`, with `nonce` in it.
COROCOLL_DECL mapping create_segment(std::size_t ring_bytes, std::uint64_t nonce, fd_guard& memfd);

// Maps the segment the lower rank passed; empty with `why` when it is not what it should be.
COROCOLL_DECL mapping map_segment(int fd, const shm_intro& intro, std::uint64_t nonce,
                                  std::string& why);

// A message of one intro with room for one descriptor beside it (SCM_RIGHTS).
struct intro_message {
    iovec iov;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))]{};
    msghdr msg{};
    explicit intro_message(shm_intro& intro);
    intro_message(const intro_message&) = delete;
    intro_message& operator=(const intro_message&) = delete;
};

// Sends `intro` with `memfd` beside it (none when -1).
COROCOLL_DECL void send_intro(int sock, int memfd, shm_intro intro);

// Reads an intro and the descriptor that came with it (-1 when none did); false when what
// arrived is not an intro.
COROCOLL_DECL bool recv_intro(int sock, shm_intro& intro, fd_guard& memfd);

// Connects to the abstract unix socket `name`; an empty guard with `why` when it is not there.
COROCOLL_DECL task<fd_guard> connect_abstract(io::reactor& r, const std::string& name,
                                              std::chrono::steady_clock::time_point deadline,
                                              std::string& why);

// Sends or receives exactly `bytes` on a non-blocking unix socket within `deadline`; false
// where the other end closed or failed. A stop (a group that failed meanwhile) or the deadline
// throws (operation_canceled, timed_out).
COROCOLL_DECL task<bool> unix_exchange(io::reactor& r, int fd, void* data, std::size_t bytes,
                                       bool send, std::chrono::steady_clock::time_point deadline,
                                       std::stop_token stop = {});

// The lower side's offer to the rank whose unix socket is `name`: a fresh segment of
// `ring_bytes` with a fresh nonce, its descriptor and intro (`group`, from `rank`) passed on
// that socket. `verdict` is what to tell the higher rank over TCP: offered (with the nonce),
// unreachable or offer_failed, the reason in `why`.
struct segment_offer {
    shm_verdict verdict;
    mapping map;
    fd_guard sock;
    std::string why;
};
COROCOLL_DECL task<segment_offer> offer_segment(io::reactor& r, const std::string& name,
                                                std::size_t ring_bytes, std::uint64_t group,
                                                int rank,
                                                std::chrono::steady_clock::time_point deadline);

// The higher side: maps the segment `memfd` that `intro` brought into `map`, finds `nonce` in
// it, writes this process into it and probes whether this process may read the creator's
// memory. The reply to send on the unix socket: mapped 0, with `why`, where it could not.
COROCOLL_DECL shm_reply take_offered(int memfd, const shm_intro& intro, std::uint64_t nonce,
                                     mapping& map, std::string& why);

struct shm_peer_info {
    transport_choice choice = transport_choice::tcp;
    std::string boot;
    std::string socket_name;
    std::string netns;
    std::string tag;  // engine_options::host_tag, "-" for none
};

// One pair's outcome on this side.
struct pair_plan {
    bool candidate = false;
    std::string why;  // why not shm (empty when shm)
    mapping map;
    fd_guard sock;
    std::uint64_t nonce = 0;
    bool shm = false;
    // A candidate that set-up leaves unconnected (connections on first use): its segment comes
    // when the pair first connects.
    bool deferred = false;
};

}  // namespace detail

}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/shm/impl/setup.ipp>
#endif
