#pragma once

// Choosing each pair's channel at set-up: the TCP mesh first (every pair has one, and it is
// authenticated), then, for pairs that may share memory, a segment handed over a unix socket.
//
// Evidence, not hostnames: every rank publishes its boot id and the name of an abstract unix
// socket it listens on. For a pair with the same boot id, the lower rank creates a memfd
// segment, writes a fresh nonce into it, connects to the higher rank's socket (abstract
// names are per network namespace, so ranks in different namespaces cannot reach each other
// even on one kernel) and passes the segment's descriptor with SCM_RIGHTS. It tells the
// higher rank the nonce over their TCP connection, which the job token already
// authenticated; the higher rank maps the segment, finds the nonce in it, and says so on the
// unix socket. Only then do both use shared memory; every other outcome leaves them on TCP,
// with the reason logged at INFO. The segment is a memfd: nothing is named in /dev/shm, and
// it is gone once both ranks have unmapped it or died.

#include <corocoll/core/error.hpp>
#include <corocoll/core/log.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/io/socket.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/transport/channel.hpp>
#include <corocoll/transport/frame.hpp>
#include <corocoll/transport/mesh.hpp>
#include <corocoll/transport/shm_arena.hpp>
#include <corocoll/transport/shm_channel.hpp>
#include <corocoll/transport/tcp_channel.hpp>
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
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// How the ranks of a group pick their channels.
struct channel_options {
    /// See `transport_choice`. The default comes from COROCOLL_TRANSPORT (auto when unset).
    transport_choice transport = transport_choice::automatic;
    /// Bytes of each direction's ring of a shared-memory channel (a power of two, at least
    /// 64 KiB).
    std::size_t shm_ring_bytes = std::size_t{1} << 20;
    /// Payloads of at least this many bytes go from the sender's buffer straight into the
    /// receiver's (process_vm_readv) where the receiver may read the sender's memory; 0: never.
    std::size_t shm_single_copy_bytes = 0;
    /// See `engine_options::shm_futex_wait`.
    bool shm_futex_wait = true;
    /// See `engine_options::same_host_send_buffer`.
    std::size_t same_host_send_buffer = std::size_t{256} << 10;
    /// See `engine_options::host_tag`.
    std::string host_tag;
    /// See `engine_options::shm_arena_bytes`.
    std::size_t shm_arena_bytes = std::size_t{1} << 20;
    /// See `engine_options::shm_arena_single_copy_bytes`.
    std::size_t shm_arena_single_copy_bytes = ~std::size_t{0};
};

/// A COROCOLL_TRANSPORT value (`automatic` when empty); anything but auto, tcp and shm is an
/// error naming the variable.
COROCOLL_DECL transport_choice parse_transport(std::string_view v);

/// What COROCOLL_TRANSPORT says (`automatic` when unset); see `parse_transport`.
COROCOLL_DECL transport_choice transport_from_env();

COROCOLL_DECL const char* to_string(transport_choice c) noexcept;

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

// A fresh arena for `ranks` ranks with data sets of `set_bytes`, with `nonce` and the
// group's `single_copy_from` (see shm_arena::single_copy) in it.
COROCOLL_DECL mapping create_arena(int ranks, std::size_t set_bytes, std::uint64_t nonce,
                                   std::size_t single_copy_from, fd_guard& memfd);

// Maps the arena rank 0 passed; empty with `why` when it is not what `intro` says.
COROCOLL_DECL mapping map_arena(int fd, const shm_intro& intro, int ranks, std::string& why);

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

// Sends or receives exactly `bytes` on a non-blocking unix socket within `deadline`.
COROCOLL_DECL task<bool> unix_exchange(io::reactor& r, int fd, void* data, std::size_t bytes,
                                       bool send, std::chrono::steady_clock::time_point deadline);

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
};

}  // namespace detail

