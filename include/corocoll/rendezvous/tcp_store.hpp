#pragma once

#include <corocoll/core/async_mutex.hpp>
#include <corocoll/core/async_scope.hpp>
#include <corocoll/core/error.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/io/endpoint.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/io/socket.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/version.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <cstring>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {

namespace detail {

// torch 1.13's c10d TCPStore wire protocol. A request is one query byte followed by its
// arguments; strings and byte vectors go as a native-endian uint64 length and the bytes, and
// integers as native-endian int64. Replies: SET none; COMPARE_SET and GET a byte vector; ADD,
// GETNUMKEYS and DELETE_KEY an int64; CHECK one byte (READY 0, NOT_READY 1); WAIT one byte
// (STOP_WAITING 0) sent once every key exists. ADD stores its result as decimal text.
enum class query : std::uint8_t {
    set = 0,
    compare_set = 1,
    get = 2,
    add = 3,
    check = 4,
    wait = 5,
    get_num_keys = 6,
    watch_key = 7,
    delete_key = 8,
};
inline constexpr std::uint8_t check_ready = 0;
inline constexpr std::uint8_t check_not_ready = 1;
inline constexpr std::uint8_t wait_stop_waiting = 0;

/// The largest key, value and key count a store server accepts; larger lengths in a request
/// mean a broken or hostile client, whose connection is closed.
inline constexpr std::uint64_t max_key_bytes = std::uint64_t{1} << 16;
inline constexpr std::uint64_t max_value_bytes = std::uint64_t{1} << 30;
inline constexpr std::uint64_t max_keys_per_request = std::uint64_t{1} << 16;

/// Appends wire-format fields to a request or reply.
class wire_writer {
public:
    void u8(std::uint8_t v) { buf_.push_back(static_cast<char>(v)); }
    void i64(std::int64_t v) { raw(&v, sizeof(v)); }
    void u64(std::uint64_t v) { raw(&v, sizeof(v)); }
    void bytes(const std::string& s) {
        u64(s.size());
        buf_ += s;
    }
    std::span<const std::byte> view() const noexcept {
        return std::as_bytes(std::span<const char>(buf_.data(), buf_.size()));
    }
    void clear() noexcept { buf_.clear(); }

private:
    void raw(const void* p, std::size_t n) { buf_.append(static_cast<const char*>(p), n); }
    std::string buf_;
};

/// Reads wire-format fields from a socket, each bounded by the caller's options.
class wire_reader {
public:
    wire_reader(io::socket& s, io::op_options o) : s_(s), o_(std::move(o)) {}

    task<std::uint8_t> u8() {
        std::uint8_t v = 0;
        co_await s_.recv(std::as_writable_bytes(std::span(&v, 1)), o_);
        co_return v;
    }
    task<std::int64_t> i64() {
        std::int64_t v = 0;
        co_await s_.recv(std::as_writable_bytes(std::span(&v, 1)), o_);
        co_return v;
    }
    task<std::uint64_t> u64() {
        std::uint64_t v = 0;
        co_await s_.recv(std::as_writable_bytes(std::span(&v, 1)), o_);
        co_return v;
    }
    task<std::string> bytes(std::uint64_t limit, const char* what) {
        std::uint64_t n = co_await u64();
        if (n > limit) {
            corocoll::detail::throw_error(corocoll::errc::message_too_large,
                                          "corocoll: store: " + std::string(what) + " of " +
                                              std::to_string(n) + " bytes from " +
                                              s_.peer().to_string() + " exceeds the limit of " +
                                              std::to_string(limit));
        }
        std::string out(n, '\0');
        co_await s_.recv(std::as_writable_bytes(std::span(out.data(), out.size())), o_);
        co_return out;
    }

private:
    io::socket& s_;
    io::op_options o_;
};

}  // namespace detail

/// What a `tcp_store_server` has done and holds, for tests and monitoring. Counters only grow;
/// the others are the state at the time of `tcp_store_server::stats()`.
struct tcp_store_server_stats {
    std::uint64_t connections_accepted = 0;
    /// Accepts that failed for a reason other than the server stopping (EMFILE, say).
    std::uint64_t accept_failures = 0;
    std::uint64_t open_connections = 0;
    /// WAIT requests whose keys are not all there yet.
    std::uint64_t parked_waits = 0;
};

/// Tag for `tcp_store_server`'s constructor that binds without starting the server's thread.
struct deferred_start_t {
    explicit deferred_start_t() = default;
};
inline constexpr deferred_start_t deferred_start{};

