// The bodies of the non-template functions declared in <corocoll/process_group/init.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/process_group/init.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL std::string job_token_from_env() {
    const char* token = std::getenv("COROCOLL_JOB_TOKEN");
    return token != nullptr ? token : "";
}

COROCOLL_DECL task<std::shared_ptr<rendezvous::tcp_store>> connect_store(
    io::reactor& r, const io::endpoint& master, int rank, std::chrono::milliseconds timeout,
    const std::string& source) {
    try {
        co_return co_await rendezvous::tcp_store::connect(r, master, timeout, job_token_from_env());
    } catch (const std::system_error& e) {
        if (e.code() != corocoll::errc::protocol_error) throw;
        corocoll::detail::throw_error(
            e.code(), init_error("rank " + std::to_string(rank) + ": " + master.to_string() + " (" +
                                 source + ") is not a store: " + corocoll::detail::context_of(e) +
                                 " (fix " + source + ")"));
    }
}

COROCOLL_DECL task<rendezvous_result> tcp_rendezvous(io::reactor& r, const std::string& host,
                                                     std::uint16_t port, int rank,
                                                     std::chrono::milliseconds timeout,
                                                     const std::string& source) {
    rendezvous_result out;
    io::endpoint master = io::endpoint::resolve(host, port);
    out.master = master;
    out.served_by_rank0 = true;
    if (rank == 0) {
        try {
            rendezvous::tcp_store_server_options served;
            // Without libcrypto a token fails set-up at the mesh, saying why.
            if (corocoll::detail::token_auth_available()) served.job_token = job_token_from_env();
            out.hosted = std::make_shared<rendezvous::tcp_store_server>(master, served);
        } catch (const std::system_error& e) {
            corocoll::detail::throw_error(
                e.code(), init_error("rank 0 cannot serve the store on " + master.to_string() +
                                     (e.code() == std::errc::address_in_use
                                          ? " (port " + std::to_string(port) +
                                                " is already in use: pick another MASTER_PORT; "
                                                "or is another process rank 0 too? Every "
                                                "process needs its own RANK)"
                                          : "") +
                                     ": " + corocoll::detail::context_of(e)));
        }
    }
    out.store = co_await connect_store(r, master, rank, timeout, source);
    co_return out;
}

COROCOLL_DECL std::string who_is(int rank) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    return "rank " + std::to_string(rank) + " (pid " + std::to_string(::getpid()) + " on " + host +
           ")";
}

COROCOLL_DECL std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point deadline) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::max(
        deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration{}));
}

COROCOLL_DECL task<> roll_call(rendezvous::store& store, int rank, int size,
                               const std::string& name,
                               std::chrono::steady_clock::time_point deadline, bool hosting) {
    constexpr std::chrono::milliseconds hosting_linger{2000};
    std::string me = who_is(rank);
    // The claim carries a random number: ranks that are threads of one process look alike.
    std::string claim = me + " #" + std::to_string(std::random_device{}());
    auto description = [](const std::string& v) { return v.substr(v.find(' ') + 1); };
    std::string problem;
    // A process that comes after the world's set-up is over: its RANK was served by another.
    auto came_after = [&](int ranks) {
        return "rank " + std::to_string(rank) + " was claimed by two processes: group '" + name +
               "' was set up with all " + std::to_string(ranks) +
               " of its ranks in this store before " + me +
               " came (every process needs its own RANK; a job run again needs a fresh store)";
    };
    std::string first =
        co_await store.compare_set("init/world_size", "", std::to_string(size) + " " + claim);
    if (first.rfind("done ", 0) == 0) {
        throw std::invalid_argument(init_error(came_after(std::atoi(first.c_str() + 5))));
    }
    if (first.substr(0, first.find(' ')) != std::to_string(size)) {
        std::string them = description(first);
        problem = "the world size differs between ranks: " + them.substr(0, them.rfind(" #")) +
                  " has world size " + first.substr(0, first.find(' ')) + ", " + me +
                  " has world size " + std::to_string(size) +
                  " (start every rank with the same WORLD_SIZE)";
    } else if (std::string holder =
                   co_await store.compare_set("init/rank/" + std::to_string(rank), "", claim);
               holder != claim) {
        problem = "rank " + std::to_string(rank) +
                  " was claimed by two processes: " + holder.substr(0, holder.rfind(" #")) +
                  " and " + me + " (every process needs its own RANK)";
    }
    const std::string verdict_key = "init/verdict";
    // Waiters wait for this key, written with SET after the verdict: torch 1.13's TCPStore
    // server (torchrun's agent store) does not wake waiters on a compare-and-set.
    const std::string decided_key = "init/decided";
    // A rank that serves the store stays a moment after a bad verdict, so that the ranks
    // waiting can read it before the store goes away with this rank: each one that has read
    // it counts itself under "init/told".
    auto linger = [&]() -> task<> {
        if (!hosting) co_return;
        std::vector<std::string> all_told{"init/all_told"};
        try {
            co_await store.wait(all_told, std::min(left_until(deadline), hosting_linger));
        } catch (const std::system_error&) {
        }
    };
    if (!problem.empty()) {
        co_await store.compare_set(verdict_key, "", "group '" + name + "': " + problem);
        co_await store.set(decided_key, "1");
        co_await linger();
        throw std::invalid_argument(init_error(problem));
    }
    if (std::int64_t joined = co_await store.add("init/joined", 1); joined == size) {
        co_await store.compare_set(verdict_key, "", "ok");
        co_await store.set(decided_key, "1");
    } else if (joined > size) {
        // Every rank had joined; this one's claim went through because its holder had
        // finished set-up and removed it.
        throw std::invalid_argument(init_error(came_after(size)));
    }
    std::vector<std::string> keys{decided_key};
    std::optional<std::system_error> late;
    try {
        co_await store.wait(keys, left_until(deadline));
    } catch (const std::system_error& e) {
        if (e.code() != std::errc::timed_out) throw;
        late = e;
    }
    if (late) {
        // The set-up ended while this rank was between its claim and its count.
        std::vector<std::string> size_key{"init/world_size"};
        if (co_await store.check(size_key) &&
            (co_await store.get(size_key[0])).rfind("done ", 0) == 0) {
            throw std::invalid_argument(init_error(came_after(size)));
        }
        // Named claims, one at a time: g++ 12.2 rejects an initializer_list temporary inside
        // co_await ("array used as initializer").
        std::string missing;
        int count = 0;
        for (int k = 0; k < size; ++k) {
            std::vector<std::string> claim_key{"init/rank/" + std::to_string(k)};
            if (co_await store.check(claim_key)) continue;
            if (++count <= 16) missing += (count > 1 ? ", " : "") + std::to_string(k);
        }
        if (count > 16) missing += ", ...";
        corocoll::detail::throw_error(
            late->code(),
            init_error("rank " + std::to_string(rank) + " of group '" + name +
                       "': " + std::to_string(count) + " of " + std::to_string(size) +
                       " ranks did not join before the timeout; missing: rank(s) " + missing));
    }
    std::string verdict = co_await store.get(verdict_key);
    if (verdict != "ok") {
        if (co_await store.add("init/told", 1) >= co_await store.add("init/joined", 0)) {
            co_await store.set("init/all_told", "1");
        }
        co_await linger();
        throw std::invalid_argument(
            init_error("rank " + std::to_string(rank) + " cannot join: " + verdict));
    }
}