/// Builds the group's channels: the TCP mesh (`connect_mesh`), then shared memory for every
/// pair that both allow it and can map one segment (see the top of this file). Every pair's
/// choice is logged at INFO with its reason. With `transport_choice::shm` on either rank of a
/// pair, a pair that cannot share memory fails set-up with an error naming both ranks and the
/// reason. Returns one channel per rank, indexed by rank (null for this rank). When `hosts` is
/// not null it receives every rank's host identity (boot id, network namespace and host tag,
/// as every rank published them: the same on every rank), from which the group's topology is
/// made. When `arena` is not null and every rank is on this host with every pair of this
/// rank on shared memory, it receives the group's arena (see shm_arena.hpp; rank 0 creates it
/// and hands it to the others over their pairs' unix sockets), and "mesh/arena" in `store` is
/// incremented: the group may use the arena only once that count is the group's size.
COROCOLL_DECL task<std::vector<std::unique_ptr<channel>>> connect_channels(
    io::reactor& r, rendezvous::store& store, int rank, int size, mesh_options mo,
    channel_options co, std::vector<std::string>* hosts = nullptr,
    std::unique_ptr<shm_arena>* arena = nullptr);

}  // namespace transport

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace transport {

COROCOLL_DECL transport_choice parse_transport(std::string_view v) {
    if (v.empty() || v == "auto") return transport_choice::automatic;
    if (v == "tcp") return transport_choice::tcp;
    if (v == "shm") return transport_choice::shm;
    throw std::invalid_argument("corocoll: COROCOLL_TRANSPORT='" + std::string(v) +
                                "' is not one of auto, tcp, shm");
}

COROCOLL_DECL transport_choice transport_from_env() {
    const char* text = std::getenv("COROCOLL_TRANSPORT");
    return text == nullptr ? transport_choice::automatic : parse_transport(text);
}

COROCOLL_DECL const char* to_string(transport_choice c) noexcept {
    switch (c) {
        case transport_choice::tcp:
            return "tcp";
        case transport_choice::shm:
            return "shm";
        default:
            return "auto";
    }
}

}  // namespace transport

namespace transport {
namespace detail {

COROCOLL_DECL std::string boot_id() {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string id;
    in >> id;
    return id;
}

COROCOLL_DECL std::string netns_id() {
    struct stat st {};
    if (::stat("/proc/self/ns/net", &st) != 0) return "-";
    return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

COROCOLL_DECL std::uint64_t fresh_nonce() {
    std::random_device rd;
    return (std::uint64_t{rd()} << 32) ^ rd();
}

COROCOLL_DECL fd_guard& fd_guard::operator=(fd_guard&& o) noexcept {
    if (this != &o) {
        reset();
        fd = std::exchange(o.fd, -1);
    }
    return *this;
}

COROCOLL_DECL mapping& mapping::operator=(mapping&& o) noexcept {
    if (this != &o) {
        reset();
        addr = std::exchange(o.addr, nullptr);
        bytes = o.bytes;
    }
    return *this;
}

COROCOLL_DECL sockaddr_un abstract_address(const std::string& name, socklen_t& len) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    // sun_path[0] stays 0: the abstract namespace.
    std::memcpy(a.sun_path + 1, name.data(), std::min(name.size(), sizeof(a.sun_path) - 1));
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    return a;
}

COROCOLL_DECL fd_guard listen_abstract(int backlog, std::string& name) {
    char text[40];
    std::snprintf(text, sizeof(text), "corocoll.%016llx",
                  static_cast<unsigned long long>(fresh_nonce()));
    name = text;
    fd_guard fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (fd.fd < 0) corocoll::detail::throw_errno(errno, "corocoll: init: unix socket");
    socklen_t len = 0;
    sockaddr_un a = abstract_address(name, len);
    if (::bind(fd.fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd.fd, backlog) != 0) {
        corocoll::detail::throw_errno(errno, "corocoll: init: listening on a unix socket");
    }
    return fd;
}

COROCOLL_DECL std::string verdict_text(std::uint32_t v, int lower) {
    std::string who = "rank " + std::to_string(lower);
    if (v == unreachable)
        return who + " cannot reach this rank's unix socket (another network namespace)";
    return who + " could not offer a segment";
}

COROCOLL_DECL bool can_read(int pid, std::uint64_t address, std::uint64_t nonce) noexcept {
    std::uint64_t seen = 0;
    iovec local{&seen, sizeof(seen)};
    iovec remote{reinterpret_cast<void*>(address + offsetof(shm_segment, probe)), sizeof(seen)};
    return ::process_vm_readv(pid, &local, 1, &remote, 1, 0) ==
               static_cast<ssize_t>(sizeof(seen)) &&
           seen == nonce;
}

COROCOLL_DECL mapping create_shared(const char* name, std::size_t bytes, const char* what,
                                    fd_guard& memfd) {
    memfd = fd_guard(::memfd_create(name, MFD_CLOEXEC));
    if (memfd.fd < 0) corocoll::detail::throw_errno(errno, "memfd_create");
    if (::ftruncate(memfd.fd, static_cast<off_t>(bytes)) != 0) {
        corocoll::detail::throw_errno(errno, std::string("ftruncate of the ") + what);
    }
    void* addr =
        ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, memfd.fd, 0);
    if (addr == MAP_FAILED)
        corocoll::detail::throw_errno(errno, std::string("mmap of the ") + what);
    return {addr, bytes};
}

COROCOLL_DECL mapping map_shared(int fd, std::uint64_t bytes, std::size_t least, const char* what,
                                 std::string& why) {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != bytes || bytes < least) {
        why = std::string("the ") + what + "'s size is not what its creator announced";
        return {};
    }
    void* addr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (addr == MAP_FAILED) {
        why = std::string("mmap of the ") + what + ": " + std::strerror(errno);
        return {};
    }
    return {addr, bytes};
}

