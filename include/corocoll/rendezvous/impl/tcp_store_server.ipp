// The bodies of the non-template functions declared in <corocoll/rendezvous/tcp_store_server.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/rendezvous/tcp_store_server.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {

namespace detail {

COROCOLL_DECL std::optional<refusal> store_table::apply(store_request& r, wire_writer& out) {
    switch (r.q) {
        case query::set:
            put(r.keys[0], std::move(r.value));
            return std::nullopt;
        case query::compare_set: {
            const std::string& key = r.keys[0];
            auto it = data_.find(key);
            if (it == data_.end()) {
                if (r.value.empty()) {
                    put(key, r.desired);
                    out.bytes(r.desired);
                } else {
                    out.bytes(r.value);
                }
            } else if (it->second == r.value) {
                it->second = r.desired;
                out.bytes(r.desired);
            } else {
                out.bytes(it->second);
            }
            return std::nullopt;
        }
        case query::get: {
            auto it = data_.find(r.keys[0]);
            // torch's server has no answer for a missing key either: clients WAIT first.
            if (it == data_.end()) {
                return refusal{reply_status::invalid, "GET '" + r.keys[0] + "': no such key"};
            }
            out.bytes(it->second);
            return std::nullopt;
        }
        case query::add:
            return add(r.keys[0], r.delta, out);
        case query::check:
            out.u8(all_present(r.keys) ? check_ready : check_not_ready);
            return std::nullopt;
        case query::multi_get:
            for (const auto& k : r.keys) {
                if (data_.count(k) == 0) {
                    return refusal{reply_status::invalid,
                                   "MULTI_GET '" + k + "': no such key (WAIT for it first)"};
                }
            }
            for (const auto& k : r.keys) out.bytes(data_.find(k)->second);
            return std::nullopt;
        case query::get_num_keys:
            out.i64(static_cast<std::int64_t>(data_.size()));
            return std::nullopt;
        case query::delete_key:
            out.i64(static_cast<std::int64_t>(data_.erase(r.keys[0])));
            return std::nullopt;
        case query::append: {
            auto it = data_.find(r.keys[0]);
            if (it == data_.end()) {
                put(r.keys[0], std::move(r.value));
            } else if (it->second.size() + r.value.size() > max_value_bytes_) {
                return refusal{reply_status::too_large,
                               "APPEND to '" + r.keys[0] + "': the value would exceed the " +
                                   "server's limit of " + std::to_string(max_value_bytes_) +
                                   " bytes; it is unchanged"};
            } else {
                it->second += r.value;
            }
            return std::nullopt;
        }
        case query::multi_set:
            for (std::size_t i = 0; i < r.keys.size(); ++i) put(r.keys[i], std::move(r.values[i]));
            return std::nullopt;
        case query::list_keys:
            out.i64(static_cast<std::int64_t>(data_.size()));
            for (const auto& [key, value] : data_) out.bytes(key);
            return std::nullopt;
        case query::ping: {
            const auto nonce = static_cast<std::uint32_t>(r.delta);
            out.raw(&nonce, sizeof(nonce));
            return std::nullopt;
        }
        case query::validate:
            return std::nullopt;
        case query::cancel_wait:
            // No WAIT parked (it was answered before this came): torch 2.x's client reads the
            // late answer, then this one.
            out.u8(wait_canceled);
            return std::nullopt;
        default:
            return refusal{reply_status::unsupported, "not a request the table applies"};
    }
}

COROCOLL_DECL bool store_table::all_present(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(),
                       [&](const std::string& k) { return data_.count(k) != 0; });
}

COROCOLL_DECL void store_table::park(waiter& w, const std::vector<std::string>& keys) {
    for (const auto& k : keys) {
        if (data_.count(k) != 0) continue;
        ++w.missing;
        waiting_[k].push_back(&w);
    }
}

COROCOLL_DECL void store_table::unpark(waiter& w, const std::vector<std::string>& keys) noexcept {
    for (const auto& k : keys) {
        auto it = waiting_.find(k);
        if (it == waiting_.end()) continue;
        auto& list = it->second;
        list.erase(std::remove(list.begin(), list.end(), &w), list.end());
        if (list.empty()) waiting_.erase(it);
    }
}