COROCOLL_DECL task<> forget_setup_keys(rendezvous::store& store, int rank, int size, bool world) {
    try {
        std::string me = std::to_string(rank);
        for (const char* key : {"init/rank/", "mesh/addr/", "mesh/shm/"}) {
            co_await store.delete_key(key + me);
        }
        if (co_await store.add("init/done", 1) != size) co_return;
        if (world) {
            co_await store.set("init/world_size", "done " + std::to_string(size));
        } else {
            co_await store.delete_key("init/world_size");
        }
        for (const char* key : {"init/verdict", "init/decided", "init/joined", "init/arrived",
                                "init/complete", "mesh/arena", "mesh/arena_reads", "init/done"}) {
            co_await store.delete_key(key);
        }
    } catch (const std::exception& e) {
        COROCOLL_LOG(info, "INIT", "rank ", rank, " leaves set-up keys in the store: ", e.what());
    }
}

COROCOLL_DECL task<std::shared_ptr<process_group>> build_group(
    io::reactor& r, std::shared_ptr<rendezvous::prefix_store> group_store, int rank, int size,
    std::string name, std::chrono::milliseconds timeout, transport::engine_options limits,
    io::endpoint listen_on, std::shared_ptr<rendezvous::tcp_store_server> hosted,
    std::stop_token stop, std::chrono::milliseconds setup_timeout, bool world) {
    const auto span = setup_timeout.count() > 0 ? setup_timeout : timeout;
    auto deadline = io::deadline_after(span);
    // A COROCOLL_CACHE_L2 that is not a size stops every rank here, before any connection.
    const cache_sizes& caches = machine_cache_sizes();
    transport::mesh_options mesh;
    mesh.stop = std::move(stop);
    mesh.deadline = deadline;
    mesh.group_name = name;
    mesh.job_token = job_token_from_env();
    mesh.listen_on = listen_on;
    co_await roll_call(*group_store, rank, size, name, deadline, hosted != nullptr);
    // Every rank came: connecting has the whole span again. The span bounds each wait (for
    // the ranks to come, then for the connections), as torch's timeout does: a rank that came
    // early must not spend its peers' lateness on connecting to them.
    deadline = io::deadline_after(span);
    mesh.deadline = deadline;
    std::vector<std::string> host_keys;
    std::unique_ptr<transport::shm_arena> arena;
    std::unique_ptr<transport::lazy_mesh> lazy;
    auto peers = co_await transport::connect_channels(r, *group_store, rank, size, mesh, limits,
                                                      &host_keys, &arena, &lazy);
    auto hosts = collectives::topology::from_keys(host_keys);
    // From here on a failure must close the channels first: a shared-memory channel's watch
    // is in the kernel until then.
    std::exception_ptr failed;
    try {
        if (co_await group_store->add("init/arrived", 1) == size) {
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
                e.code(), init_error("rank " + std::to_string(rank) + " of group '" + name +
                                     "' connected, but not every rank finished set-up in time: " +
                                     corocoll::detail::context_of(e)));
        }
        // Every rank that took the arena counted itself before it arrived: the count is final.
        if (arena && co_await group_store->add("mesh/arena", 0) != size) {
            COROCOLL_LOG(info, "INIT", "group '", name,
                         "': no shared-memory arena (not every rank could map it)");
            arena.reset();
        } else if (arena) {
            // Counted before "mesh/arena" too: final as well.
            if (co_await group_store->add("mesh/arena_reads", 0) == size)
                arena->allow_single_copy();
            std::string copies;
            for (std::size_t k = 0; k < transport::single_copy_uses; ++k) {
                const auto u = static_cast<transport::single_copy_use>(k);
                if (std::size_t from = arena->single_copy_from(u); from > 0) {
                    copies += std::string(copies.empty() ? "" : ", ") +
                              transport::single_copy_use_name(u) + " from " +
                              std::to_string(from >> 10) + " KiB";
                    if (std::size_t below = arena->single_copy_below(u); below > 0)
                        copies += " below " + std::to_string(below >> 10) + " KiB";
                }
            }
            copies = copies.empty() ? "; no single copies (off)"
                     : !arena->single_copy_allowed()
                         ? "; no single copies (process_vm_readv refused)"
                         : "; single copies of " + copies;
            COROCOLL_LOG(info, "INIT", "group '", name, "': a shared-memory arena of 2 x ",
                         arena->set_bytes() >> 10, " KiB (the collectives through shared memory",
                         copies, "); size thresholds from rank 0's L2 of ", arena->l2_bytes() >> 10,
                         " KiB; this rank's caches: ", describe(caches));
        }
    } catch (...) {
        failed = std::current_exception();
    }
    if (failed) {
        for (auto& p : peers) {
            if (p) co_await p->close();
        }
        std::rethrow_exception(failed);
    }
    co_await forget_setup_keys(*group_store, rank, size, world);
    COROCOLL_LOG(info, "INIT", "group '", name, "' ready: rank ", rank, " of ", size);
    COROCOLL_LOG(info, "INIT", "group '", name, "': ", hosts.describe(),
                 hosts.hierarchical() ? " (all_reduce, broadcast, all_gather hierarchical)" : "");
    // The disposer closes a group whose last reference goes, wherever that happens.
    std::shared_ptr<process_group> g(
        new process_group(r, rank, size, std::move(name), timeout, std::move(group_store),
                          std::move(peers), limits, std::move(hosted), listen_on, std::move(hosts),
                          std::move(arena)),
        group_disposer{});
    if (lazy) g->engine().open_on_first_use(std::move(lazy));
    co_return g;
}