COROCOLL_DECL mapping create_segment(std::size_t ring_bytes, std::uint64_t nonce, fd_guard& memfd) {
    mapping m = create_shared("corocoll-shm", shm_segment::bytes_for(ring_bytes), "segment", memfd);
    auto* seg = new (m.addr) shm_segment;
    seg->ring_bytes = ring_bytes;
    seg->probe = nonce;
    seg->pid[0] = static_cast<std::int32_t>(::getpid());
    return m;
}

COROCOLL_DECL mapping create_arena(int ranks, std::size_t set_bytes, std::uint64_t nonce,
                                   std::size_t single_copy_from, fd_guard& memfd) {
    mapping m =
        create_shared("corocoll-arena", shm_arena::bytes_for(ranks, set_bytes), "arena", memfd);
    auto* h = new (m.addr) arena_header;
    h->probe = nonce;
    h->ranks = static_cast<std::uint64_t>(ranks);
    h->set_bytes = set_bytes;
    h->single_copy_from = single_copy_from;
    auto* lines = reinterpret_cast<arena_line*>(static_cast<std::byte*>(m.addr) + 128);
    for (int k = 0; k < ranks; ++k) new (&lines[k]) arena_line;
    return m;
}

COROCOLL_DECL mapping map_arena(int fd, const shm_intro& intro, int ranks, std::string& why) {
    mapping m = map_shared(fd, intro.map_bytes, shm_arena::data_offset(ranks), "arena", why);
    if (m.addr == nullptr) return m;
    const auto* h = static_cast<const arena_header*>(m.addr);
    if (h->magic != arena_magic || h->probe != intro.nonce ||
        h->ranks != static_cast<std::uint64_t>(ranks) ||
        shm_arena::bytes_for(ranks, h->set_bytes) != intro.map_bytes) {
        why = "the mapped arena does not hold what rank 0 sent (not the same memory)";
        return {};
    }
    return m;
}

COROCOLL_DECL mapping map_segment(int fd, const shm_intro& intro, std::uint64_t nonce,
                                  std::string& why) {
    mapping m = map_shared(fd, intro.map_bytes, shm_segment::data_offset, "segment", why);
    if (m.addr == nullptr) return m;
    const auto* seg = static_cast<const shm_segment*>(m.addr);
    std::uint64_t ring = seg->ring_bytes;
    if (seg->magic != shm_magic || seg->probe != nonce || ring == 0 || (ring & (ring - 1)) != 0 ||
        shm_segment::bytes_for(ring) != intro.map_bytes) {
        why = "the mapped segment does not hold the nonce its creator sent (not the same memory)";
        return {};
    }
    return m;
}

COROCOLL_DECL intro_message::intro_message(shm_intro& intro) : iov{&intro, sizeof(intro)} {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
}

COROCOLL_DECL void send_intro(int sock, int memfd, shm_intro intro) {
    intro_message m(intro);
    msghdr& msg = m.msg;
    if (memfd >= 0) {
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &memfd, sizeof(int));
    } else {
        msg.msg_control = nullptr;
        msg.msg_controllen = 0;
    }
    if (::sendmsg(sock, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(intro))) {
        corocoll::detail::throw_errno(errno, "sending the segment over the unix socket");
    }
}

