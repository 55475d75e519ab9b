#pragma once

// The TCP store's server: a thread with its own reactor that serves torch's clients and
// corocoll's `tcp_store` over the protocol of store_protocol.hpp, with bounded memory and time
// per connection, and a job token that strangers must prove before anything else.

#include <corocoll/core/async_scope.hpp>
#include <corocoll/core/auth.hpp>
#include <corocoll/core/error.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/io/endpoint.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/io/socket.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/rendezvous/store_protocol.hpp>
#include <corocoll/version.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {

namespace detail {

/// The store's keys and values and the WAITs parked on missing keys, with no I/O: the server
/// applies parsed requests to it, and the fuzz target does too. A waiter is registered under
/// each of its missing keys; when the last of them appears, its `ready` is called (from
/// inside the SET, ADD or COMPARE_SET that made it), and it is listed nowhere any more.
/// `unpark` takes a waiter out of every list it is still in; the waiter's owner calls it
/// before the waiter is destroyed, whether or not it became ready.
class store_table {
public:
    struct waiter {
        std::size_t missing = 0;
        void (*ready)(waiter&) noexcept = nullptr;
    };

    /// Applies `r` (any query but WAIT and HELLO) and appends its reply to `out`; a refusal
    /// leaves the store as it was.
    std::optional<refusal> apply(store_request& r, wire_writer& out);

    bool all_present(const std::vector<std::string>& keys) const;

    /// Registers `w` under each key of `keys` that is missing (a key listed twice counts
    /// twice, and is woken twice by its one SET).
    void park(waiter& w, const std::vector<std::string>& keys);

    /// Takes `w` out of every list under `keys` that still holds it.
    void unpark(waiter& w, const std::vector<std::string>& keys) noexcept;

    std::size_t size() const noexcept { return data_.size(); }
    /// The longest value an APPEND may make.
    void set_max_value_bytes(std::uint64_t n) noexcept { max_value_bytes_ = n; }
    /// Keys that some waiter waits for.
    std::size_t awaited_keys() const noexcept { return waiting_.size(); }

private:
    std::optional<refusal> add(const std::string& key, std::int64_t delta, wire_writer& out);

    void put(const std::string& key, std::string value);

    std::unordered_map<std::string, std::string> data_;
    std::unordered_map<std::string, std::vector<waiter*>> waiting_;
    std::uint64_t max_value_bytes_ = std::uint64_t{64} << 20;
};

/// A connection's received bytes: grows as bytes arrive (never by what a request announces),
/// never zero-fills, and gives memory back after a large request.
class byte_buffer {
public:
    std::string_view view() const noexcept { return {data_.get() + begin_, end_ - begin_}; }
    std::size_t size() const noexcept { return end_ - begin_; }
    std::size_t capacity() const noexcept { return capacity_; }
    void consume(std::size_t n) noexcept;
    /// Room for `n` more bytes after the data; the capacity becomes at least `capacity`.
    std::span<std::byte> prepare(std::size_t n, std::size_t capacity);
    void commit(std::size_t n) noexcept { end_ += n; }
    /// Shrinks to `capacity` if the data fit.
    void shrink(std::size_t capacity);

private:
    std::unique_ptr<char[]> data_;
    std::size_t capacity_ = 0;
    std::size_t begin_ = 0;
    std::size_t end_ = 0;
};

}  // namespace detail

