#pragma once

// Setting groups up: init_process_group's options, the rendezvous every backend starts from
// (rank, world size, the store), the mesh and start-up barrier every group shares, and
// new_group/split. Included at the end of process_group.hpp.

#include <corocoll/core/log.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/io/endpoint.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/process_group/environment.hpp>
#include <corocoll/process_group/parent_watch.hpp>
#include <corocoll/process_group/process_group.hpp>
#include <corocoll/rendezvous/file_store.hpp>
#include <corocoll/rendezvous/launch_env.hpp>
#include <corocoll/rendezvous/prefix_store.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/rendezvous/tcp_store.hpp>
#include <corocoll/transport/engine.hpp>
#include <corocoll/transport/setup.hpp>
#include <corocoll/transport/tcp/mesh.hpp>
#include <corocoll/version.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

/// How `init_process_group` sets a group up; every field has torch's default.
struct init_options {
    /// "tcp" (CPU tensors over TCP; "gloo" and "cpu" are accepted as names for it).
    std::string backend = "tcp";
    /// "env://" (launcher variables, MASTER_ADDR/MASTER_PORT), "tcp://host:port" or
    /// "file:///path". Ignored when `store` is given.
    std::string init_method = "env://";
    /// -1: from the launcher's environment.
    int world_size = -1;
    /// -1: from the launcher's environment.
    int rank = -1;
    /// Deadline of set-up and default deadline of every operation: COROCOLL_TIMEOUT seconds
    /// when that is set, else c10d's 30 minutes.
    std::chrono::milliseconds timeout = detail::default_timeout();
    /// A store to rendezvous through instead of `init_method` (rank and world_size required).
    std::shared_ptr<rendezvous::store> store;
    /// With `store`: where its server listens, if it has one, so that this rank listens on
    /// the interface that reaches it, as with env:// (none: loopback, unless
    /// COROCOLL_SOCKET_IFNAME names one).
    std::optional<io::endpoint> store_address;
    /// Groups with different names keep apart in one store.
    std::string group_name = "default";
    /// Transport limits and knobs (transport, stall reports, early-message budget); defaults from
    /// COROCOLL_* variables.
    transport::engine_options limits;
};

namespace detail {

inline std::string init_error(const std::string& what) {
    return "corocoll: init_process_group: " + what;
}

/// What every backend's set-up starts from: rank, world size and local rank worked out, and
/// the group's own namespace in the rendezvous store.
struct rendezvous_result {
    int rank = -1;
    int world_size = -1;
    int local_rank = -1;  ///< -1 when neither the options nor the launcher say
    /// The store reached (the whole job's keys).
    std::shared_ptr<rendezvous::store> store;
    /// This set-up's own namespace in it.
    std::shared_ptr<rendezvous::prefix_store> group_store;
    std::shared_ptr<rendezvous::tcp_store_server> hosted;
    std::optional<io::endpoint> master;
    /// Rank 0 serves the store at `master` (env:// without a launcher's store, tcp://): it
    /// dies with rank 0 (see detail::store_stand_ins).
    bool served_by_rank0 = false;
};

// COROCOLL_JOB_TOKEN, or empty. The store rank 0 serves asks every client to prove it, and
// mesh set-up has both ends of every connection prove it (docs/security.md).
COROCOLL_DECL std::string job_token_from_env();

// Connects to the store at `master`, which `source` names (the variable to fix); a server
// there that does not answer like a store is an error that says so at once.
COROCOLL_DECL task<std::shared_ptr<rendezvous::tcp_store>> connect_store(
    io::reactor& r, const io::endpoint& master, int rank, std::chrono::milliseconds timeout,
    const std::string& source);

// Rank 0 serves the store at host:port; everyone connects to it.
COROCOLL_DECL task<rendezvous_result> tcp_rendezvous(io::reactor& r, const std::string& host,
                                                     std::uint16_t port, int rank,
                                                     std::chrono::milliseconds timeout,
                                                     const std::string& source);

// Who this process is, for messages about a clash: "rank 1 (pid 4242 on node7)".
COROCOLL_DECL std::string who_is(int rank);

COROCOLL_DECL std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point deadline);

// Before any connection is made, every rank of a group claims its number and states the
// world size in the group's store, and waits until all have. A number claimed twice or a
// world size that differs from the first rank's is written under "init/verdict" in place of
// "ok", so every rank waiting there learns it at once, by name, instead of at the deadline;
// a rank that never came is named when the deadline passes. A rank that serves the store
// (`hosting`) waits up to 2 s after a bad verdict, until every rank that joined has read it.
// The world group's set-up leaves "init/world_size" behind as "done N" (`forget_setup_keys`),
// and counts who joined: a process whose RANK was taken by one that has finished set-up and
// removed its claim learns so at once, by the marker or by a count past the world size.
// Costs four store round trips.
COROCOLL_DECL task<> roll_call(rendezvous::store& store, int rank, int size,
                               const std::string& name,
                               std::chrono::steady_clock::time_point deadline, bool hosting);