/// A TCP key-value store server speaking torch 1.13's TCPStore protocol, so that torch's
/// clients and corocoll's `tcp_store` can both use it. It runs on a thread of its own, with its
/// own reactor, so a busy rank never stalls the others' rendezvous. Binds in the constructor
/// (port 0: the kernel picks one; errors such as "address already in use" are thrown there,
/// naming the address); the destructor stops it and joins its thread. Serves any number of
/// concurrent clients, one coroutine each.
class tcp_store_server {
public:
    explicit tcp_store_server(io::endpoint where) : tcp_store_server(where, deferred_start) {
        start();
    }

    /// Binds and listens in the calling thread but starts no thread until `start()`: a process
    /// that forks children which do more than exec (`spawn`) forks them before any thread
    /// exists, so that no child inherits a lock another thread held (malloc's under a
    /// sanitizer, say). Clients that connect before `start()` wait in the listen backlog.
    tcp_store_server(io::endpoint where, deferred_start_t)
        : listener_(io::acceptor::listen_unattached(where)), local_(listener_.local_endpoint()) {}

    tcp_store_server(const tcp_store_server&) = delete;
    tcp_store_server& operator=(const tcp_store_server&) = delete;
    ~tcp_store_server() {
        if (!thread_.joinable()) return;
        reactor_->post(shutdown_);
        thread_.join();
    }

    /// Starts serving on the server's own thread (once).
    void start() {
        if (thread_.joinable()) return;
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

    /// The listening descriptor: a forked child that will not serve closes its copy.
    int native_listen_handle() const noexcept { return listener_.native_handle(); }

    /// The address the server listens on (with the port the kernel picked, for port 0).
    const io::endpoint& local_endpoint() const noexcept { return local_; }
    std::uint16_t port() const noexcept { return local_.port(); }

    /// A snapshot of the server's counters (any thread; each value is read on its own).
    tcp_store_server_stats stats() const noexcept {
        tcp_store_server_stats out;
        out.connections_accepted = counters_.connections_accepted.load(std::memory_order_relaxed);
        out.accept_failures = counters_.accept_failures.load(std::memory_order_relaxed);
        out.open_connections = counters_.open_connections.load(std::memory_order_relaxed);
        out.parked_waits = counters_.parked_waits.load(std::memory_order_relaxed);
        return out;
    }

private:
    struct counters {
        std::atomic<std::uint64_t> connections_accepted{0};
        std::atomic<std::uint64_t> accept_failures{0};
        std::atomic<std::uint64_t> open_connections{0};
        std::atomic<std::uint64_t> parked_waits{0};
    };

    struct waiter {
        std::size_t missing = 0;
        std::coroutine_handle<> handle;
    };

    struct shutdown_item : corocoll::detail::work_item {
        tcp_store_server* self = nullptr;
    };

    // Suspends a connection until every key in `keys` exists (or the server stops).
    struct park_awaiter {
        tcp_store_server& server;
        const std::vector<std::string>& keys;
        waiter w{};
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<> h) {
            w.handle = h;
            for (const auto& k : keys) {
                if (server.data_.count(k) == 0) {
                    ++w.missing;
                    server.waiting_[k].push_back(&w);
                }
            }
        }
        void await_resume() const noexcept {}
    };
    park_awaiter park(const std::vector<std::string>& keys) { return park_awaiter{*this, keys}; }