/// Limits and deadlines of a `tcp_store_server`. The defaults suit a rendezvous (keys and
/// values of bytes to kilobytes) with room to spare.
struct tcp_store_server_options {
    /// The largest value a SET or COMPARE_SET may carry. A larger one is refused as soon as
    /// its length arrives: corocoll's client hears why, naming the key; a torch client loses
    /// its connection, as with torch's own server on an error.
    std::uint64_t max_value_bytes = std::uint64_t{64} << 20;
    /// The bytes the server may hold, over all connections, in requests not yet complete and
    /// replies not yet sent. A request that needs more is refused (busy).
    std::uint64_t max_buffered_bytes = std::uint64_t{256} << 20;
    /// From a request's first byte to its last, and for sending a reply: a client that is
    /// slower loses its connection.
    std::chrono::milliseconds request_timeout = std::chrono::seconds(30);
    /// How long a connection may sit between requests; zero: for ever, the default, because
    /// torch 1.13's clients keep one connection for the whole job and never reconnect. A
    /// WAIT parked for its keys is not idle: it lasts until its keys appear or its client
    /// goes away.
    std::chrono::milliseconds idle_timeout{0};
    /// The accept loop's pause after a failed accept (out of descriptors, say), doubling
    /// from the first to the second after each failure in a row.
    std::chrono::milliseconds accept_backoff_min{10};
    /// The longest pause after failed accepts in a row.
    std::chrono::milliseconds accept_backoff_max{1000};
    /// The job's token (COROCOLL_JOB_TOKEN); empty: none. With one, the server serves only
    /// clients that prove they know it (corocoll's `tcp_store` given the same token), by
    /// challenge-response over fresh nonces; it refuses torch's clients, which cannot. Needs
    /// libcrypto (see core/auth.hpp).
    std::string job_token;
    /// With a job token: how long a new connection has to prove it (HELLO, then AUTH) before
    /// it is dropped. Until then it may hold `tcp_store_server::unproven_bytes` and send only
    /// those two requests, so that strangers cost the clients that hold the token nothing of
    /// the byte budget.
    std::chrono::milliseconds auth_timeout = std::chrono::seconds(10);
    /// Raise this process's soft RLIMIT_NOFILE to its hard limit when the server starts, so
    /// that it can hold as many clients as the system lets it (a server of 10,000 clients
    /// needs 10,000 descriptors; the usual soft limit is 1,024).
    bool raise_descriptor_limit = true;
};

/// What a `tcp_store_server` has done and holds, for tests and monitoring. Counters only grow;
/// the others are the state at the time of `tcp_store_server::stats()`.
struct tcp_store_server_stats {
    /// Connections accepted so far.
    std::uint64_t connections_accepted = 0;
    /// Requests received whole so far (HELLO and AUTH included; refused ones too).
    std::uint64_t requests = 0;
    /// Accepts that failed for a reason other than the server stopping (EMFILE, say).
    std::uint64_t accept_failures = 0;
    /// Connections open now.
    std::uint64_t open_connections = 0;
    /// WAIT requests whose keys are not all there yet.
    std::uint64_t parked_waits = 0;
    /// Bytes held for unfinished requests and unsent replies, now and at most.
    std::uint64_t buffered_bytes = 0;
    /// The most bytes held at once so far.
    std::uint64_t peak_buffered_bytes = 0;
    /// Requests refused (over a limit, an ADD that overflows, a missing key's GET, ...).
    std::uint64_t requests_refused = 0;
    /// Connections dropped because a request or reply missed its deadline, or the
    /// connection sat idle past its bound.
    std::uint64_t timed_out = 0;
    /// The process's soft RLIMIT_NOFILE when the server started (after raising it, see
    /// `tcp_store_server_options::raise_descriptor_limit`).
    std::uint64_t descriptor_limit = 0;
};

namespace detail {

// The local ends ("address:port") of this process's `tcp_store` connections, so that a server
// in the same process tells its own clients from other processes' (see
// `tcp_store_server::clients_elsewhere`). Any thread.
class local_store_clients {
public:
    static local_store_clients& instance() {
        static local_store_clients clients;
        return clients;
    }
    void add(const std::string& local_end) {
        std::lock_guard lock(mutex_);
        ends_.insert(local_end);
    }
    void remove(const std::string& local_end) {
        std::lock_guard lock(mutex_);
        auto at = ends_.find(local_end);
        if (at != ends_.end()) ends_.erase(at);
    }
    std::multiset<std::string> snapshot() const {
        std::lock_guard lock(mutex_);
        return ends_;
    }

private:
    mutable std::mutex mutex_;
    std::multiset<std::string> ends_;
};

}  // namespace detail

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
///
/// Hostile or broken clients cost bounded memory and time (`tcp_store_server_options`):
/// buffers grow as bytes arrive, up to one request's limit per connection and a budget over
/// all of them; a request must arrive whole within a deadline; a WAIT whose client goes away
/// is dropped with its descriptor; at EMFILE the accept loop backs off, and says which limit
/// (`last_accept_error`). It raises the process's descriptor limit as far as it may when it
/// starts, and has served 10,000 concurrent clients (benchmarks/store_load.cpp).
class tcp_store_server {
public:
    /// Listens on `where` (port 0: the kernel chooses; see `port()`) and serves from a thread
    /// of its own until destroyed.
    explicit tcp_store_server(io::endpoint where, tcp_store_server_options o = {})
        : tcp_store_server(where, deferred_start, o) {
        start();
    }