COROCOLL_DECL std::optional<refusal> store_table::add(const std::string& key, std::int64_t delta,
                                                      wire_writer& out) {
    std::int64_t value = delta;
    if (auto it = data_.find(key); it != data_.end()) {
        std::int64_t old = 0;
        try {
            old = rendezvous::detail::parse_store_int(key, it->second);
        } catch (const std::invalid_argument&) {
            return refusal{reply_status::invalid,
                           "ADD to '" + key + "': its value is not an integer"};
        }
        if (__builtin_add_overflow(old, delta, &value)) {
            return refusal{reply_status::overflow,
                           "ADD of " + std::to_string(delta) + " to '" + key + "' (now " +
                               std::to_string(old) +
                               ") would overflow int64; the value is unchanged"};
        }
    }
    put(key, std::to_string(value));
    out.i64(value);
    return std::nullopt;
}

COROCOLL_DECL void store_table::put(const std::string& key, std::string value) {
    auto [it, inserted] = data_.insert_or_assign(key, std::move(value));
    if (!inserted) return;
    auto w = waiting_.find(it->first);
    if (w == waiting_.end()) return;
    auto list = std::move(w->second);
    waiting_.erase(w);
    for (waiter* one : list) {
        if (--one->missing == 0) one->ready(*one);
    }
}

COROCOLL_DECL void byte_buffer::consume(std::size_t n) noexcept {
    begin_ += n;
    if (begin_ == end_) begin_ = end_ = 0;
}

COROCOLL_DECL std::span<std::byte> byte_buffer::prepare(std::size_t n, std::size_t capacity) {
    if (capacity_ - end_ < n) {
        std::size_t have = size();
        if (capacity < have + n) capacity = have + n;
        if (capacity > capacity_) {
            auto bigger = std::make_unique_for_overwrite<char[]>(capacity);
            if (have != 0) std::memcpy(bigger.get(), data_.get() + begin_, have);
            data_ = std::move(bigger);
            capacity_ = capacity;
        } else {
            std::memmove(data_.get(), data_.get() + begin_, have);
        }
        begin_ = 0;
        end_ = have;
    }
    return std::as_writable_bytes(std::span(data_.get() + end_, n));
}

COROCOLL_DECL void byte_buffer::shrink(std::size_t capacity) {
    std::size_t have = size();
    if (capacity_ <= capacity || have > capacity) return;
    auto smaller = std::make_unique_for_overwrite<char[]>(capacity);
    if (have != 0) std::memcpy(smaller.get(), data_.get() + begin_, have);
    data_ = std::move(smaller);
    capacity_ = capacity;
    begin_ = 0;
    end_ = have;
}

}  // namespace detail

COROCOLL_DECL tcp_store_server::~tcp_store_server() {
    if (!thread_.joinable()) return;
    reactor_->post(shutdown_);
    thread_.join();
}

COROCOLL_DECL void tcp_store_server::start() {
    if (thread_.joinable()) return;
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0) {
        if (options_.raise_descriptor_limit && lim.rlim_cur < lim.rlim_max) {
            rlimit raised = lim;
            raised.rlim_cur = lim.rlim_max;
            if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
        }
        counters_.descriptor_limit.store(lim.rlim_cur, std::memory_order_relaxed);
    }
    std::promise<void> ready;
    auto started = ready.get_future();
    thread_ = std::thread([this, p = std::move(ready)]() mutable { main(p); });
    try {
        started.get();
    } catch (...) {
        thread_.join();
        throw;
    }
}

COROCOLL_DECL tcp_store_server_stats tcp_store_server::stats() const noexcept {
    auto get = [](const std::atomic<std::uint64_t>& a) {
        return a.load(std::memory_order_relaxed);
    };
    tcp_store_server_stats out;
    out.connections_accepted = get(counters_.connections_accepted);
    out.requests = get(counters_.requests);
    out.accept_failures = get(counters_.accept_failures);
    out.open_connections = get(counters_.open_connections);
    out.parked_waits = get(counters_.parked_waits);
    out.buffered_bytes = get(counters_.buffered_bytes);
    out.peak_buffered_bytes = get(counters_.peak_buffered_bytes);
    out.requests_refused = get(counters_.requests_refused);
    out.timed_out = get(counters_.timed_out);
    out.descriptor_limit = get(counters_.descriptor_limit);
    return out;
}