    void main(std::promise<void>& ready) {
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

    // On the server's thread: cancels the accept loop and every connection's pending read,
    // and releases clients parked in WAIT.
    void stop_all() noexcept {
        stopping_ = true;
        stop_.request_stop();
        for (auto& [key, list] : waiting_) {
            for (waiter* w : list) {
                if (w->handle) std::exchange(w->handle, {}).resume();
            }
        }
        waiting_.clear();
    }

    task<> serve(io::acceptor& listener) {
        async_scope connections;
        while (!stopping_) {
            try {
                io::socket s = co_await listener.accept(stop_.get_token());
                counters_.connections_accepted.fetch_add(1, std::memory_order_relaxed);
                connections.spawn(handle(std::move(s)));
            } catch (const std::system_error&) {
                if (!stopping_) counters_.accept_failures.fetch_add(1, std::memory_order_relaxed);
                // Cancelled at shutdown, or a transient accept failure (EMFILE, ECONNABORTED):
                // the loop condition tells which.
            }
        }
        co_await connections.join();
    }

    task<> handle(io::socket s) {
        counters_.open_connections.fetch_add(1, std::memory_order_relaxed);
        struct on_exit {
            std::atomic<std::uint64_t>& open;
            ~on_exit() { open.fetch_sub(1, std::memory_order_relaxed); }
        } closing{counters_.open_connections};
        detail::wire_writer out;
        detail::wire_reader in(s, io::op_options(stop_.get_token()));
        try {
            for (;;) {
                std::uint8_t q = 0;
                std::size_t got = co_await s.recv_some(std::as_writable_bytes(std::span(&q, 1)),
                                                       stop_.get_token());
                if (got == 0 || stopping_) co_return;
                out.clear();
                if (!co_await serve_one(static_cast<detail::query>(q), in, out, s)) co_return;
                if (!out.view().empty()) co_await s.send(out.view(), stop_.get_token());
            }
        } catch (const std::exception&) {
            // A client that goes away or breaks the protocol loses its connection; the store
            // and the other clients carry on.
        }
    }

    // Handles one request; false when the connection must close (unknown query, shutdown).
    task<bool> serve_one(detail::query q, detail::wire_reader& in, detail::wire_writer& out,
                         io::socket& s) {
        using detail::max_key_bytes;
        using detail::max_value_bytes;
        switch (q) {
            case detail::query::set: {
                std::string key = co_await in.bytes(max_key_bytes, "key");
                std::string value = co_await in.bytes(max_value_bytes, "value");
                put(std::move(key), std::move(value));
                co_return true;
            }
            case detail::query::compare_set: {
                std::string key = co_await in.bytes(max_key_bytes, "key");
                std::string expected = co_await in.bytes(max_value_bytes, "expected value");
                std::string desired = co_await in.bytes(max_value_bytes, "desired value");
                auto it = data_.find(key);
                if (it == data_.end()) {
                    if (expected.empty()) {
                        put(key, desired);
                        out.bytes(desired);
                    } else {
                        out.bytes(expected);
                    }
                } else if (it->second == expected) {
                    it->second = desired;
                    out.bytes(desired);
                } else {
                    out.bytes(it->second);
                }
                co_return true;
            }
            case detail::query::get: {
                std::string key = co_await in.bytes(max_key_bytes, "key");
                auto it = data_.find(key);
                // torch's server has no answer for a missing key either: clients WAIT first.
                if (it == data_.end()) co_return false;
                out.bytes(it->second);
                co_return true;
            }
            case detail::query::add: {
                std::string key = co_await in.bytes(max_key_bytes, "key");
                std::int64_t delta = co_await in.i64();
                std::int64_t value = delta;
                if (auto it = data_.find(key); it != data_.end()) {
                    value += rendezvous::detail::parse_store_int(key, it->second);
                }
                put(std::move(key), std::to_string(value));
                out.i64(value);
                co_return true;
            }
            case detail::query::check: {
                auto keys = co_await read_keys(in);
                out.u8(all_present(keys) ? detail::check_ready : detail::check_not_ready);
                co_return true;
            }
            case detail::query::wait: {
                auto keys = co_await read_keys(in);
                if (!all_present(keys)) {
                    counters_.parked_waits.fetch_add(1, std::memory_order_relaxed);
                    co_await park(keys);
                    counters_.parked_waits.fetch_sub(1, std::memory_order_relaxed);
                    if (stopping_) co_return false;
                }
                out.u8(detail::wait_stop_waiting);
                co_return true;
            }
            case detail::query::get_num_keys:
                out.i64(static_cast<std::int64_t>(data_.size()));
                co_return true;
            case detail::query::delete_key: {
                std::string key = co_await in.bytes(max_key_bytes, "key");
                out.i64(static_cast<std::int64_t>(data_.erase(key)));
                co_return true;
            }
            case detail::query::watch_key:
                break;
        }
        (void)s;
        co_return false;
    }

    task<std::vector<std::string>> read_keys(detail::wire_reader& in) {
        std::uint64_t n = co_await in.u64();
        if (n > detail::max_keys_per_request) {
            corocoll::detail::throw_error(corocoll::errc::message_too_large,
                                          "corocoll: store: too many keys in one request");
        }
        std::vector<std::string> keys;
        keys.reserve(n);
        for (std::uint64_t i = 0; i < n; ++i) {
            keys.push_back(co_await in.bytes(detail::max_key_bytes, "key"));
        }
        co_return keys;
    }

    bool all_present(const std::vector<std::string>& keys) const {
        return std::all_of(keys.begin(), keys.end(),
                           [&](const std::string& k) { return data_.count(k) != 0; });
    }

    void put(std::string key, std::string value) {
        auto [it, inserted] = data_.insert_or_assign(std::move(key), std::move(value));
        if (!inserted) return;
        auto w = waiting_.find(it->first);
        if (w == waiting_.end()) return;
        auto list = std::move(w->second);
        waiting_.erase(w);
        for (waiter* one : list) {
            if (--one->missing == 0 && one->handle) std::exchange(one->handle, {}).resume();
        }
    }

    io::acceptor listener_;
    io::endpoint local_;
    std::thread thread_;
    io::reactor* reactor_ = nullptr;
    shutdown_item shutdown_;
    std::stop_source stop_;
    bool stopping_ = false;
    std::unordered_map<std::string, std::string> data_;
    std::unordered_map<std::string, std::vector<waiter*>> waiting_;
    counters counters_;
};

/// A client of a TCP store (`tcp_store_server`, or torch 1.13's TCPStore server, launcher
/// agents included). One connection, used by one request at a time in the order they are
/// made; it lives on the reactor of the thread that connected. Every request has a deadline
/// of the store's timeout. A `wait` that times out leaves the server's answer in flight, so
/// the client drops the connection and opens a new one for the next request.
///
/// Like torch's client, it sends every key with a leading '/' (`set("a")` puts "/a" on the
/// wire), so that a key names the same entry for a torch client and for this one, and a
/// `prefix_store` over it produces the keys torchrun's workers use.
class tcp_store final : public store {
public:
    /// Connects to `server`, retrying with exponential backoff and jitter while the server is
    /// not up yet, for up to `timeout` (the store's timeout afterwards too).
    static task<std::shared_ptr<tcp_store>> connect(io::reactor& r, io::endpoint server,
                                                    duration timeout = default_timeout) {
        std::shared_ptr<tcp_store> s(new tcp_store(r, server, timeout));
        co_await s->reconnect(timeout);
        co_return s;
    }