COROCOLL_DECL bool recv_intro(int sock, shm_intro& intro, fd_guard& memfd) {
    intro_message m(intro);
    msghdr& msg = m.msg;
    ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n >= 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int fd = -1;
            std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
            memfd = fd_guard(fd);
        }
    }
    return n == static_cast<ssize_t>(sizeof(intro)) && intro.magic == shm_magic && memfd.fd >= 0;
}

COROCOLL_DECL task<fd_guard> connect_abstract(io::reactor& r, const std::string& name,
                                              std::chrono::steady_clock::time_point deadline,
                                              std::string& why) {
    for (;;) {
        fd_guard fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (fd.fd < 0) corocoll::detail::throw_errno(errno, "unix socket");
        socklen_t len = 0;
        sockaddr_un a = abstract_address(name, len);
        if (::connect(fd.fd, reinterpret_cast<sockaddr*>(&a), len) == 0) co_return fd;
        int err = errno;
        // A full backlog: the listener is there and busy; try again shortly.
        if (err == EAGAIN && std::chrono::steady_clock::now() < deadline) {
            co_await r.sleep_for(std::chrono::milliseconds(1));
            continue;
        }
        why = err == ECONNREFUSED || err == ENOENT
                  ? "its unix socket cannot be reached from here (another network namespace)"
                  : std::string("connecting to its unix socket: ") + std::strerror(err);
        co_return fd_guard{};
    }
}

COROCOLL_DECL task<bool> unix_exchange(io::reactor& r, int fd, void* data, std::size_t bytes,
                                       bool send, std::chrono::steady_clock::time_point deadline) {
    auto* p = static_cast<char*>(data);
    while (bytes > 0) {
        ssize_t n = send ? ::send(fd, p, bytes, MSG_DONTWAIT | MSG_NOSIGNAL)
                         : ::recv(fd, p, bytes, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            bytes -= static_cast<std::size_t>(n);
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) co_return false;
        co_await r.poll(fd, send ? POLLOUT : POLLIN, io::op_options(deadline));
    }
    co_return true;
}

}  // namespace detail
}  // namespace transport