COROCOLL_DECL std::string tcp_store_server::last_accept_error() const {
    std::lock_guard lock(accept_error_mutex_);
    return accept_error_;
}

COROCOLL_DECL void tcp_store_server::accept_failed(std::error_code e, bool first_in_a_row) {
    std::string why = "corocoll: store server " + local_.to_string() + ": accept: " + e.message();
    if (e == std::errc::too_many_files_open) {
        rlimit lim{};
        ::getrlimit(RLIMIT_NOFILE, &lim);
        why += ": this process may hold " + std::to_string(lim.rlim_cur) +
               " descriptors (RLIMIT_NOFILE; hard limit " + std::to_string(lim.rlim_max) +
               ") and the store holds " +
               std::to_string(counters_.open_connections.load(std::memory_order_relaxed)) +
               " client connections; clients beyond wait unanswered until one leaves. Raise "
               "the limit (ulimit -n, or LimitNOFILE= of a service) to serve more";
    } else if (e == std::errc::too_many_files_open_in_system) {
        why += ": the system's descriptor table is full (fs.file-max); clients wait unanswered";
    }
    if (first_in_a_row) std::fprintf(stderr, "%s\n", why.c_str());
    std::lock_guard lock(accept_error_mutex_);
    accept_error_ = std::move(why);
}

COROCOLL_DECL void tcp_store_server::main(std::promise<void>& ready) {
    std::optional<io::reactor> r;
    try {
        r.emplace();
    } catch (...) {
        ready.set_exception(std::current_exception());
        return;
    }
    listener_.attach(*r);
    reactor_ = &*r;
    shutdown_.self = this;
    shutdown_.run_ = [](corocoll::detail::work_item* item) noexcept {
        static_cast<shutdown_item*>(item)->self->stop_all();
    };
    ready.set_value();
    r->run(serve(listener_));
}

COROCOLL_DECL void tcp_store_server::stop_all() noexcept {
    stopping_ = true;
    stop_.request_stop();
}

COROCOLL_DECL task<> tcp_store_server::serve(io::acceptor& listener) {
    async_scope connections;
    auto backoff = options_.accept_backoff_min;
    while (!stopping_) {
        std::error_code failed;
        try {
            io::socket s = co_await listener.accept(stop_.get_token());
            counters_.connections_accepted.fetch_add(1, std::memory_order_relaxed);
            connections.spawn(handle(std::move(s)));
            backoff = options_.accept_backoff_min;
            // A burst (thousands of ranks starting at once) is taken now, not one connection
            // per turn of the loop: where the listen queue overflows, the kernel drops the
            // handshake's last step and the client's first request waits for a retransmission
            // (a second or more; 9,307 overflows in one connect burst of 10,000 clients).
            for (std::size_t more = 0; more < accepts_per_turn; ++more) {
                std::optional<io::socket> next = listener.accept_ready();
                if (!next) break;
                counters_.connections_accepted.fetch_add(1, std::memory_order_relaxed);
                connections.spawn(handle(std::move(*next)));
            }
        } catch (const std::system_error& e) {
            failed = e.code();
        }
        if (!failed || stopping_) continue;
        counters_.accept_failures.fetch_add(1, std::memory_order_relaxed);
        // A connection that was reset before it was accepted is that client's problem;
        // anything else (EMFILE, ENFILE, ENOBUFS, ENOMEM) fails again if retried at once,
        // and would burn a core until a descriptor frees up.
        if (failed == std::errc::connection_aborted) continue;
        accept_failed(failed, backoff == options_.accept_backoff_min);
        try {
            co_await reactor_->sleep_for(backoff, stop_.get_token());
        } catch (const std::system_error&) {
            // Stopped: the loop condition ends it.
        }
        backoff = std::min(backoff * 2, options_.accept_backoff_max);
    }
    co_await connections.join();
}

COROCOLL_DECL std::vector<std::string> tcp_store_server::clients_elsewhere() const {
    // This process's own are a few (its ranks' clients): taken at once, not per peer.
    const auto own = detail::local_store_clients::instance().snapshot();
    std::vector<std::string> out;
    std::lock_guard lock(peers_mutex_);
    for (const auto& p : peers_) {
        if (own.count(p) == 0) out.push_back(p);
    }
    return out;
}