    /// Binds and listens in the calling thread but starts no thread until `start()`: a process
    /// that forks children which do more than exec (`spawn`) forks them before any thread
    /// exists, so that no child inherits a lock another thread held (malloc's under a
    /// sanitizer, say). Clients that connect before `start()` wait in the listen backlog.
    tcp_store_server(io::endpoint where, deferred_start_t, tcp_store_server_options o = {})
        : listener_(io::acceptor::listen_unattached(where)),
          local_(listener_.local_endpoint()),
          options_(o) {
        limits_.max_value_bytes = options_.max_value_bytes;
        table_.set_max_value_bytes(options_.max_value_bytes);
    }

    tcp_store_server(const tcp_store_server&) = delete;
    tcp_store_server& operator=(const tcp_store_server&) = delete;
    ~tcp_store_server();

    /// Starts serving on the server's own thread (once).
    void start();

    /// The listening descriptor: a forked child that will not serve closes its copy.
    int native_listen_handle() const noexcept { return listener_.native_handle(); }

    /// The address the server listens on (with the port the kernel picked, for port 0).
    const io::endpoint& local_endpoint() const noexcept { return local_; }
    /// The port listened on.
    std::uint16_t port() const noexcept { return local_.port(); }

    /// A snapshot of the server's counters (any thread; each value is read on its own).
    tcp_store_server_stats stats() const noexcept;

    /// The clients connected now that are not this process's own `tcp_store` connections
    /// ("address:port" of each, as the server sees it); any thread. A process that serves the
    /// store for a job keeps it up until those it saw have left (`process_group::close`).
    std::vector<std::string> clients_elsewhere() const;

    /// Why the last accept failed, naming the limit when it was the descriptors
    /// (RLIMIT_NOFILE); empty when none has. The server also writes it to standard error at
    /// the first failure of a run of them, since the clients it cannot accept see only a
    /// silent connection.
    std::string last_accept_error() const;

private:
    struct counters {
        std::atomic<std::uint64_t> connections_accepted{0};
        std::atomic<std::uint64_t> requests{0};
        std::atomic<std::uint64_t> accept_failures{0};
        std::atomic<std::uint64_t> open_connections{0};
        std::atomic<std::uint64_t> parked_waits{0};
        std::atomic<std::uint64_t> buffered_bytes{0};
        std::atomic<std::uint64_t> peak_buffered_bytes{0};
        std::atomic<std::uint64_t> requests_refused{0};
        std::atomic<std::uint64_t> timed_out{0};
        std::atomic<std::uint64_t> descriptor_limit{0};
    };

    struct shutdown_item : corocoll::detail::work_item {
        tcp_store_server* self = nullptr;
    };

public:
    /// With a job token, the most bytes a connection that has not proved it yet may have
    /// buffered: a HELLO (9 bytes) and an AUTH (73) with room to spare. A longer request, or
    /// one that is neither, is refused as soon as its header says so.
    static constexpr std::size_t unproven_bytes = 256;

private:
    // Reads happen in steps of at most this, and a buffer larger than this is given back
    // once its large request is done.
    static constexpr std::size_t read_step = std::size_t{256} << 10;
    static constexpr std::size_t small_buffer = 512;
    // Connections taken from the listen queue without waiting after each accept.
    static constexpr std::size_t accepts_per_turn = 256;
    // Bytes a client may send behind a WAIT that is not answered yet.
    static constexpr std::size_t max_behind_wait = std::size_t{64} << 10;