// Set-up's keys go once every rank has read them (torch deletes its barrier keys too), so
// that a job making thousands of groups does not grow its store: this rank's own keys (its
// claim, its addresses) at once, since every rank had its connections before
// "init/complete"; the shared ones by the last rank to count itself under "init/done", after
// every rank's last read. A store that cannot delete keeps them: set-up does not fail for it.
// `world` (the group of init_process_group, whose ranks come from the launcher and may clash)
// keeps one key, "init/world_size" = "done N": a process that comes with a RANK already
// served learns so (`roll_call`); a subgroup's ranks are computed and cannot clash.
COROCOLL_DECL task<> forget_setup_keys(rendezvous::store& store, int rank, int size, bool world);

// The part of set-up every group shares, the world and subgroups alike: the mesh under the
// group's own store namespace, then a store-based barrier, as torch's init ends with: nobody
// returns (and perhaps finishes and exits, taking a hosted store along) before every rank
// has its connections.
// `stop` ends the set-up early (a parent group that failed; see `parent_watched_store`).
// `setup_timeout`, where given, bounds the set-up instead of the group's `timeout` (a
// shrink, whose members may die meanwhile, must not wait for them for the group's timeout).
// It bounds each of two waits: for every rank to come (the roll call), then for the
// connections, which start afresh once every rank came.
// `world`: the group of init_process_group (see `forget_setup_keys`).
COROCOLL_DECL task<std::shared_ptr<process_group>> build_group(
    io::reactor& r, std::shared_ptr<rendezvous::prefix_store> group_store, int rank, int size,
    std::string name, std::chrono::milliseconds timeout, transport::engine_options limits,
    io::endpoint listen_on, std::shared_ptr<rendezvous::tcp_store_server> hosted,
    std::stop_token stop = {}, std::chrono::milliseconds setup_timeout = {}, bool world = false);

/// The part of `init_process_group` that does not depend on the backend: works out rank and
/// world size (explicit, else from the launcher's environment), reaches the store, and opens
/// a fresh namespace in it for this set-up of `o.group_name`.
COROCOLL_DECL task<rendezvous_result> rendezvous_for(io::reactor& r, init_options& o);

/// Opens the lobby of `g` (see process_group::grow): `corocoll/<name>/lobby/` of `job_store`,
/// where processes that call join_process_group with the same store and group name meet it.
/// For set-ups of a group that are not init_process_group's (the torch backend's).
COROCOLL_DECL void open_lobby(process_group& g, std::shared_ptr<rendezvous::store> job_store,
                              const std::string& name);

}  // namespace detail

/// Sets up a process group, like torch's `init_process_group`: works out rank and world size
/// (explicit, else from the launcher's environment, see `rendezvous::read_launch_env`),
/// reaches the rendezvous store (given; `env://` at MASTER_ADDR:MASTER_PORT, where rank 0
/// serves it unless torchrun's agent already does (TORCHELASTIC_USE_AGENT_STORE); `tcp://`;
/// `file://`), then connects the mesh. Each wait is bounded by `o.timeout`: reaching the
/// store, every rank's coming, then the connections (which have the whole timeout once every
/// rank came); errors name what was missing or what failed. CUDA buffers:
/// `corocoll::gpu::init_process_group` (the include-gpu root) sets up backend "nccl".
COROCOLL_DECL task<std::shared_ptr<process_group>> init_process_group(io::reactor& r,
                                                                      init_options o = {});

/// Joins a live group as a new rank, through the store `o` reaches (as `init_process_group`
/// reaches it): a replacement for a rank that died, started by the launcher after the others
/// shrank, or one more rank for a group that scales up. Waits (up to `o.timeout`) until the
/// ranks of the group that descends from `init_process_group` with the same `o.group_name`
/// call `process_group::grow`, then sets the grown group up with them; this process's rank
/// in it is the one `grow` hands out (from the old size on), whatever RANK said. The store
/// must be one that outlived the rank that died (the launcher's, as corocollrun serves it):
/// with env:// that is TORCHELASTIC_USE_AGENT_STORE, which corocollrun sets.
COROCOLL_DECL task<std::shared_ptr<process_group>> join_process_group(io::reactor& r,
                                                                      init_options o = {});

/// Whether this process was started to take the place of a rank that failed
/// (corocollrun --on_failure=replace sets COROCOLL_JOIN=1 in its environment): it then joins
/// the live group with `join_process_group` instead of setting one up.
COROCOLL_DECL bool joining();

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/process_group/impl/init.ipp>
#endif