COROCOLL_DECL task<> tcp_store_server::handle(io::socket s) {
    counters_.open_connections.fetch_add(1, std::memory_order_relaxed);
    const std::string peer = s.peer().to_string();
    {
        std::lock_guard lock(peers_mutex_);
        peers_.insert(peer);
    }
    connection c{std::move(s), {}, {}, detail::request_parser(limits_)};
    try {
        co_await converse(c);
    } catch (const std::system_error& e) {
        // A client that goes away, breaks the protocol or misses a deadline loses its
        // connection; the store and the other clients carry on.
        if (e.code() == std::errc::timed_out) {
            counters_.timed_out.fetch_add(1, std::memory_order_relaxed);
        }
    } catch (const std::exception&) {
        // Out of memory for one request, say: the same.
    }
    c.sock.close();
    recharge(c, 0);
    {
        std::lock_guard lock(peers_mutex_);
        peers_.erase(peers_.find(peer));
    }
    counters_.open_connections.fetch_sub(1, std::memory_order_relaxed);
}

COROCOLL_DECL task<> tcp_store_server::converse(connection& c) {
    for (;;) {
        detail::parse_result p = c.parser.parse(c.in.view());
        if (p.status == detail::parse_status::incomplete) {
            if (unproven(c)) {
                if (auto no = unproven_refusal(c, p.bytes)) {
                    co_await refuse(c, std::move(*no));
                    co_return;
                }
            }
            if (!co_await receive(c, p.bytes)) co_return;
            continue;
        }
        if (p.status == detail::parse_status::refused) {
            co_await refuse(c, std::move(p.why));
            co_return;
        }
        c.in.consume(p.bytes);
        c.request_started = std::chrono::steady_clock::now();
        detail::store_request req = c.parser.take();
        counters_.requests.fetch_add(1, std::memory_order_relaxed);
        c.out.clear();
        if (c.status_replies) c.out.u8(static_cast<std::uint8_t>(detail::reply_status::ok));
        bool token = !options_.job_token.empty();
        if (token && !c.authenticated && req.q != detail::query::hello &&
            req.q != detail::query::auth) {
            // Named: g++ 12 frees a braced temporary in a co_await expression twice.
            detail::refusal why{detail::reply_status::denied,
                                "this store serves only clients that prove they know the "
                                "job token (COROCOLL_JOB_TOKEN): say HELLO and AUTH first"};
            co_await refuse(c, std::move(why));
            co_return;
        }
        if (req.q == detail::query::hello) {
            c.out.clear();
            c.status_replies = true;
            if (token) {
                c.server_nonce = corocoll::detail::auth_random_nonce();
                c.out.u64(detail::hello_auth_magic);
                c.out.raw(c.server_nonce->data(), c.server_nonce->size());
            } else {
                c.out.u64(detail::hello_magic);
            }
        } else if (req.q == detail::query::auth) {
            if (auto no = authenticate(c, req.value)) {
                co_await refuse(c, std::move(*no));
                co_return;
            }
        } else if (req.q == detail::query::wait) {
            wait_end end = wait_end::ready;
            if (!table_.all_present(req.keys)) end = co_await park(c, req.keys);
            if (end == wait_end::gone) co_return;
            c.out.u8(end == wait_end::ready ? detail::wait_stop_waiting : detail::wait_canceled);
        } else if (auto no = table_.apply(req, c.out)) {
            co_await refuse(c, std::move(*no));
            co_return;
        }
        if (c.out.size() != 0) {
            if (!recharge(c, c.in.capacity() + c.out.capacity())) {
                co_await refuse(c, busy("the reply of " + std::to_string(c.out.size()) + " bytes"));
                co_return;
            }
            co_await c.sock.send(c.out.view(), send_options());
        }
        // Give back what a large request or reply took.
        if (c.out.capacity() > read_step) c.out.release();
        c.in.shrink(std::max(small_buffer, c.in.size()));
        recharge(c, c.in.capacity() + c.out.capacity());
    }
}

