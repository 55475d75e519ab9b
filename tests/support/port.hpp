#pragma once

// A loopback port number that no other process can take while a test uses it. Test code
// only; not installed.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <system_error>

namespace corocoll_test {

/// A port on 127.0.0.1 held for this test until the object is destroyed, for code that must
/// be given a port number rather than a listener (`tcp://127.0.0.1:<port>`, MASTER_PORT, a
/// server that comes up later, a port nobody listens on).
///
/// It holds a socket bound to the port with SO_REUSEADDR and not listening. Linux then hands
/// the port to nobody else: ephemeral binds and connects skip a bound port, and a bind without
/// SO_REUSEADDR fails. A listener that sets SO_REUSEADDR, as every corocoll listener does, may
/// still bind it and listen, and a connect before that is refused. Binding port 0, closing
/// and using the number later would leave a window in which another process takes it.
/// Costs one socket.
class reserved_port {
public:
    reserved_port() {
        fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd_ < 0) fail("socket");
        int one = 1;
        if (::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) fail("setsockopt");
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) fail("bind");
        socklen_t len = sizeof(a);
        if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) fail("getsockname");
        port_ = ntohs(a.sin_port);
    }
    reserved_port(const reserved_port&) = delete;
    reserved_port& operator=(const reserved_port&) = delete;
    ~reserved_port() { ::close(fd_); }

    /// The port's number.
    std::uint16_t port() const noexcept { return port_; }
    /// "127.0.0.1:<port>".
    std::string host_port() const { return "127.0.0.1:" + std::to_string(port_); }

private:
    [[noreturn]] void fail(const char* what) {
        int err = errno;
        if (fd_ >= 0) ::close(fd_);
        throw std::system_error(err, std::generic_category(),
                                std::string("reserved_port: ") + what);
    }

    int fd_ = -1;
    std::uint16_t port_ = 0;
};

}  // namespace corocoll_test