// Where processes that join meet the groups that descend from init_process_group's group
// `name` (see process_group::grow).
inline std::shared_ptr<rendezvous::store> lobby_of(const std::string& name,
                                                   std::shared_ptr<rendezvous::store> store) {
    return std::make_shared<rendezvous::prefix_store>("corocoll/" + name + "/lobby",
                                                      std::move(store));
}

COROCOLL_DECL void open_lobby(process_group& g, std::shared_ptr<rendezvous::store> job_store,
                              const std::string& name) {
    g.set_lobby(lobby_of(name, std::move(job_store)), name);
}

COROCOLL_DECL task<rendezvous_result> rendezvous_for(io::reactor& r, init_options& o) {
    std::optional<rendezvous::launch_info> env;
    if (o.rank < 0 || o.world_size < 0) {
        if (o.store) {
            throw std::invalid_argument(
                detail::init_error("rank and world_size must be given with an explicit store"));
        }
        env = rendezvous::read_launch_env();
        if (o.rank < 0) o.rank = env->rank;
        if (o.world_size < 0) o.world_size = env->world_size;
        // Ranks of this host that outnumber its processors must not busy-poll.
        if (env->local_world_size > 0) io::reactor::set_local_processes(env->local_world_size);
    }
    if (o.world_size <= 0 || o.rank < 0 || o.rank >= o.world_size) {
        throw std::invalid_argument(
            detail::init_error("rank " + std::to_string(o.rank) +
                               " is outside [0, world_size=" + std::to_string(o.world_size) + ")"));
    }
    detail::log_rank() = o.rank;
    // Every COROCOLL_* value is checked before anything starts: a misspelt one fails every
    // rank at once, here, instead of an abort or a hang later in set-up.
    try {
        auto settings = read_environment();
        if (!o.limits.transport) o.limits.transport = settings.transport;
        if (!o.limits.stall) o.limits.stall = settings.stall;
    } catch (const std::invalid_argument& e) {
        std::string why = e.what();
        if (why.rfind("corocoll: ", 0) == 0) why.erase(0, 10);
        throw std::invalid_argument(
            detail::init_error("rank " + std::to_string(o.rank) + ": " + why));
    }

    rendezvous_result s;
    if (o.store) {
        s.store = o.store;
        s.master = o.store_address;
    } else if (o.init_method == "env://") {
        if (!env) {
            env.emplace();
            rendezvous::read_master_env(*env);
        }
        if (!env->master_addr || !env->master_port) {
            throw std::invalid_argument(detail::init_error(
                "rank " + std::to_string(o.rank) + ": env:// needs MASTER_ADDR and MASTER_PORT; " +
                (env->master_addr ? "" : "MASTER_ADDR is not set") +
                (!env->master_addr && !env->master_port ? ", " : "") +
                (env->master_port ? "" : "MASTER_PORT is not set")));
        }
        if (env->agent_store) {
            io::endpoint master = io::endpoint::resolve(*env->master_addr, *env->master_port);
            s.master = master;
            auto agent = co_await detail::connect_store(r, master, o.rank, o.timeout,
                                                        "MASTER_ADDR/MASTER_PORT");
            s.store = std::make_shared<rendezvous::prefix_store>(env->agent_store_prefix(),
                                                                 std::move(agent));
        } else {
            s = co_await detail::tcp_rendezvous(r, *env->master_addr, *env->master_port, o.rank,
                                                o.timeout, "MASTER_ADDR/MASTER_PORT");
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
                                            o.timeout, "init_method " + o.init_method);
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
    s.rank = o.rank;
    s.world_size = o.world_size;
    if (env) s.local_rank = env->local_rank;
    s.group_store = std::make_shared<rendezvous::prefix_store>(
        "corocoll/" + o.group_name + "/" + std::to_string(generation), s.store);
    co_return s;
}

}  // namespace detail

