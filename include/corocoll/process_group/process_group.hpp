#pragma once

#include <corocoll/core/error.hpp>
#include <corocoll/core/log.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/core/when_all.hpp>
#include <corocoll/core/work.hpp>
#include <corocoll/io/endpoint.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/rendezvous/file_store.hpp>
#include <corocoll/rendezvous/launch_env.hpp>
#include <corocoll/rendezvous/prefix_store.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/rendezvous/tcp_store.hpp>
#include <corocoll/transport/engine.hpp>
#include <corocoll/transport/mesh.hpp>
#include <corocoll/version.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

/// `recv`/`irecv` from whichever rank sends first.
inline constexpr int any_source = transport::any_source;

/// A contiguous range of trivially copyable elements: what corocoll sends and receives
/// (`std::vector<T>`, `std::array<T, N>`, `std::span<T>`, C arrays).
template <class R>
concept buffer = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
    std::is_trivially_copyable_v<std::ranges::range_value_t<R>>;

namespace detail {

template <buffer R>
std::span<const std::byte> bytes_of(const R& r) {
    return std::as_bytes(std::span(std::ranges::data(r), std::ranges::size(r)));
}

template <buffer R>
std::span<std::byte> writable_bytes_of(R& r) {
    static_assert(!std::is_const_v<std::remove_reference_t<decltype(*std::ranges::data(r))>>,
                  "corocoll: a receive buffer must be writable");
    return std::as_writable_bytes(std::span(std::ranges::data(r), std::ranges::size(r)));
}

}  // namespace detail

/// One operation of `batch_isend_irecv`, like torch's `P2POp`.
struct p2p_op {
    enum class kind { isend, irecv };
    kind op;
    std::span<std::byte> data;  // only read for isend
    int peer;
    std::int64_t tag = 0;

    template <buffer R>
    static p2p_op isend(const R& buf, int peer, std::int64_t tag = 0) {
        auto b = detail::bytes_of(buf);
        return {kind::isend, {const_cast<std::byte*>(b.data()), b.size()}, peer, tag};
    }
    template <buffer R>
    static p2p_op irecv(R& buf, int peer, std::int64_t tag = 0) {
        return {kind::irecv, detail::writable_bytes_of(buf), peer, tag};
    }
};

/// How `init_process_group` sets a group up; every field has torch's default.
struct init_options {
    /// "tcp" (CPU tensors over TCP; "gloo" and "cpu" are accepted as names for it).
    std::string backend = "tcp";
    /// "env://" (launcher variables, MASTER_ADDR/MASTER_PORT), "tcp://host:port" or
    /// "file:///path". Ignored when `store` is given.
    std::string init_method = "env://";
    /// -1: from the launcher's environment.
    int world_size = -1;
    int rank = -1;
    /// Deadline of set-up and default deadline of every operation (c10d's 30 minutes).
    std::chrono::milliseconds timeout = std::chrono::minutes(30);
    /// A store to rendezvous through instead of `init_method` (rank and world_size required).
    std::shared_ptr<rendezvous::store> store;
    /// Groups with different names keep apart in one store.
    std::string group_name = "default";
    transport::engine_options limits;
};

/// A set of ranks that exchange messages, like torch's ProcessGroup: the public face of
/// corocoll. Bound to the reactor of the thread that created it; its operations are
/// coroutines to await there (`isend`/`irecv` start at once and return a `work`). Every
/// operation has a deadline (the group's timeout unless given). A failed peer makes every
/// pending and later operation fail with an error naming it; the group must then be closed.
class process_group {
public:
    using duration = std::chrono::milliseconds;

    process_group(io::reactor& r, int rank, int size, std::string name, duration timeout,
                  std::shared_ptr<rendezvous::store> store, std::vector<io::socket> peers,
                  transport::engine_options limits,
                  std::shared_ptr<rendezvous::tcp_store_server> hosted)
        : reactor_(r),
          name_(std::move(name)),
          timeout_(timeout),
          store_(std::move(store)),
          hosted_(std::move(hosted)),
          engine_(r, rank, size, std::move(peers), limits) {}
    process_group(const process_group&) = delete;
    process_group& operator=(const process_group&) = delete;
    /// Closes the group if `close()` was not awaited (on this thread's reactor).
    ~process_group() {
        if (!closed_) {
            try {
                sync_wait(close());
            } catch (...) {
            }
        }
    }

    int rank() const noexcept { return engine_.rank(); }
    int size() const noexcept { return engine_.size(); }
    const std::string& name() const noexcept { return name_; }
    duration timeout() const noexcept { return timeout_; }
    io::reactor& reactor() const noexcept { return reactor_; }
    /// The group's namespace in the rendezvous store.
    rendezvous::store& store() const noexcept { return *store_; }

    /// Sends `buf` to `dst` with `tag`; completes once the data is handed to the kernel (the
    /// buffer may then be reused).
    template <buffer R>
    task<> send(const R& buf, int dst, std::int64_t tag = 0) {
        return engine_.send(detail::bytes_of(buf), dst, tag, deadline());
    }