namespace transport {
namespace detail {

// The arena's hand-over, on the pairs' unix sockets before the channels take them: rank 0
// offers it to every rank (or says it has none) when every rank is on this host and all its
// pairs share memory; a rank takes it when all its own pairs do too.
COROCOLL_DECL task<> share_arena(io::reactor& r, rendezvous::store& store, int rank, int size,
                                 const mesh_options& mo, const channel_options& co,
                                 const std::vector<std::string>* hosts,
                                 std::vector<pair_plan>& plan, std::uint64_t group,
                                 std::unique_ptr<shm_arena>& arena) {
    auto at = [](int p) { return static_cast<std::size_t>(p); };
    bool one_host = hosts != nullptr && co.shm_arena_bytes > 0;
    bool all_shm = true;
    for (int p = 0; p < size; ++p) {
        if (hosts != nullptr && (*hosts)[at(p)] != (*hosts)[0]) one_host = false;
        if (p != rank && !plan[at(p)].shm) all_shm = false;
    }
    if (!one_host) co_return;
    std::string why;
    mapping map;
    if (rank == 0) {
        fd_guard memfd;
        shm_intro intro;
        intro.group = group;
        intro.rank = 0;
        if (all_shm) {
            intro.nonce = fresh_nonce();
            std::size_t set = (co.shm_arena_bytes + 4095) & ~std::size_t{4095};
            try {
                std::size_t single = co.shm_arena_single_copy_bytes;
                if (single == ~std::size_t{0}) single = size == 2 ? std::size_t{16} << 10 : 0;
                map = create_arena(size, set, intro.nonce, single, memfd);
                intro.map_bytes = map.bytes;
            } catch (const std::system_error& e) {
                why = e.what();
            }
        }
        for (int q = 1; q < size; ++q) {
            if (plan[at(q)].shm) send_intro(plan[at(q)].sock.fd, memfd.fd, intro);
        }
    } else if (plan[0].shm) {
        shm_intro intro;
        fd_guard memfd;
        co_await r.poll(plan[0].sock.fd, POLLIN, io::op_options(mo.deadline, mo.stop));
        if (!recv_intro(plan[0].sock.fd, intro, memfd)) {
            why = intro.map_bytes == 0 ? "rank 0 has no arena to share"
                                       : "rank 0's arena came without its descriptor";
        } else if (intro.group != group) {
            why = "rank 0's arena is another group's";
        } else {
            map = map_arena(memfd.fd, intro, size, why);
        }
    } else {
        why = "no shared memory with rank 0";
    }
    if (map.addr == nullptr || !all_shm) {
        COROCOLL_LOG(info, "INIT", "rank ", rank, ": no shared-memory arena (",
                     !all_shm ? std::string("not every pair shares memory") : why, ")");
        co_return;
    }
    arena = std::make_unique<shm_arena>(map.addr, map.bytes, rank);
    map.addr = nullptr;  // the arena owns it now
    // Whether this rank may read every other's memory (its pairs' probes, process_vm_readv):
    // single copies in the arena need every rank to (counted in "mesh/arena_reads").
    bool reads_all = true;
    for (int p = 0; p < size; ++p) {
        if (p == rank) continue;
        const auto* seg = static_cast<const shm_segment*>(plan[at(p)].map.addr);
        if (seg == nullptr || seg->can_read_peer[p < rank ? 1 : 0].load() == 0) reads_all = false;
    }
    if (reads_all) co_await store.add("mesh/arena_reads", 1);
    co_await store.add("mesh/arena", 1);
}

}  // namespace detail

COROCOLL_DECL task<std::vector<std::unique_ptr<channel>>> connect_channels(
    io::reactor& r, rendezvous::store& store, int rank, int size, mesh_options mo,
    channel_options co, std::vector<std::string>* hosts, std::unique_ptr<shm_arena>* arena) {
    std::vector<io::socket> socks = co_await connect_mesh(r, store, rank, size, mo);
    std::vector<std::unique_ptr<channel>> out(static_cast<std::size_t>(size));
    auto at = [](int p) { return static_cast<std::size_t>(p); };
    std::string my_boot = detail::boot_id();
    if (my_boot.empty()) my_boot = "-";
    std::string my_netns = detail::netns_id();
    // The tag is one word of the record: blanks would split it.
    std::string my_tag = co.host_tag.empty() ? "-" : co.host_tag;
    for (char& ch : my_tag) {
        if (ch == ' ' || ch == '\t' || ch == '\n') ch = '_';
    }
    auto host_key = [](const std::string& boot, const std::string& netns, const std::string& tag) {
        return boot + " " + netns + " " + tag;
    };
    if (hosts != nullptr) hosts->assign(at(size), std::string{});
    if (hosts != nullptr) (*hosts)[at(rank)] = host_key(my_boot, my_netns, my_tag);
    if (size == 1) co_return out;

    std::size_t ring = co.shm_ring_bytes;
    if (ring < (std::size_t{64} << 10) || (ring & (ring - 1)) != 0) {
        throw std::invalid_argument("corocoll: init: shm_ring_bytes " + std::to_string(ring) +
                                    " is not a power of two of at least 64 KiB");
    }
    detail::fd_guard listener;
    std::string my_socket = "-";
    if (co.transport != transport_choice::tcp) listener = detail::listen_abstract(size, my_socket);
    co_await store.set("mesh/shm/" + std::to_string(rank), std::string(to_string(co.transport)) +
                                                               " " + my_boot + " " + my_socket +
                                                               " " + my_netns + " " + my_tag);
    std::vector<std::string> keys;
    for (int p = 0; p < size; ++p) {
        if (p != rank) keys.push_back("mesh/shm/" + std::to_string(p));
    }
    co_await store.wait(keys, std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::max(mo.deadline - std::chrono::steady_clock::now(),
                                           std::chrono::steady_clock::duration{})));
    std::vector<detail::shm_peer_info> info(at(size));
    std::vector<detail::pair_plan> plan(at(size));
    for (int p = 0; p < size; ++p) {
        if (p == rank) continue;
        std::istringstream in(co_await store.get("mesh/shm/" + std::to_string(p)));
        std::string choice;
        in >> choice >> info[at(p)].boot >> info[at(p)].socket_name >> info[at(p)].netns >>
            info[at(p)].tag;
        if (hosts != nullptr) {
            (*hosts)[at(p)] = host_key(info[at(p)].boot, info[at(p)].netns, info[at(p)].tag);
        }
        info[at(p)].choice = choice == "shm"   ? transport_choice::shm
                             : choice == "tcp" ? transport_choice::tcp
                                               : transport_choice::automatic;
        auto& pl = plan[at(p)];
        if (co.transport == transport_choice::tcp || info[at(p)].choice == transport_choice::tcp) {
            pl.why = "COROCOLL_TRANSPORT=tcp on rank " +
                     std::to_string(co.transport == transport_choice::tcp ? rank : p);
        } else if (my_boot == "-" || info[at(p)].boot != my_boot) {
            pl.why = "another host (boot ids differ)";
        } else if (info[at(p)].tag != my_tag) {
            pl.why = "another host (host tags differ: " + my_tag + " and " + info[at(p)].tag + ")";
        } else {
            pl.candidate = true;
        }
    }