COROCOLL_DECL task<std::shared_ptr<process_group>> init_process_group(io::reactor& r,
                                                                      init_options o) {
    if (o.backend != "tcp" && o.backend != "gloo" && o.backend != "cpu") {
        throw std::invalid_argument(detail::init_error(
            "backend '" + o.backend + "' is not available (CPU groups use \"tcp\"" +
            (o.backend == "nccl" ? "; NCCL groups come from corocoll::gpu::init_process_group in "
                                   "<corocoll/gpu/nccl_group.hpp>, a build with -Dnccl=enabled"
                                 : "") +
            ")"));
    }
    auto rv = co_await detail::rendezvous_for(r, o);
    auto g = co_await detail::build_group(
        r, std::move(rv.group_store), rv.rank, rv.world_size, o.group_name, o.timeout, o.limits,
        transport::choose_listen_address(rv.master), std::move(rv.hosted), {}, {}, true);
    detail::open_lobby(*g, rv.store, o.group_name);
    if (rv.served_by_rank0 && g->size() > 1) {
        co_await g->set_up_stand_ins(*rv.master);
        // For processes that join later (join_process_group).
        if (g->rank() == 0) co_await g->lobby_->set("stand-ins", g->stand_ins_->encode());
    }
    co_return g;
}

COROCOLL_DECL task<std::shared_ptr<process_group>> join_process_group(io::reactor& r,
                                                                      init_options o) {
    if (o.backend != "tcp" && o.backend != "gloo" && o.backend != "cpu") {
        throw std::invalid_argument("corocoll: join_process_group: backend '" + o.backend +
                                    "' is not available (CPU groups use \"tcp\")");
    }
    auto rv = co_await detail::rendezvous_for(r, o);
    auto lobby = detail::lobby_of(o.group_name, rv.store);
    const auto until = io::deadline_after(o.timeout);
    std::int64_t k = -1;
    int rank = -1, size = -1;
    for (;;) {
        // A ticket number, then this process's name under it, for rank 0 of a grow to see.
        const std::string n = std::to_string(co_await lobby->add("joined", 1));
        co_await lobby->set("joiner/" + n, detail::who_is(rv.rank));
        // A ticket, or, once this joiner gives up, "withdrawn": whichever of rank 0's ticket
        // and this joiner's withdrawal comes first (a compare_set) holds, so rank 0 never
        // admits a joiner that left, and a joiner never leaves a ticket it was given behind.
        std::optional<std::system_error> waited;
        try {
            std::vector<std::string> keys{"ticket/" + n};
            co_await lobby->wait(std::move(keys), detail::left_until(until));
        } catch (const std::system_error& e) {
            waited = e;
        }
        const std::string ticket = co_await lobby->compare_set("ticket/" + n, "", "withdrawn");
        std::string verdict;
        if (ticket != "withdrawn") {
            // Given a ticket: the grow goes on once rank 0 found every joiner it needs.
            std::vector<std::string> keys{"verdict/" + n};
            try {
                verdict =
                    (co_await lobby->multi_get(std::move(keys), detail::left_until(until))).front();
            } catch (const std::system_error& e) {
                waited = e;
            }
        }
        // A withdrawn joiner's name and ticket stay for the next grow, which passes over them
        // and deletes them (its wait is for the name).
        if (ticket == "withdrawn") {
            co_await lobby->add("withdrawn", 1);
        } else {
            co_await lobby->delete_key("joiner/" + n);
            co_await lobby->delete_key("ticket/" + n);
            co_await lobby->delete_key("verdict/" + n);
        }
        if (ticket == "withdrawn" || verdict.empty()) {
            corocoll::detail::throw_error(
                waited ? waited->code() : std::make_error_code(std::errc::timed_out),
                "corocoll: join_process_group: " + detail::who_is(rv.rank) + " (joiner " + n +
                    ") was not admitted to group '" + o.group_name + "' within " +
                    std::to_string(o.timeout.count()) +
                    " ms: its ranks admit joiners with process_group::grow" +
                    (waited ? " (" + corocoll::detail::context_of(*waited) + ")" : std::string()));
        }
        if (verdict != "go") {
            // The grow found too few joiners: wait for the next one, under a new number.
            COROCOLL_LOG(info, "FT", "joiner ", n, ": the grow that gave it a ticket failed");
            continue;
        }
        std::istringstream in(ticket);
        in >> k >> rank >> size;
        if (!in || k < 1 || rank < 1 || size <= rank) {
            throw std::runtime_error("corocoll: join_process_group: joiner " + n +
                                     " got a ticket it cannot read: '" + ticket + "'");
        }
        COROCOLL_LOG(info, "FT", "joiner ", n, " admitted to group '", o.group_name, "' as rank ",
                     rank, " of ", size);
        break;
    }
    auto g = co_await detail::build_group(
        r, std::make_shared<rendezvous::prefix_store>(std::to_string(k) + "/group", lobby), rank,
        size, o.group_name + "/grow" + std::to_string(k), o.timeout, o.limits,
        transport::choose_listen_address(rv.master), std::move(rv.hosted));
    // The stand-ins for the store rank 0 serves, where the job has them.
    std::vector<std::string> stand_ins_key{"stand-ins"};
    if (co_await lobby->check(stand_ins_key)) {
        g->stand_ins_ = std::make_shared<detail::store_stand_ins>(
            detail::store_stand_ins::decode(co_await lobby->get("stand-ins")));
        g->stand_ins_->job_token = detail::job_token_from_env();
    }
    g->set_lobby(std::move(lobby), o.group_name);
    co_return g;
}