    /// Receives into `buf` from `src` (or `any_source`) with `tag`; yields the sender's rank,
    /// as torch's `recv` returns it. The message may be shorter than `buf`, never longer.
    template <buffer R>
    task<int> recv(R& buf, int src = any_source, std::int64_t tag = 0) {
        return recv_bytes(detail::writable_bytes_of(buf), src, tag);
    }

    /// Starts a send now; `co_await` (or `.wait()`) the result. `buf` must stay alive and
    /// unchanged until then.
    template <buffer R>
    work<> isend(const R& buf, int dst, std::int64_t tag = 0) {
        return start(send(buf, dst, tag));
    }

    /// Starts a receive now; the result yields the sender. `buf` must stay alive until then.
    template <buffer R>
    work<int> irecv(R& buf, int src = any_source, std::int64_t tag = 0) {
        return start(recv(buf, src, tag));
    }

    /// Starts every operation of `ops` at once, like torch's `batch_isend_irecv`; one `work`
    /// per operation, in order (a send's yields its peer).
    std::vector<work<int>> batch_isend_irecv(const std::vector<p2p_op>& ops) {
        std::vector<work<int>> out;
        out.reserve(ops.size());
        for (const auto& op : ops) {
            if (op.op == p2p_op::kind::isend) {
                out.push_back(start(send_then_peer(op.data, op.peer, op.tag)));
            } else {
                out.push_back(start(recv_bytes(op.data, op.peer, op.tag)));
            }
        }
        return out;
    }

    /// Says goodbye to the peers, closes the connections and fails whatever is pending.
    /// Idempotent.
    task<> close() {
        if (closed_) co_return;
        closed_ = true;
        // The rank that serves the store keeps it up until the others are gone.
        co_await engine_.close(hosted_ ? deadline() : std::chrono::steady_clock::time_point{});
    }

    /// The transport underneath (for collectives and tests).
    transport::engine& engine() noexcept { return engine_; }

private:
    std::chrono::steady_clock::time_point deadline() const { return io::deadline_after(timeout_); }

    task<int> recv_bytes(std::span<std::byte> buf, int src, std::int64_t tag) {
        auto r = co_await engine_.recv(buf, src, tag, deadline());
        co_return r.source;
    }
    task<int> send_then_peer(std::span<const std::byte> buf, int dst, std::int64_t tag) {
        co_await engine_.send(buf, dst, tag, deadline());
        co_return dst;
    }

    io::reactor& reactor_;
    std::string name_;
    duration timeout_;
    std::shared_ptr<rendezvous::store> store_;
    std::shared_ptr<rendezvous::tcp_store_server> hosted_;  // rank 0's store server, if any
    transport::engine engine_;
    bool closed_ = false;
};

namespace detail {

inline std::string init_error(const std::string& what) {
    return "corocoll: init_process_group: " + what;
}

struct init_store {
    std::shared_ptr<rendezvous::store> store;
    std::shared_ptr<rendezvous::tcp_store_server> hosted;
    std::optional<io::endpoint> master;
};

// Rank 0 serves the store at host:port; everyone connects to it.
inline task<init_store> tcp_rendezvous(io::reactor& r, const std::string& host, std::uint16_t port,
                                       int rank, std::chrono::milliseconds timeout) {
    init_store out;
    io::endpoint master = io::endpoint::resolve(host, port);
    out.master = master;
    if (rank == 0) {
        try {
            out.hosted = std::make_shared<rendezvous::tcp_store_server>(master);
        } catch (const std::system_error& e) {
            corocoll::detail::throw_error(
                e.code(), init_error("rank 0 cannot serve the store on " + master.to_string() +
                                     (e.code() == std::errc::address_in_use
                                          ? " (port " + std::to_string(port) +
                                                " is already in use: pick another MASTER_PORT)"
                                          : "") +
                                     ": " + corocoll::detail::context_of(e)));
        }
    }
    out.store = co_await rendezvous::tcp_store::connect(r, master, timeout);
    co_return out;
}

}  // namespace detail

