#pragma once

// The channel to a peer over a TCP socket on the reactor.

#include <corocoll/core/task.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/io/socket.hpp>
#include <corocoll/transport/channel.hpp>
#include <corocoll/version.hpp>

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// A connected socket as a channel. Receives and sends go through the ring; `try_*` make one
/// non-blocking system call.
class tcp_channel final : public channel {
public:
    /// A channel over the connected socket `s`.
    explicit tcp_channel(io::socket s) : sock_(std::move(s)), address_(sock_.peer().to_string()) {}

    /// The channel over `s`, its send buffer sized as `size_send_buffer` says.
    static std::unique_ptr<channel> make(io::socket s, std::size_t same_host_send_buffer);

    const char* kind() const noexcept override { return "tcp"; }
    std::string address() const override { return address_; }

    COROCOLL_DECL std::size_t try_recv(std::span<std::byte> out,
                                       bool may_call_kernel) noexcept override;
    COROCOLL_DECL task<std::size_t> recv_some(std::span<std::byte> out, io::op_options o) override;
    COROCOLL_DECL task<> recv(std::span<std::byte> out, io::op_options o) override;

    COROCOLL_DECL std::size_t try_send(std::span<iovec> iov) noexcept override;
    COROCOLL_DECL task<> send(std::span<iovec> iov, io::op_options o) override;
    COROCOLL_DECL void send_now(std::span<iovec> iov) noexcept override;

    /// Payloads from `hold_bytes` on wait in the socket for their receive
    /// (`engine_options::hold`): the kernel keeps them at no cost of ours and flow control
    /// holds the sender, where buffering one costs an allocation and a copy of it (and, while
    /// it grows, of what came before), and the receive then copies it again. Over TCP on 3-4
    /// ranks of an AMD EPYC, a gather's root spent most of its time in those copies: 4 MiB
    /// took 2.3-4.4 ms a call, held 0.4-0.5 (docs/performance.md, "Early messages over
    /// TCP"). Smaller ones are buffered at once: they cost little, and a held message holds
    /// up every frame behind it.
    bool worth_holding(std::uint64_t bytes) noexcept override { return bytes >= hold_bytes; }
    /// See `worth_holding`.
    static constexpr std::size_t hold_bytes = std::size_t{64} << 10;

    void shutdown() noexcept override { sock_.shutdown(); }
    COROCOLL_DECL task<> close() override;
    /// False after `close`.
    bool is_open() const noexcept override { return sock_.is_open(); }

    /// A send buffer of `bytes` where both ends have the same address (a peer on this host;
    /// see engine_options::same_host_send_buffer); 0 leaves the kernel's autotuning.
    void size_send_buffer(std::size_t bytes) const;

private:
    io::socket sock_;
    std::string address_;
};

}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/tcp/impl/channel.ipp>
#endif