COROCOLL_DECL task<std::shared_ptr<process_group>> process_group::new_group(rank_list list) {
    std::vector<int> ranks = std::move(list).take();
    check_open("new_group");
    std::sort(ranks.begin(), ranks.end());
    if (ranks.empty() || std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end() ||
        ranks.front() < 0 || ranks.back() >= size()) {
        throw std::invalid_argument(prefix("new_group") + "ranks must be distinct and within [0, " +
                                    std::to_string(size()) + ")");
    }
    int k = ++subgroups_;
    auto me = std::find(ranks.begin(), ranks.end(), rank());
    if (me == ranks.end()) co_return nullptr;
    std::string name = name_ + "/sub" + std::to_string(k);
    auto store = std::make_shared<rendezvous::prefix_store>("sub/" + std::to_string(k),
                                                            watched_store("new_group", name));
    auto group = co_await set_up_subgroup(
        detail::build_group(reactor_, std::move(store), static_cast<int>(me - ranks.begin()),
                            static_cast<int>(ranks.size()), name, timeout_, limits_, listen_on_,
                            nullptr, engine_.failure_token()),
        "new_group", name);
    // Set up: the group's keys from now on do not depend on this group staying sound (a
    // shrink of the subgroup after this group failed) or alive.
    group->store_ = std::make_shared<rendezvous::prefix_store>("sub/" + std::to_string(k), store_);
    group->stand_ins_ = stand_ins_;
    group->store_at_ = store_at_;
    std::erase_if(made_, [](const auto& w) { return w.expired(); });
    made_.push_back(group);
    co_return group;
}

namespace detail {

// "0,1,3": the members a shrink agreed on, as they travel through the store.
inline std::string encode_ranks(const std::vector<int>& ranks) {
    std::string out;
    for (int r : ranks) {
        if (!out.empty()) out += ',';
        out += std::to_string(r);
    }
    return out;
}

inline std::vector<int> decode_ranks(const std::string& text) {
    std::vector<int> out;
    std::size_t at = 0;
    while (at < text.size()) {
        std::size_t comma = text.find(',', at);
        if (comma == std::string::npos) comma = text.size();
        out.push_back(std::stoi(text.substr(at, comma - at)));
        at = comma + 1;
    }
    return out;
}

}  // namespace detail

COROCOLL_DECL task<process_group::decision> process_group::decide(
    std::shared_ptr<rendezvous::store> store, std::string base, std::vector<int> candidates,
    std::chrono::milliseconds join_window, bool flag) {
    auto alive_key = [&](int p) { return base + "alive/" + std::to_string(p); };
    co_await store->set(alive_key(rank()), flag ? "1" : "0");
    auto came = co_await store->add(base + "came", 1);
    std::vector<std::string> every_alive;
    every_alive.reserve(candidates.size());
    for (int p : candidates) every_alive.push_back(alive_key(p));
    std::vector<std::string> decided{base + "members"};
    std::string verdict;
    // The rank that completes the count proposes, if the ranks that came are the candidates;
    // everyone else waits for the decision, and proposes what it saw once the window is over.
    bool propose_now =
        came == static_cast<std::int64_t>(candidates.size()) && co_await store->check(every_alive);
    if (!propose_now) {
        try {
            // Waits for the decision and reads it: one round trip to corocoll's server.
            verdict = (co_await store->multi_get(decided, join_window)).front();
        } catch (const std::system_error& e) {
            if (e.code() != std::errc::timed_out) throw;
        }
    }
    if (verdict.empty()) {
        // Who came: every candidate where this rank completed the count, else a look at each.
        std::vector<int> present;
        std::vector<std::string> present_keys;
        if (propose_now) {
            present = candidates;
            present_keys = every_alive;
        } else {
            for (int p : candidates) {
                std::vector<std::string> one{alive_key(p)};
                if (co_await store->check(one)) {
                    present.push_back(p);
                    present_keys.push_back(alive_key(p));
                }
            }
        }
        // Their flags. Every key was there a moment ago; one that went since went because its
        // owner had the decision (it deletes its key only then), so a read that does not come
        // back at once looks for the decision before it reads again.
        std::vector<std::string> flags;
        bool read = false;
        const auto until = io::deadline_after(join_window);
        while (!read && verdict.empty()) {
            std::optional<std::system_error> slow;
            try {
                flags = co_await store->multi_get(present_keys, flag_read_wait);
                read = true;
            } catch (const std::system_error& e) {
                if (e.code() != std::errc::timed_out) throw;
                slow = e;
            }
            if (read) break;
            if (co_await store->check(decided)) {
                verdict = (co_await store->multi_get(decided, join_window)).front();
            } else if (std::chrono::steady_clock::now() > until) {
                throw *slow;
            }
        }
        if (verdict.empty()) {
            bool all = true;
            for (const auto& f : flags) all = all && f == "1";
            verdict = co_await store->compare_set(
                decided.front(), "",
                std::string(all ? "1" : "0") + "|" + detail::encode_ranks(present));
        }
    }
    // Decided: nobody needs this rank's key any more (a caller still proposing gets the
    // decision from its compare_set). "came" and "members" stay: a rank that comes later
    // must learn that it was left out.
    co_await store->delete_key(alive_key(rank()));
    auto bar = verdict.find('|');
    co_return decision{detail::decode_ranks(verdict.substr(bar + 1)),
                       verdict.substr(0, bar) == "1"};
}