    // One client's connection: what it sent that is not handled yet, the reply being built,
    // and the bytes of both counted in the server's budget.
    struct connection {
        io::socket sock;
        detail::byte_buffer in;
        detail::wire_writer out;
        detail::request_parser parser;
        std::uint64_t charged = 0;  // bytes counted in counters_.buffered_bytes
        bool status_replies = false;
        // With a job token: the nonce this server sent at HELLO, and whether the client has
        // proved the token over it.
        std::optional<corocoll::detail::auth_nonce> server_nonce{};
        bool authenticated = false;
        std::chrono::steady_clock::time_point request_started{};
        std::chrono::steady_clock::time_point accepted = std::chrono::steady_clock::now();
    };

    // True while `c` must still prove the job token (see `unproven_bytes`).
    bool unproven(const connection& c) const noexcept {
        return !options_.job_token.empty() && !c.authenticated;
    }
    // What an unproven connection may not send, or nothing: a request that is not HELLO or
    // AUTH, or longer than `unproven_bytes` (`need`: the bytes it needs to go on).
    std::optional<detail::refusal> unproven_refusal(const connection& c, std::uint64_t need) const;

    // A WAIT's waiter: wakes its connection by cancelling the read that watches the client.
    struct wait_state : detail::store_table::waiter {
        std::stop_source wake;
        static void on_ready(detail::store_table::waiter& w) noexcept {
            static_cast<wait_state&>(w).wake.request_stop();
        }
    };

    void main(std::promise<void>& ready);

    // On the server's thread: cancels the accept loop, every connection's read and send, and
    // the reads of connections parked in WAIT (through their stop callbacks). Resumes
    // nothing itself: each connection ends in its own time, and its waiter with it.
    void stop_all() noexcept;

    task<> serve(io::acceptor& listener);

    task<> handle(io::socket s);

    // A reply is sent at once where the socket has room (it nearly always has: a client
    // reads its reply before it sends again), without the ring's round trip.
    io::op_options send_options() const {
        io::op_options o(io::deadline_after(options_.request_timeout), stop_.get_token());
        o.try_now = true;
        return o;
    }

    // Serves requests until the client leaves or must be dropped.
    task<> converse(connection& c);

    // Receives more of the request in progress, which needs `need` bytes in all to go on.
    // False when the client closed between requests.
    task<bool> receive(connection& c, std::uint64_t need);

    // How a parked WAIT ended.
    enum class wait_end { ready, canceled, gone };
    // Parks the connection until every key in `keys` exists. Meanwhile it reads from the
    // client, so that a client that goes away is noticed, and its WAIT dropped with its
    // descriptor; bytes that arrive are kept for the next request, but for a torch 2.x
    // client's CANCEL_WAIT, which ends the WAIT (`canceled`). `gone` when the connection must
    // close (the client left, or the server stops).
    task<wait_end> park(connection& c, const std::vector<std::string>& keys);

    // AUTH: checks the client's proof of the job token over this connection's nonces and
    // appends the server's own proof to the reply; why not, when the client did not prove it.
    std::optional<detail::refusal> authenticate(connection& c, const std::string& proof);

    // Tells a client that said HELLO why its request is refused, then closes. The rest of
    // the request is read and dropped first (within the request deadline), so that the
    // client finishes sending and reads the answer, rather than meeting a reset.
    task<> refuse(connection& c, detail::refusal why);

    detail::refusal busy(const std::string& what) const;

    // Records (and at the first of a run of failures, prints) why an accept failed.
    void accept_failed(std::error_code e, bool first_in_a_row);

    // Counts `bytes` for connection `c` in the server's budget instead of what it had; false
    // (and nothing changed) if that is more than the budget allows.
    bool recharge(connection& c, std::uint64_t bytes) noexcept;

    io::acceptor listener_;
    io::endpoint local_;
    tcp_store_server_options options_;
    detail::store_limits limits_;
    std::thread thread_;
    io::reactor* reactor_ = nullptr;
    shutdown_item shutdown_;
    std::stop_source stop_;
    bool stopping_ = false;
    detail::store_table table_;
    counters counters_;
    // The peers of the open connections, for `clients_elsewhere`.
    mutable std::mutex peers_mutex_;
    std::multiset<std::string> peers_;
    mutable std::mutex accept_error_mutex_;
    std::string accept_error_;
};

}  // namespace rendezvous

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/rendezvous/impl/tcp_store_server.ipp>
#endif
