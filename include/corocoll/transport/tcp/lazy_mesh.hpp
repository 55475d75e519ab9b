#pragma once

// Connections opened on first use (`connect_mode::lazy`): a rank keeps its set-up listener and
// every peer's published address, dials a peer when it first has something to send it, and
// takes the connections its peers dial. The handshake is the mesh's (hello, token proofs both
// ways); one byte after it, the listener's verdict, settles two ranks that dialled each other
// at once: the lower rank's connection wins.

#include <corocoll/core/task.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/io/socket.hpp>
#include <corocoll/transport/channel.hpp>
#include <corocoll/transport/shm/first_use.hpp>
#include <corocoll/transport/tcp/mesh.hpp>
#include <corocoll/version.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// The dialling and answering side of one rank in a group whose TCP connections open on first
/// use. Owned by the engine (`engine::open_on_first_use`), which keeps each peer's state and
/// decides which of two crossing connections a pair keeps.
class lazy_mesh {
public:
    /// Deadlines are points on the steady clock.
    using time_point = std::chrono::steady_clock::time_point;

    /// Over `listener` (published as `here`), with `addresses[p]` where rank p listens.
    lazy_mesh(io::reactor& r, int rank, int size, mesh_options o, io::acceptor listener,
              std::string here, std::vector<std::string> addresses,
              std::size_t same_host_send_buffer)
        : reactor_(r),
          rank_(rank),
          size_(size),
          options_(std::move(o)),
          listener_(std::move(listener)),
          here_(std::move(here)),
          addresses_(std::move(addresses)),
          send_buffer_(same_host_send_buffer) {}

    /// Pairs on this host that set-up left unconnected get a shared segment when they connect
    /// (`shm`'s pairs), their connection carrying its hand-over.
    void share_memory(std::unique_ptr<detail::first_use_shm> shm) noexcept {
        shm_ = std::move(shm);
    }

    /// Where rank `p` listens, as it published it.
    const std::string& address_of(int p) const { return addresses_[static_cast<std::size_t>(p)]; }

    /// Dials rank `p` and runs the handshake (by `deadline`, the handshake within the hello
    /// timeout too) and, for a pair that may share memory, the segment's hand-over: its
    /// channel when `p` took the connection, null when `p` refused it because
    /// its own connection to this rank wins. Throws when `p` cannot be reached (nobody listens
    /// there: the rank is gone) or answers wrongly, naming `p` and its address.
    COROCOLL_DECL task<std::unique_ptr<channel>> dial(int p, time_point deadline,
                                                      std::stop_token stop);

    /// The next connection that reaches the listener (its handshake not run yet). Throws when
    /// stopped or when the listener fails.
    auto accept(std::stop_token stop) {
        return listener_.accept(io::op_options(time_point::max(), std::move(stop)));
    }

    /// Closes the listener: dials from now on are refused.
    void stop_listening() noexcept { listener_.close(); }

    /// The listening side's handshake on accepted `s` (bounded by the hello timeout): the rank
    /// it proved to be. Throws why the connection is refused.
    COROCOLL_DECL task<int> greet(io::socket& s, std::stop_token stop);

    /// Tells the dialer of `s` (rank `p`, greeted) whether this rank takes its connection:
    /// taken, its channel; refused, null (the connection closes).
    COROCOLL_DECL task<std::unique_ptr<channel>> answer(io::socket s, int p, bool take,
                                                        std::stop_token stop);

private:
    io::reactor& reactor_;
    int rank_;
    int size_;
    mesh_options options_;
    io::acceptor listener_;
    std::string here_;
    std::vector<std::string> addresses_;
    std::size_t send_buffer_;
    std::unique_ptr<detail::first_use_shm> shm_;
};

}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/tcp/impl/lazy_mesh.ipp>
#endif