COROCOLL_DECL std::string detail::store_stand_ins::encode() const {
    std::string out;
    for (const auto& e : chain) {
        if (!out.empty()) out += ',';
        out += e.to_string();
    }
    return out;
}

COROCOLL_DECL detail::store_stand_ins detail::store_stand_ins::decode(const std::string& text) {
    store_stand_ins s;
    std::size_t at = 0;
    while (at < text.size()) {
        std::size_t comma = text.find(',', at);
        if (comma == std::string::npos) comma = text.size();
        s.chain.push_back(io::endpoint::parse(std::string_view(text).substr(at, comma - at)));
        at = comma + 1;
    }
    s.gone.assign(s.chain.size(), false);
    s.mine_at = s.chain.size();
    return s;
}

COROCOLL_DECL task<> process_group::set_up_stand_ins(io::endpoint primary) {
    auto s = std::make_shared<detail::store_stand_ins>();
    s->job_token = detail::job_token_from_env();
    const int count = std::min(size() - 1, detail::store_stand_in_count);
    if (rank() >= 1 && rank() <= count) {
        rendezvous::tcp_store_server_options o;
        if (corocoll::detail::token_auth_available()) o.job_token = s->job_token;
        // The address this rank's mesh listens on: reachable by every other rank.
        s->mine = std::make_shared<rendezvous::tcp_store_server>(
            listen_on_.empty() ? io::endpoint::loopback(0)
                               : io::endpoint::from_numeric(listen_on_.host(), 0),
            o);
        co_await store_->set("stand-in/" + std::to_string(rank()),
                             s->mine->local_endpoint().to_string());
    }
    std::vector<std::string> keys;
    for (int i = 1; i <= count; ++i) keys.push_back("stand-in/" + std::to_string(i));
    auto addresses = co_await store_->multi_get(keys, timeout_);
    s->chain.push_back(primary);
    for (const auto& a : addresses) s->chain.push_back(io::endpoint::parse(a));
    s->gone.assign(s->chain.size(), false);
    s->mine_at = s->mine ? static_cast<std::size_t>(rank()) : s->chain.size();
    stand_ins_ = std::move(s);
    store_at_ = 0;
}

COROCOLL_DECL task<process_group::decision_place> process_group::decision_place_for(
    const char* call) {
    // A sound group, or one whose store no rank serves (a launcher's): its own store.
    if (!stand_ins_ || failed_ranks().empty()) co_return decision_place{store_, store_at_, hosted_};
    auto& s = *stand_ins_;
    // How long an answer from a live store may take: a dead process's port refuses at once.
    constexpr std::chrono::milliseconds probe_window{2000};
    std::string tried;
    for (std::size_t i = 0; i < s.chain.size(); ++i) {
        if (s.gone[i]) continue;
        std::shared_ptr<rendezvous::tcp_store> client;
        try {
            client = co_await rendezvous::tcp_store::connect(reactor_, s.chain[i], probe_window,
                                                             s.job_token, false);
        } catch (const std::system_error& e) {
            if (!tried.empty()) tried += "; ";
            tried += s.chain[i].to_string();
            tried += ": ";
            tried += e.what();
        }
        if (!client) {
            s.gone[i] = true;
            COROCOLL_LOG(warn, "FT", call, " of group '", name_, "': the store at ",
                         s.chain[i].to_string(), " is gone; trying the next stand-in");
            continue;
        }
        if (i == store_at_) co_return decision_place{store_, i, hosted_};
        client->set_timeout(timeout_);
        COROCOLL_LOG(info, "FT", call, " of group '", name_, "' meets at the stand-in store ",
                     s.chain[i].to_string());
        co_return decision_place{
            std::make_shared<rendezvous::prefix_store>("corocoll/" + name_, std::move(client)), i,
            i == s.mine_at ? s.mine : nullptr};
    }
    throw std::runtime_error(prefix(call) + "group '" + name_ +
                             "': the store rank 0 served and its stand-ins are all gone (" + tried +
                             ")");
}

COROCOLL_DECL void process_group::check_lobby(const char* call) const {
    if (stand_ins_ && !stand_ins_->gone.empty() && stand_ins_->gone[0]) {
        throw std::runtime_error(prefix(call) + "group '" + name_ +
                                 "' cannot admit joiners: they meet in the store that rank 0 of "
                                 "group '" +
                                 lobby_name_ + "' served at " + stand_ins_->chain[0].to_string() +
                                 ", which is gone with it");
    }
}

COROCOLL_DECL std::vector<int> process_group::live_candidates() const {
    std::vector<int> candidates;
    std::vector<int> failed = failed_ranks();
    for (int p = 0; p < size(); ++p) {
        if (std::find(failed.begin(), failed.end(), p) == failed.end()) candidates.push_back(p);
    }
    return candidates;
}

COROCOLL_DECL std::string process_group::left_out(const char* call, const std::vector<int>& members,
                                                  std::chrono::milliseconds join_window) const {
    return prefix(call) + "rank " + std::to_string(rank()) + " of group '" + name_ +
           "' was left out of the " +
           (std::string(call) == "shrink" ? "shrunk group" : "agreement") +
           ": the others agreed on rank(s) " + detail::encode_ranks(members) +
           " (it came more than " + std::to_string(join_window.count()) +
           " ms after them, or one of them took it for failed)";
}