/// Sets up a process group, like torch's `init_process_group`: works out rank and world size
/// (explicit, else from the launcher's environment, see `rendezvous::read_launch_env`),
/// reaches the rendezvous store (given; `env://` at MASTER_ADDR:MASTER_PORT, where rank 0
/// serves it unless torchrun's agent already does (TORCHELASTIC_USE_AGENT_STORE); `tcp://`;
/// `file://`), then connects the mesh. Everything is bounded by `o.timeout`; errors name what
/// was missing or what failed.
inline task<std::shared_ptr<process_group>> init_process_group(io::reactor& r,
                                                               init_options o = {}) {
    if (o.backend != "tcp" && o.backend != "gloo" && o.backend != "cpu") {
        throw std::invalid_argument(detail::init_error(
            "backend '" + o.backend + "' is not available (CPU groups use \"tcp\"" +
            (o.backend == "nccl" ? "; the NCCL backend is a separate GPU build" : "") + ")"));
    }
    auto deadline = io::deadline_after(o.timeout);
    std::optional<rendezvous::launch_info> env;
    if (o.rank < 0 || o.world_size < 0) {
        if (o.store) {
            throw std::invalid_argument(
                detail::init_error("rank and world_size must be given with an explicit store"));
        }
        env = rendezvous::read_launch_env();
        if (o.rank < 0) o.rank = env->rank;
        if (o.world_size < 0) o.world_size = env->world_size;
    }
    if (o.world_size <= 0 || o.rank < 0 || o.rank >= o.world_size) {
        throw std::invalid_argument(
            detail::init_error("rank " + std::to_string(o.rank) +
                               " is outside [0, world_size=" + std::to_string(o.world_size) + ")"));
    }
    detail::log_rank() = o.rank;

    detail::init_store s;
    if (o.store) {
        s.store = o.store;
    } else if (o.init_method == "env://") {
        if (!env) {
            env.emplace();
            rendezvous::read_master_env(*env);
        }
        if (!env->master_addr || !env->master_port) {
            throw std::invalid_argument(
                detail::init_error(std::string("env:// needs MASTER_ADDR and MASTER_PORT; ") +
                                   (env->master_addr ? "" : "MASTER_ADDR is not set") +
                                   (!env->master_addr && !env->master_port ? ", " : "") +
                                   (env->master_port ? "" : "MASTER_PORT is not set")));
        }
        if (env->agent_store) {
            io::endpoint master = io::endpoint::resolve(*env->master_addr, *env->master_port);
            s.master = master;
            auto agent = co_await rendezvous::tcp_store::connect(r, master, o.timeout);
            s.store = std::make_shared<rendezvous::prefix_store>(env->agent_store_prefix(),
                                                                 std::move(agent));
        } else {
            s = co_await detail::tcp_rendezvous(r, *env->master_addr, *env->master_port, o.rank,
                                                o.timeout);
        }
    } else if (o.init_method.rfind("tcp://", 0) == 0) {
        std::string hostport = o.init_method.substr(6);
        auto colon = hostport.rfind(':');
        if (colon == std::string::npos) {
            throw std::invalid_argument(
                detail::init_error("init_method '" + o.init_method + "' lacks a port"));
        }
        std::string host = hostport.substr(0, colon);
        if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
        int port = std::atoi(hostport.c_str() + colon + 1);
        if (port <= 0 || port > 65535) {
            throw std::invalid_argument(
                detail::init_error("init_method '" + o.init_method + "' has a bad port"));
        }
        s = co_await detail::tcp_rendezvous(r, host, static_cast<std::uint16_t>(port), o.rank,
                                            o.timeout);
    } else if (o.init_method.rfind("file://", 0) == 0) {
        s.store = std::make_shared<rendezvous::file_store>(o.init_method.substr(7), o.timeout);
    } else {
        throw std::invalid_argument(detail::init_error(
            "init_method '" + o.init_method + "' is none of env://, tcp://host:port, file://path"));
    }
    s.store->set_timeout(o.timeout);

    // Every set-up of a group name gets fresh keys: ranks set groups up in the same order (as
    // torch requires too), so they agree on this count without asking each other. Per thread,
    // because ranks may be threads.
    thread_local std::map<std::string, int> generations;
    int generation = generations[o.group_name]++;
    auto group_store = std::make_shared<rendezvous::prefix_store>(
        "corocoll/" + o.group_name + "/" + std::to_string(generation), s.store);
    transport::mesh_options mesh;
    mesh.deadline = deadline;
    mesh.group_name = o.group_name;
    if (const char* token = std::getenv("COROCOLL_JOB_TOKEN")) mesh.job_token = token;
    mesh.listen_on = transport::choose_listen_address(s.master);
    auto peers = co_await transport::connect_mesh(r, *group_store, o.rank, o.world_size, mesh);
    // A store-based barrier, as torch's init ends with: nobody returns (and perhaps finishes
    // and exits, taking a hosted store along) before every rank has its connections.
    if (co_await group_store->add("init/arrived", 1) == o.world_size) {
        co_await group_store->set("init/complete", "1");
    }
    std::vector<std::string> complete{"init/complete"};
    try {
        co_await group_store->wait(complete,
                                   std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::max(deadline - std::chrono::steady_clock::now(),
                                                std::chrono::steady_clock::duration{})));
    } catch (const std::system_error& e) {
        corocoll::detail::throw_error(
            e.code(),
            detail::init_error("rank " + std::to_string(o.rank) +
                               " connected, but not every rank finished set-up in time: " +
                               corocoll::detail::context_of(e)));
    }
    COROCOLL_LOG(info, "INIT", "group '", o.group_name, "' ready: rank ", o.rank, " of ",
                 o.world_size);
    co_return std::make_shared<process_group>(r, o.rank, o.world_size, o.group_name, o.timeout,
                                              std::move(group_store), std::move(peers), o.limits,
                                              std::move(s.hosted));
}

COROCOLL_END_NAMESPACE