COROCOLL_DECL std::optional<detail::refusal> tcp_store_server::unproven_refusal(
    const connection& c, std::uint64_t need) const {
    auto view = c.in.view();
    if (!view.empty()) {
        auto q = static_cast<detail::query>(static_cast<unsigned char>(view[0]));
        if (q != detail::query::hello && q != detail::query::auth) {
            return detail::refusal{detail::reply_status::denied,
                                   "this store serves only clients that prove they know the "
                                   "job token (COROCOLL_JOB_TOKEN): say HELLO and AUTH first"};
        }
    }
    if (need > unproven_bytes) {
        return detail::refusal{detail::reply_status::denied,
                               "a request of " + std::to_string(need) +
                                   " bytes or more before the job token was proved (HELLO and "
                                   "AUTH take at most " +
                                   std::to_string(unproven_bytes) + ")"};
    }
    return std::nullopt;
}

COROCOLL_DECL task<bool> tcp_store_server::receive(connection& c, std::uint64_t need) {
    std::size_t have = c.in.size();
    std::size_t step = static_cast<std::size_t>(std::clamp<std::uint64_t>(
        need - std::min<std::uint64_t>(need, have), small_buffer, read_step));
    // Grow by doubling, but never past what the request needs.
    std::size_t capacity = c.in.capacity();
    if (capacity - have < step) {
        capacity = std::max(
            have + step,
            std::min<std::size_t>(2 * capacity, std::max<std::uint64_t>(need, have + step)));
    }
    const bool proving = unproven(c);
    if (proving) {
        // Never more than a HELLO and an AUTH need (`converse` refused anything longer).
        capacity = std::max(c.in.capacity(), unproven_bytes);
        step = unproven_bytes - std::min(have, unproven_bytes);
        if (step == 0) {
            co_await refuse(c, unproven_refusal(c, unproven_bytes + 1).value());
            co_return false;
        }
    }
    if (!recharge(c, capacity + c.out.capacity())) {
        co_await refuse(c, busy("a request of " + std::to_string(need) + " bytes or more"));
        co_return false;
    }
    auto room = c.in.prepare(step, capacity);
    auto deadline = std::chrono::steady_clock::time_point::max();
    if (have != 0) {
        deadline = c.request_started + options_.request_timeout;
    } else if (options_.idle_timeout.count() > 0) {
        deadline = io::deadline_after(options_.idle_timeout);
    }
    if (proving) deadline = std::min(deadline, c.accepted + options_.auth_timeout);
    std::size_t got = co_await c.sock.recv_some(room, io::op_options(deadline, stop_.get_token()));
    if (got == 0) {
        if (have != 0) {
            corocoll::detail::throw_error(corocoll::errc::connection_closed,
                                          "store: a client left mid-request");
        }
        co_return false;
    }
    if (have == 0) c.request_started = std::chrono::steady_clock::now();
    c.in.commit(got);
    co_return true;
}

COROCOLL_DECL task<tcp_store_server::wait_end> tcp_store_server::park(
    connection& c, const std::vector<std::string>& keys) {
    wait_state w;
    w.ready = &wait_state::on_ready;
    struct parked {
        tcp_store_server& server;
        wait_state& w;
        const std::vector<std::string>& keys;
        ~parked() {
            server.table_.unpark(w, keys);
            server.counters_.parked_waits.fetch_sub(1, std::memory_order_relaxed);
        }
    };
    table_.park(w, keys);
    counters_.parked_waits.fetch_add(1, std::memory_order_relaxed);
    parked guard{*this, w, keys};
    std::stop_callback on_stop(stop_.get_token(), [&w]() noexcept { w.wake.request_stop(); });
    while (w.missing != 0 && !stopping_) {
        if (c.in.size() >= max_behind_wait) co_return wait_end::gone;
        std::size_t got = 0;
        try {
            std::size_t capacity = std::max(c.in.capacity(), c.in.size() + small_buffer);
            if (!recharge(c, capacity + c.out.capacity())) co_return wait_end::gone;
            auto room = c.in.prepare(small_buffer, capacity);
            got = co_await c.sock.recv_some(room, w.wake.get_token());
        } catch (const std::system_error& e) {
            // Woken: the loop condition says why. Anything else: the client is gone.
            if (e.code() == std::errc::operation_canceled) continue;
            throw;
        }
        if (got == 0) co_return wait_end::gone;
        c.in.commit(got);
        if (c.parser.torch2() &&
            static_cast<unsigned char>(c.in.view()[0]) == detail::torch2_cancel_wait) {
            // Its client gave up: CANCEL_WAIT is answered in the WAIT's place.
            c.in.consume(1);
            co_return wait_end::canceled;
        }
    }
    co_return stopping_ ? wait_end::gone : wait_end::ready;
}