    std::uint64_t group = hash64(mo.group_name);
    // Lower side: offer a segment to every higher candidate, then tell each its verdict.
    for (int q = rank + 1; q < size; ++q) {
        auto& pl = plan[at(q)];
        detail::shm_verdict v;
        if (pl.candidate) {
            try {
                pl.nonce = detail::fresh_nonce();
                detail::fd_guard memfd;
                pl.map = detail::create_segment(ring, pl.nonce, memfd);
                pl.sock = co_await detail::connect_abstract(r, info[at(q)].socket_name, mo.deadline,
                                                            pl.why);
                if (pl.sock.fd >= 0) {
                    detail::shm_intro intro;
                    intro.group = group;
                    intro.nonce = pl.nonce;
                    intro.map_bytes = pl.map.bytes;
                    intro.address = reinterpret_cast<std::uintptr_t>(pl.map.addr);
                    intro.rank = static_cast<std::uint32_t>(rank);
                    detail::send_intro(pl.sock.fd, memfd.fd, intro);
                    v.offered = detail::offered;
                    v.nonce = pl.nonce;
                } else {
                    v.offered = detail::unreachable;
                }
            } catch (const std::system_error& e) {
                pl.why = e.what();
                v.offered = detail::offer_failed;
            }
            if (v.offered != detail::offered) {
                pl.map.reset();
                pl.sock.reset();
            }
        }
        co_await socks[at(q)].send(std::as_bytes(std::span(&v, 1)), mo.deadline);
    }
    // Higher side: read each lower rank's verdict, then take the segments offered.
    int offered = 0;
    for (int p = 0; p < rank; ++p) {
        detail::shm_verdict v;
        co_await socks[at(p)].recv(std::as_writable_bytes(std::span(&v, 1)), mo.deadline);
        if (v.magic != detail::shm_verdict{}.magic) {
            corocoll::detail::throw_error(
                corocoll::errc::protocol_error,
                "corocoll: init: rank " + std::to_string(p) + " sent no channel verdict");
        }
        auto& pl = plan[at(p)];
        if (v.offered == detail::offered) {
            pl.nonce = v.nonce;
            pl.candidate = true;
            ++offered;
        } else if (pl.candidate) {
            pl.candidate = false;
            pl.why = detail::verdict_text(v.offered, p);
        }
    }
    while (offered > 0) {
        try {
            co_await r.poll(listener.fd, POLLIN, io::op_options(mo.deadline, mo.stop));
        } catch (const std::system_error& e) {
            corocoll::detail::throw_error(
                e.code(), "corocoll: init: rank " + std::to_string(rank) + " waited for " +
                              std::to_string(offered) +
                              " shared-memory segment(s) from lower ranks: " +
                              corocoll::detail::context_of(e));
        }
        detail::fd_guard conn(
            ::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (conn.fd < 0) continue;
        // A rank sends its intro as it connects: a connection that says nothing for a few
        // seconds is a stray, dropped without stalling set-up.
        try {
            co_await r.poll(
                conn.fd, POLLIN,
                io::op_options(std::min(mo.deadline, io::deadline_after(std::chrono::seconds(5)))));
        } catch (const std::system_error&) {
            COROCOLL_LOG(warn, "INIT", "rank ", rank,
                         " drops a connection to its unix socket that sent nothing");
            continue;
        }
        detail::shm_intro intro;
        detail::fd_guard memfd;
        bool ok = detail::recv_intro(conn.fd, intro, memfd);
        auto p = static_cast<int>(intro.rank);
        if (!ok || intro.group != group || p < 0 || p >= rank || !plan[at(p)].candidate ||
            plan[at(p)].sock.fd >= 0 || intro.nonce != plan[at(p)].nonce) {
            COROCOLL_LOG(warn, "INIT", "rank ", rank,
                         " drops a stray connection to its unix socket");
            continue;
        }
        auto& pl = plan[at(p)];
        pl.map = detail::map_segment(memfd.fd, intro, pl.nonce, pl.why);
        detail::shm_reply reply;
        if (pl.map.addr != nullptr) {
            auto* seg = static_cast<detail::shm_segment*>(pl.map.addr);
            seg->pid[1] = static_cast<std::int32_t>(::getpid());
            seg->can_read_peer[1].store(detail::can_read(seg->pid[0], intro.address, pl.nonce) ? 1
                                                                                               : 0);
            reply.mapped = 1;
            reply.address = reinterpret_cast<std::uintptr_t>(pl.map.addr);
        }
        pl.sock = std::move(conn);
        if (!co_await detail::unix_exchange(r, pl.sock.fd, &reply, sizeof(reply), true,
                                            mo.deadline)) {
            pl.map.reset();
            if (pl.why.empty()) pl.why = "rank " + std::to_string(p) + " left during set-up";
        }
        pl.shm = pl.map.addr != nullptr;
        --offered;
    }
    // Lower side again: the higher ranks' answers.
    for (int q = rank + 1; q < size; ++q) {
        auto& pl = plan[at(q)];
        if (pl.sock.fd < 0) continue;
        detail::shm_reply reply;
        if (!co_await detail::unix_exchange(r, pl.sock.fd, &reply, sizeof(reply), false,
                                            mo.deadline) ||
            reply.mapped != 1) {
            pl.why = "rank " + std::to_string(q) + " could not map the segment";
            pl.map.reset();
            continue;
        }
        auto* seg = static_cast<detail::shm_segment*>(pl.map.addr);
        seg->can_read_peer[0].store(detail::can_read(seg->pid[1], reply.address, pl.nonce) ? 1 : 0);
        pl.shm = true;
    }
    listener.reset();
    if (arena != nullptr) {
        co_await share_arena(r, store, rank, size, mo, co, hosts, plan, group, *arena);
    }

    for (int p = 0; p < size; ++p) {
        if (p == rank) continue;
        auto& pl = plan[at(p)];
        std::string pair = "rank " + std::to_string(rank) + " - rank " + std::to_string(p);
        if (!pl.shm) {
            if (co.transport == transport_choice::shm ||
                info[at(p)].choice == transport_choice::shm) {
                if (pl.why.empty()) pl.why = "the segment could not be shared";
                corocoll::detail::throw_error(
                    std::make_error_code(std::errc::operation_not_supported),
                    "corocoll: init: " + pair +
                        " cannot use shared memory, which COROCOLL_TRANSPORT=shm asks for: " +
                        pl.why);
            }
            COROCOLL_LOG(info, "INIT", pair, ": tcp (", pl.why, ")");
            out[at(p)] = tcp_channel::make(std::move(socks[at(p)]), co.same_host_send_buffer);
            continue;
        }
        int side = p < rank ? 1 : 0;
        auto* seg = static_cast<detail::shm_segment*>(pl.map.addr);
        // The creator has both probes' results; single copies need the reader to see the
        // writer's memory.
        std::string copies;
        if (co.shm_single_copy_bytes == 0) {
            copies = "; single copies off";
        } else if (side == 0) {
            bool in = seg->can_read_peer[0].load() != 0, out = seg->can_read_peer[1].load() != 0;
            copies = in && out ? "; single copies both ways"
                     : in      ? "; single copies only to this rank"
                     : out     ? "; single copies only from this rank"
                               : "; no single copies (process_vm_readv refused)";
        }
        socks[at(p)].close();
        auto ch =
            std::make_unique<shm_channel>(r, side, pl.map.addr, pl.map.bytes, pl.sock.release(),
                                          co.shm_single_copy_bytes, co.shm_futex_wait);
        COROCOLL_LOG(info, "INIT", pair, ": shm (same boot id, one segment mapped by both", copies,
                     "; sleeps on a ", ch->sleeps_on(), ")");
        out[at(p)] = std::move(ch);
        pl.map.addr = nullptr;  // the channel owns it now
    }
    co_return out;
}

}  // namespace transport

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
