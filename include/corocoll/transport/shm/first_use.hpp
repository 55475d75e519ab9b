#pragma once

// Shared memory for pairs whose connection opens on first use (`connect_mode::lazy`): set-up
// gives a segment only to the pairs it connects (each rank's two ring neighbours), and a pair
// of ranks on one host that first talks later gets its segment then, over the connection its
// first message dialled, by the same hand-over as at set-up (shm/setup.hpp): the lower rank
// creates the segment, passes its descriptor on the higher rank's abstract unix socket and
// tells the nonce over the authenticated TCP connection; the higher rank maps it and answers on
// the unix socket. A rank that never talks to another maps nothing for it, so shared memory
// grows with the pairs that talk, not with the square of the ranks.

#include <corocoll/core/task.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/io/socket.hpp>
#include <corocoll/transport/channel.hpp>
#include <corocoll/transport/shm/setup.hpp>
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
namespace detail {

/// What a rank needs to give a segment to, or take one from, a pair that connects on first use.
struct first_use_shm_options {
    /// Each ring of a pair's segment (engine_options::shm_ring_bytes).
    std::size_t ring_bytes = 0;
    /// engine_options::shm_single_copy_bytes and engine_options::shm_futex_wait.
    std::size_t single_copy_bytes = 0;
    /// See engine_options::shm_futex_wait.
    bool futex_wait = true;
    /// See engine_options::shm_publish_without_fence.
    bool publish_without_fence = true;
    /// The group's name hashed: an intro of another group is a stray.
    std::uint64_t group = 0;
    /// COROCOLL_TRANSPORT of this rank.
    transport_choice mine = transport_choice::automatic;
};

/// One rank's side of the segments that pairs set up on first use. Only the reactor's thread
/// uses it.
class first_use_shm {
public:
    /// Deadlines are points on the steady clock.
    using time_point = std::chrono::steady_clock::time_point;

    /// For rank `rank`, whose pairs with `deferred[p]` set may share memory and were not
    /// connected at set-up; `info` holds every rank's record, `listener` this rank's unix socket
    /// (where lower ranks pass their segments).
    first_use_shm(io::reactor& r, int rank, first_use_shm_options o,
                  std::vector<shm_peer_info> info, std::vector<bool> deferred, fd_guard listener)
        : reactor_(r),
          rank_(rank),
          options_(o),
          info_(std::move(info)),
          deferred_(std::move(deferred)),
          listener_(std::move(listener)) {}

    /// Whether the pair with rank `p` tries shared memory when it connects.
    bool may_share(int p) const noexcept {
        return p >= 0 && static_cast<std::size_t>(p) < deferred_.size() &&
               deferred_[static_cast<std::size_t>(p)];
    }

    /// Over `s`, the pair's TCP connection with rank `p` (handshake and verdict done), hands a
    /// segment over by `deadline`: the pair's shm channel, or null where the pair stays on `s`
    /// (the reason logged). Throws where COROCOLL_TRANSPORT=shm on either rank asks for shared
    /// memory that could not be had, or where `s` fails.
    COROCOLL_DECL task<std::unique_ptr<channel>> share(io::socket& s, int p, time_point deadline,
                                                       std::stop_token stop);

private:
    // A unix connection that reached the listener, and the intro it brought once read.
    struct arrival {
        fd_guard conn;
        time_point since;
        bool read = false;
        shm_intro intro;
        fd_guard memfd;
    };

    COROCOLL_DECL task<std::unique_ptr<channel>> offer(io::socket& s, int p, time_point deadline,
                                                       std::stop_token stop);
    COROCOLL_DECL task<std::unique_ptr<channel>> take(io::socket& s, int p, time_point deadline,
                                                      std::stop_token stop);
    // The arrival with rank `p`'s intro and `nonce`, taken out of those seen; waits for it
    // until `deadline` or `stop`.
    COROCOLL_DECL task<arrival> arrival_of(int p, std::uint64_t nonce, time_point deadline,
                                           std::stop_token stop);
    // Sends (the higher rank) or receives (the lower) the segment's reply on the unix socket
    // `fd` of the pair with rank `p`: false where that end closed; a stop or the deadline
    // throws, naming the pair and the step.
    COROCOLL_DECL task<bool> exchange_reply(int fd, shm_reply& reply, bool send, int p,
                                            time_point deadline, std::stop_token stop);
    // Accepts what waits on the listener and reads the intros that came.
    COROCOLL_DECL void gather_arrivals();
    // Null, with the reason logged; throws where shared memory was required.
    COROCOLL_DECL std::unique_ptr<channel> stay_on_tcp(int p, const std::string& why) const;

    io::reactor& reactor_;
    int rank_;
    first_use_shm_options options_;
    std::vector<shm_peer_info> info_;
    std::vector<bool> deferred_;
    fd_guard listener_;
    std::vector<arrival> arrivals_;
};

}  // namespace detail
}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/shm/impl/first_use.ipp>
#endif