COROCOLL_DECL std::optional<detail::refusal> tcp_store_server::authenticate(
    connection& c, const std::string& proof) {
    namespace auth = corocoll::detail;
    if (options_.job_token.empty() || !c.server_nonce) {
        return detail::refusal{
            detail::reply_status::unsupported,
            options_.job_token.empty() ? "AUTH: this store has no job token" : "AUTH before HELLO"};
    }
    auth::auth_nonce client_nonce{};
    auth::auth_proof client_proof{};
    if (proof.size() != client_nonce.size() + client_proof.size()) {
        return detail::refusal{detail::reply_status::denied,
                               "AUTH: " + std::to_string(proof.size()) + " bytes, not " +
                                   std::to_string(client_nonce.size() + client_proof.size())};
    }
    std::memcpy(client_nonce.data(), proof.data(), client_nonce.size());
    std::memcpy(client_proof.data(), proof.data() + client_nonce.size(), client_proof.size());
    if (!auth::same_proof(client_proof, detail::store_proof(options_.job_token, true,
                                                            *c.server_nonce, client_nonce))) {
        return detail::refusal{detail::reply_status::denied,
                               "AUTH: the client did not prove that it knows this job's "
                               "token (is COROCOLL_JOB_TOKEN the same on every rank?)"};
    }
    c.authenticated = true;
    auto mine = detail::store_proof(options_.job_token, false, client_nonce, *c.server_nonce);
    c.out.u64(mine.size());
    c.out.raw(mine.data(), mine.size());
    return std::nullopt;
}

COROCOLL_DECL task<> tcp_store_server::refuse(connection& c, detail::refusal why) {
    counters_.requests_refused.fetch_add(1, std::memory_order_relaxed);
    if (!c.status_replies) co_return;
    c.out.clear();
    c.out.u8(static_cast<std::uint8_t>(why.status));
    if (why.reason.size() > detail::max_refusal_bytes) why.reason.resize(detail::max_refusal_bytes);
    c.out.bytes(why.reason);
    co_await c.sock.send(c.out.view(), send_options());
    c.sock.shutdown(SHUT_WR);
    auto deadline = io::deadline_after(options_.request_timeout);
    // A stranger's rest is drained no longer than it had to prove the token.
    std::size_t drain = small_buffer;
    if (unproven(c)) {
        deadline = std::min(deadline, c.accepted + options_.auth_timeout);
        drain = unproven_bytes;
    }
    c.in.consume(c.in.size());
    for (;;) {
        auto room = c.in.prepare(drain, std::max(c.in.capacity(), drain));
        std::size_t got =
            co_await c.sock.recv_some(room, io::op_options(deadline, stop_.get_token()));
        if (got == 0) co_return;
    }
}

COROCOLL_DECL detail::refusal tcp_store_server::busy(const std::string& what) const {
    return detail::refusal{
        detail::reply_status::busy,
        "store: " + what + " does not fit: the server holds " +
            std::to_string(counters_.buffered_bytes.load(std::memory_order_relaxed)) +
            " bytes of unfinished requests and replies, and its limit is " +
            std::to_string(options_.max_buffered_bytes)};
}

COROCOLL_DECL bool tcp_store_server::recharge(connection& c, std::uint64_t bytes) noexcept {
    std::uint64_t now = counters_.buffered_bytes.load(std::memory_order_relaxed);
    std::uint64_t next = now - c.charged + bytes;
    if (bytes > c.charged && next > options_.max_buffered_bytes) return false;
    c.charged = bytes;
    counters_.buffered_bytes.store(next, std::memory_order_relaxed);
    if (next > counters_.peak_buffered_bytes.load(std::memory_order_relaxed)) {
        counters_.peak_buffered_bytes.store(next, std::memory_order_relaxed);
    }
    return true;
}

}  // namespace rendezvous

COROCOLL_END_NAMESPACE