    const io::endpoint& server() const noexcept { return server_; }

    task<> set(std::string key, std::string value) override {
        auto lock = co_await mutex_.scoped_lock();
        detail::wire_writer w;
        w.u8(static_cast<std::uint8_t>(detail::query::set));
        w.bytes(wire_key(key));
        w.bytes(value);
        co_await request(w, "set '" + key + "'");
    }

    task<std::string> get(std::string key) override {
        // Named: g++ 12.2 rejects an initializer_list temporary inside co_await
        // ("array used as initializer").
        std::vector<std::string> keys{key};
        co_await wait(std::move(keys), timeout());
        auto lock = co_await mutex_.scoped_lock();
        detail::wire_writer w;
        w.u8(static_cast<std::uint8_t>(detail::query::get));
        w.bytes(wire_key(key));
        std::string what = "get '" + key + "'";
        auto in = co_await request(w, what);
        co_return co_await guarded(in.bytes(detail::max_value_bytes, "value"), what);
    }

    task<std::int64_t> add(std::string key, std::int64_t delta) override {
        auto lock = co_await mutex_.scoped_lock();
        detail::wire_writer w;
        w.u8(static_cast<std::uint8_t>(detail::query::add));
        w.bytes(wire_key(key));
        w.i64(delta);
        std::string what = "add to '" + key + "'";
        auto in = co_await request(w, what);
        co_return co_await guarded(in.i64(), what);
    }

    task<std::string> compare_set(std::string key, std::string expected,
                                  std::string desired) override {
        auto lock = co_await mutex_.scoped_lock();
        detail::wire_writer w;
        w.u8(static_cast<std::uint8_t>(detail::query::compare_set));
        w.bytes(wire_key(key));
        w.bytes(expected);
        w.bytes(desired);
        std::string what = "compare_set '" + key + "'";
        auto in = co_await request(w, what);
        co_return co_await guarded(in.bytes(detail::max_value_bytes, "value"), what);
    }

    task<> wait(std::vector<std::string> keys, duration timeout) override {
        auto lock = co_await mutex_.scoped_lock();
        detail::wire_writer w;
        w.u8(static_cast<std::uint8_t>(detail::query::wait));
        w.u64(keys.size());
        for (const auto& k : keys) w.bytes(wire_key(k));
        std::string what = "wait for " + rendezvous::detail::join_keys(keys);
        auto in = co_await request(w, what, timeout);
        std::uint8_t reply = co_await guarded(in.u8(), what, timeout);
        if (reply != detail::wait_stop_waiting) {
            broken_ = true;
            corocoll::detail::throw_error(corocoll::errc::protocol_error,
                                          "corocoll: store " + server_.to_string() + ": " + what +
                                              ": unexpected reply " + std::to_string(reply));
        }
    }
    using store::wait;

    task<bool> check(std::vector<std::string> keys) override {
        auto lock = co_await mutex_.scoped_lock();
        detail::wire_writer w;
        w.u8(static_cast<std::uint8_t>(detail::query::check));
        w.u64(keys.size());
        for (const auto& k : keys) w.bytes(wire_key(k));
        std::string what = "check " + rendezvous::detail::join_keys(keys);
        auto in = co_await request(w, what);
        co_return co_await guarded(in.u8(), what) == detail::check_ready;
    }