COROCOLL_DECL task<agreement> process_group::agree(bool flag,
                                                   std::chrono::milliseconds join_window) {
    check_open("agree");
    const int k = ++agreements_;
    auto place = co_await decision_place_for("agree");
    auto d = co_await decide(std::move(place.store), "agree/" + std::to_string(k) + "/",
                             live_candidates(), join_window, flag);
    if (std::find(d.members.begin(), d.members.end(), rank()) == d.members.end()) {
        throw std::runtime_error(left_out("agree", d.members, join_window));
    }
    agreement a;
    a.value = d.all_true;
    for (int p = 0; p < size(); ++p) {
        if (std::find(d.members.begin(), d.members.end(), p) == d.members.end())
            a.failed.push_back(p);
    }
    co_return a;
}

COROCOLL_DECL task<std::shared_ptr<process_group>> process_group::shrink(
    std::chrono::milliseconds join_window) {
    check_open("shrink");
    const int k = ++shrinks_;
    std::vector<int> candidates = live_candidates();
    std::string name = name_ + "/shrink" + std::to_string(k);
    std::string tries;
    // Each failed try leaves out at least the rank that did not come again: at most size().
    for (int t = 0; t < size(); ++t) {
        std::string base = "shrink/" + std::to_string(k) + "/" + std::to_string(t) + "/";
        auto place = co_await decision_place_for("shrink");
        std::vector<int> members =
            (co_await decide(place.store, base, candidates, join_window, true)).members;
        auto me = std::find(members.begin(), members.end(), rank());
        if (me == members.end()) throw std::runtime_error(left_out("shrink", members, join_window));
        COROCOLL_LOG(info, "FT", "shrink of group '", name_, "' (try ", t, "): rank(s) ",
                     detail::encode_ranks(members), " of ", size());
        auto store = std::make_shared<rendezvous::prefix_store>(base + "group", place.store);
        try {
            auto g = co_await detail::build_group(
                reactor_, std::move(store), static_cast<int>(me - members.begin()),
                static_cast<int>(members.size()), name, timeout_, limits_, listen_on_,
                std::move(place.hosted), {}, join_window);
            g->set_lobby(lobby_, lobby_name_);
            g->stand_ins_ = stand_ins_;
            g->store_at_ = place.at;
            co_return g;
        } catch (const std::exception& e) {
            COROCOLL_LOG(warn, "FT", "shrink of group '", name_, "': try ", t,
                         " failed (a member may have died): ", e.what());
            tries += "; try " + std::to_string(t) + " (rank(s) " + detail::encode_ranks(members) +
                     "): " + e.what();
        }
        candidates = std::move(members);
    }
    throw std::runtime_error(prefix("shrink") + "group '" + name_ + "' could not be shrunk" +
                             tries);
}

COROCOLL_DECL bool joining() {
    const char* v = std::getenv("COROCOLL_JOIN");
    return v != nullptr && std::string_view(v) == "1";
}

COROCOLL_DECL task<int> process_group::joiners_waiting() {
    check_open("joiners_waiting");
    check_lobby("joiners_waiting");
    std::array<std::int64_t, 1> waiting{0};
    if (rank() == 0 && lobby_) {
        const std::int64_t admitted = co_await lobby_->add("admitted", 0);
        const std::int64_t withdrawn = co_await lobby_->add("withdrawn", 0);
        waiting[0] = co_await lobby_->add("joined", 0) - admitted - withdrawn;
    }
    co_await broadcast(waiting, 0);
    co_return static_cast<int>(std::max<std::int64_t>(waiting[0], 0));
}

COROCOLL_DECL task<std::int64_t> process_group::admit(int need, int new_size,
                                                      std::chrono::milliseconds join_window) {
    // Joiners in ticket order from the first not looked at yet ("next"), passing over those
    // that withdrew (gave up waiting): each of the others gets its ticket by a compare_set,
    // which its withdrawal would have beaten. Then each learns the verdict: "go", or, when
    // too few came, "again" (it waits for the next grow under a new number).
    const std::int64_t k = co_await lobby_->add("grows", 1);  // this grow's number
    std::int64_t next = co_await lobby_->add("next", 0) + 1;
    const auto until = io::deadline_after(join_window);
    std::vector<std::int64_t> taken;
    while (static_cast<int>(taken.size()) < need) {
        std::vector<std::string> name{"joiner/" + std::to_string(next)};
        try {
            co_await lobby_->wait(name, detail::left_until(until));
        } catch (const std::system_error& e) {
            if (e.code() != std::errc::timed_out) throw;
            break;
        }
        const std::string ticket = std::to_string(k) + " " +
                                   std::to_string(size() + static_cast<int>(taken.size())) + " " +
                                   std::to_string(new_size);
        const std::string got =
            co_await lobby_->compare_set("ticket/" + std::to_string(next), "", ticket);
        co_await lobby_->add("next", 1);
        if (got == ticket) {
            taken.push_back(next);
        } else {
            co_await lobby_->delete_key("joiner/" + std::to_string(next));
            co_await lobby_->delete_key("ticket/" + std::to_string(next));
        }
        ++next;
    }
    const bool enough = static_cast<int>(taken.size()) == need;
    for (std::int64_t n : taken) {
        co_await lobby_->set("verdict/" + std::to_string(n), enough ? "go" : "again");
    }
    // A joiner sent to wait again comes back under a new number: its old one is done with.
    co_await lobby_->add(enough ? "admitted" : "withdrawn",
                         static_cast<std::int64_t>(taken.size()));
    if (!enough) {
        throw std::runtime_error(
            prefix("grow") + "group '" + name_ + "' was to grow to " + std::to_string(new_size) +
            " ranks, but " + std::to_string(taken.size()) + " of the " + std::to_string(need) +
            " process(es) it needs called join_process_group within " +
            std::to_string(join_window.count()) + " ms (those that came wait for the next grow)");
    }
    co_return k;
}

