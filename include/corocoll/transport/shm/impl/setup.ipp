// The bodies of the non-template functions declared in <corocoll/transport/shm/setup.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/core/cache_sizes.hpp>
#include <corocoll/transport/shm/setup.hpp>

COROCOLL_BEGIN_NAMESPACE

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

COROCOLL_DECL task<segment_offer> offer_segment(io::reactor& r, const std::string& name,
                                                std::size_t ring_bytes, std::uint64_t group,
                                                int rank,
                                                std::chrono::steady_clock::time_point deadline) {
    segment_offer o;
    try {
        o.verdict.nonce = fresh_nonce();
        fd_guard memfd;
        o.map = create_segment(ring_bytes, o.verdict.nonce, memfd);
        o.sock = co_await connect_abstract(r, name, deadline, o.why);
        if (o.sock.fd >= 0) {
            shm_intro intro;
            intro.group = group;
            intro.nonce = o.verdict.nonce;
            intro.map_bytes = o.map.bytes;
            intro.address = reinterpret_cast<std::uintptr_t>(o.map.addr);
            intro.rank = static_cast<std::uint32_t>(rank);
            send_intro(o.sock.fd, memfd.fd, intro);
            o.verdict.offered = offered;
        } else {
            o.verdict.offered = unreachable;
        }
    } catch (const std::system_error& e) {
        o.why = e.what();
        o.verdict.offered = offer_failed;
    }
    if (o.verdict.offered != offered) {
        o.map.reset();
        o.sock.reset();
    }
    co_return o;
}

COROCOLL_DECL shm_reply take_offered(int memfd, const shm_intro& intro, std::uint64_t nonce,
                                     mapping& map, std::string& why) {
    map = map_segment(memfd, intro, nonce, why);
    shm_reply reply;
    if (map.addr != nullptr) {
        auto* seg = static_cast<shm_segment*>(map.addr);
        seg->pid[1] = static_cast<std::int32_t>(::getpid());
        seg->can_read_peer[1].store(can_read(seg->pid[0], intro.address, nonce) ? 1 : 0);
        reply.mapped = 1;
        reply.address = reinterpret_cast<std::uintptr_t>(map.addr);
    }
    return reply;
}

COROCOLL_DECL task<bool> unix_exchange(io::reactor& r, int fd, void* data, std::size_t bytes,
                                       bool send, std::chrono::steady_clock::time_point deadline,
                                       std::stop_token stop) {
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
        co_await r.poll(fd, send ? POLLOUT : POLLIN, io::op_options(deadline, stop));
    }
    co_return true;
}

}  // namespace detail
}  // namespace transport

COROCOLL_END_NAMESPACE