    task<bool> delete_key(std::string key) override {
        auto lock = co_await mutex_.scoped_lock();
        detail::wire_writer w;
        w.u8(static_cast<std::uint8_t>(detail::query::delete_key));
        w.bytes(wire_key(key));
        std::string what = "delete '" + key + "'";
        auto in = co_await request(w, what);
        co_return co_await guarded(in.i64(), what) > 0;
    }

    task<std::int64_t> num_keys() override {
        auto lock = co_await mutex_.scoped_lock();
        detail::wire_writer w;
        w.u8(static_cast<std::uint8_t>(detail::query::get_num_keys));
        auto in = co_await request(w, "num_keys");
        co_return co_await guarded(in.i64(), "num_keys");
    }

private:
    static std::string wire_key(const std::string& key) { return "/" + key; }

    tcp_store(io::reactor& r, io::endpoint server, duration timeout)
        : store(timeout), reactor_(r), server_(server) {}

    // Sends a request (reconnecting first if the connection was dropped) and returns a
    // reader for the reply, bounded by `timeout` (the store's timeout by default).
    task<detail::wire_reader> request(const detail::wire_writer& w, const std::string& what) {
        return request(w, what, timeout());
    }
    task<detail::wire_reader> request(const detail::wire_writer& w, std::string what,
                                      duration timeout) {
        if (broken_) co_await reconnect(this->timeout());
        io::op_options o(io::deadline_after(timeout));
        try {
            co_await sock_.send(w.view(), o);
        } catch (const std::system_error& e) {
            broken_ = true;
            fail(e, what);
        }
        co_return detail::wire_reader(sock_, o);
    }

    // Awaits one read of a reply; any failure leaves the stream unusable, so the connection
    // is dropped and the error says which request it was.
    template <class T>
    task<T> guarded(task<T> read, const std::string& what) {
        return guarded(std::move(read), what, timeout());
    }
    template <class T>
    task<T> guarded(task<T> read, std::string what, duration timeout) {
        try {
            co_return co_await std::move(read);
        } catch (const std::system_error& e) {
            broken_ = true;
            sock_.close();
            if (e.code() == std::errc::timed_out) {
                corocoll::detail::throw_error(
                    e.code(), "corocoll: store " + server_.to_string() + ": " + what +
                                  " timed out after " + std::to_string(timeout.count()) + " ms");
            }
            fail(e, what);
        }
    }

    [[noreturn]] void fail(const std::system_error& e, const std::string& what) {
        corocoll::detail::throw_error(e.code(), "corocoll: store " + server_.to_string() + ": " +
                                                    what + ": " + corocoll::detail::context_of(e));
    }

    task<> reconnect(duration timeout) {
        sock_.close();
        auto deadline = io::deadline_after(timeout);
        std::minstd_rand jitter(
            static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
        auto backoff = std::chrono::milliseconds(10);
        for (;;) {
            std::error_code last;
            try {
                sock_ = co_await io::socket::connect(reactor_, server_, deadline);
                broken_ = false;
                co_return;
            } catch (const std::system_error& e) {
                last = e.code();
                // Refused, reset or unreachable: the server may not be up yet. Anything else
                // (a bad address, say) will not get better by waiting.
                if (last != std::errc::connection_refused && last != std::errc::connection_reset &&
                    last != std::errc::timed_out && last != std::errc::network_unreachable &&
                    last != std::errc::host_unreachable) {
                    fail(e, "connect");
                }
            }
            auto now = std::chrono::steady_clock::now();
            if (now >= deadline) {
                corocoll::detail::throw_error(std::make_error_code(std::errc::timed_out),
                                              "corocoll: store: could not connect to " +
                                                  server_.to_string() + " within " +
                                                  std::to_string(timeout.count()) +
                                                  " ms (last error: " + last.message() + ")");
            }
            // Sleep backoff ± 25%, never past the deadline; double it up to a second.
            auto spread = backoff.count() / 2 + 1;
            auto sleep = std::chrono::milliseconds(backoff.count() * 3 / 4 +
                                                   static_cast<long>(jitter() % spread));
            co_await reactor_.sleep_until(std::min(now + sleep, deadline));
            backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
        }
    }

    io::reactor& reactor_;
    io::endpoint server_;
    io::socket sock_;
    bool broken_ = true;
    async_mutex mutex_;
};

}  // namespace rendezvous

COROCOLL_END_NAMESPACE
