#pragma once

// Building a group's channels: the TCP mesh first (every pair has one, and it is
// authenticated), then shared memory for the pairs that can map one segment, then the
// group's arena when every rank is on one host. The phases, in order (each one a function
// of impl/setup.ipp, every rank running them together):
//
//   1. mesh          connect_mesh (tcp/mesh.hpp): one authenticated TCP socket per pair.
//   2. records       every rank publishes its host identity, its transport choice and the
//                    name of an abstract unix socket, and reads the others'.
//   3. plan          each pair is a shared-memory candidate when both allow it and the
//                    records say one host (same boot id and host tag); otherwise the reason.
//   4. offers        the lower rank of each candidate pair creates a segment, connects to
//                    the higher rank's unix socket and passes it (SCM_RIGHTS), then sends
//                    its verdict over the pair's TCP socket (authenticated by the job token).
//   5. takes         the higher rank reads the verdicts, accepts the offered segments, checks
//                    each one's nonce and answers on the unix socket.
//   6. answers       the lower rank reads the answers; a pair both of whose ranks mapped the
//                    segment uses shared memory.
//   7. arena         (shm/arena_setup.hpp) rank 0 hands the group's arena to every rank.
//   8. channels      one `shm_channel` or `tcp_channel` per pair, each choice logged at INFO.
//
// Shared memory is decided by evidence, not hostnames; the segment handover itself (memfd,
// SCM_RIGHTS, the process_vm_readv probe) is shm/setup.hpp's.

#include <corocoll/core/task.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/transport/channel.hpp>
#include <corocoll/transport/options.hpp>
#include <corocoll/transport/shm/arena.hpp>
#include <corocoll/transport/shm/arena_setup.hpp>
#include <corocoll/transport/shm/channel.hpp>
#include <corocoll/transport/shm/setup.hpp>
#include <corocoll/transport/tcp/channel.hpp>
#include <corocoll/transport/tcp/lazy_mesh.hpp>
#include <corocoll/transport/tcp/mesh.hpp>
#include <corocoll/version.hpp>

#include <memory>
#include <string>
#include <system_error>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace transport {

/// Builds the group's channels (the phases at the top of this file) with the set-up settings
/// of `o` (the transport, the rings, the arena, the send buffer, the host tag). Every pair's
/// choice is logged at INFO with its reason. With `transport_choice::shm` on either rank of a
/// pair, a pair that cannot share memory fails set-up with an error naming both ranks and the
/// reason. Returns one channel per rank, indexed by rank (null for this rank). When `hosts` is
/// not null it receives every rank's host identity (boot id, network namespace and host tag,
/// as every rank published them: the same on every rank), from which the group's topology is
/// made. When `arena` is not null and every rank is on this host with every pair of this
/// rank on shared memory, it receives the group's arena (see shm/arena.hpp; rank 0 creates it
/// and hands it to the others over their pairs' unix sockets), and "mesh/arena" in `store` is
/// incremented: the group may use the arena only once that count is the group's size.
/// When `lazy` is not null and the options (or COROCOLL_CONNECT) say `connect_mode::lazy`,
/// only the pairs that may share memory connect here; the others' channels stay null and
/// `lazy` receives what opens them on first use (`engine::open_on_first_use`).
COROCOLL_DECL task<std::vector<std::unique_ptr<channel>>> connect_channels(
    io::reactor& r, rendezvous::store& store, int rank, int size, mesh_options mo, engine_options o,
    std::vector<std::string>* hosts = nullptr, std::unique_ptr<shm_arena>* arena = nullptr,
    std::unique_ptr<lazy_mesh>* lazy = nullptr);

}  // namespace transport

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/transport/impl/setup.ipp>
#endif