COROCOLL_DECL task<std::shared_ptr<process_group>> process_group::grow(
    int new_size, std::chrono::milliseconds join_window) {
    check_open("grow");
    if (!lobby_) {
        throw std::logic_error(prefix("grow") + "group '" + name_ +
                               "' was made by new_group or split: only groups made by "
                               "init_process_group, shrink or grow can grow");
    }
    if (new_size <= size()) {
        throw std::invalid_argument(prefix("grow") + "new size " + std::to_string(new_size) +
                                    " is not larger than group '" + name_ + "''s " +
                                    std::to_string(size()));
    }
    check_lobby("grow");
    // Rank 0 admits the joiners and sends the grow's number, or -1 when too few came; the
    // others learn either from the broadcast (which fails if this group does).
    std::array<std::int64_t, 1> k{-1};
    std::exception_ptr failed;
    if (rank() == 0) {
        try {
            k[0] = co_await admit(new_size - size(), new_size, join_window);
        } catch (...) {
            failed = std::current_exception();
        }
    }
    co_await broadcast(k, 0);
    if (failed) std::rethrow_exception(failed);
    if (k[0] < 1) {
        throw std::runtime_error(prefix("grow") + "group '" + name_ + "' was to grow to " +
                                 std::to_string(new_size) + " ranks, but rank 0 did not see " +
                                 std::to_string(new_size - size()) +
                                 " process(es) call join_process_group within " +
                                 std::to_string(join_window.count()) + " ms");
    }
    const std::string round = std::to_string(k[0]);
    COROCOLL_LOG(info, "FT", "grow of group '", name_, "' to ", new_size, " ranks (grow ", round,
                 ")");
    auto g = co_await detail::build_group(
        reactor_, std::make_shared<rendezvous::prefix_store>(round + "/group", lobby_), rank(),
        new_size, lobby_name_ + "/grow" + round, timeout_, limits_, listen_on_,
        store_at_ == 0 ? hosted_ : nullptr, {}, join_window);
    g->set_lobby(lobby_, lobby_name_);
    // The lobby is in the store rank 0 of the first group serves (the chain's first).
    g->stand_ins_ = stand_ins_;
    g->store_at_ = 0;
    co_return g;
}

COROCOLL_DECL std::shared_ptr<rendezvous::store> process_group::watched_store(
    const char* call, const std::string& name) {
    return std::make_shared<detail::parent_watched_store>(store_, engine_, name_,
                                                          std::string(call) + " '" + name + "'");
}

COROCOLL_DECL task<std::shared_ptr<process_group>> process_group::set_up_subgroup(
    task<std::shared_ptr<process_group>> set_up, const char* call, std::string name) {
    std::exception_ptr error;
    try {
        co_return co_await std::move(set_up);
    } catch (...) {
        error = std::current_exception();
    }
    // A subgroup's own connection to a rank that died may end before the parent's readers
    // have read the same: give them a moment, so that the error names the rank that died.
    if (!engine_.failed()) co_await engine_.catch_up();
    if (engine_.failed()) {
        throw detail::parent_failed_error(engine_, name_, std::string(call) + " '" + name + "'");
    }
    std::rethrow_exception(error);
}

COROCOLL_DECL task<std::shared_ptr<process_group>> process_group::split(int colour, int key) {
    std::vector<std::pair<int, int>> all;
    co_await all_gather_object(all, std::pair<int, int>{colour, key});
    int k = ++subgroups_;
    if (colour < 0) co_return nullptr;
    std::vector<std::pair<int, int>> members;  // (key, rank) of my colour
    for (int p = 0; p < size(); ++p) {
        if (all[static_cast<std::size_t>(p)].first == colour) {
            members.emplace_back(all[static_cast<std::size_t>(p)].second, p);
        }
    }
    std::sort(members.begin(), members.end());
    int index = 0;
    while (members[static_cast<std::size_t>(index)].second != rank()) ++index;
    std::string name = name_ + "/split" + std::to_string(k) + "." + std::to_string(colour);
    auto store = std::make_shared<rendezvous::prefix_store>(
        "split/" + std::to_string(k) + "/" + std::to_string(colour), watched_store("split", name));
    auto group = co_await set_up_subgroup(
        detail::build_group(reactor_, std::move(store), index, static_cast<int>(members.size()),
                            name, timeout_, limits_, listen_on_, nullptr, engine_.failure_token()),
        "split", name);
    group->store_ = std::make_shared<rendezvous::prefix_store>(
        "split/" + std::to_string(k) + "/" + std::to_string(colour), store_);  // as new_group's
    group->stand_ins_ = stand_ins_;
    group->store_at_ = store_at_;
    std::erase_if(made_, [](const auto& w) { return w.expired(); });
    made_.push_back(group);
    co_return group;
}

COROCOLL_END_NAMESPACE
