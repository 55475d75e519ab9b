#pragma once

#include <corocoll/core/async_mutex.hpp>
#include <corocoll/core/async_scope.hpp>
#include <corocoll/core/error.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/io/endpoint.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/io/socket.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/transport/auth.hpp>
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
#include <string_view>
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
//
// corocoll's extension, which torch's clients never use: HELLO (0xC0) with the u64
// `hello_magic` is answered with the same u64, and from then on every reply on that
// connection starts with a `reply_status` byte. A status other than ok is followed by a byte
// vector naming the request and the reason, and the server then closes the connection. To a
// torch client (no HELLO) the server says nothing and closes, as torch's server does.
//
// A server with a job token answers HELLO with `hello_auth_magic` and a 32-byte nonce of its
// own instead, and serves nothing but AUTH (0xC1) on that connection until the client has
// proved it knows the token: AUTH carries a byte vector of the client's nonce and
// HMAC-SHA256(token, "corocoll store client" | server nonce | client nonce); the reply (after
// the status byte) is a byte vector of HMAC-SHA256(token, "corocoll store server" | client
// nonce | server nonce), so that the client knows the server too. Neither side ever sends
// the token. torch's clients cannot do this: a server with a token refuses them.
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
    hello = 0xC0,
    auth = 0xC1,
};
inline constexpr std::uint8_t check_ready = 0;
inline constexpr std::uint8_t check_not_ready = 1;
inline constexpr std::uint8_t wait_stop_waiting = 0;
/// "corocoll" in a little-endian u64.
inline constexpr std::uint64_t hello_magic = 0x6c6c6f636f726f63;
/// "coroauth": HELLO's answer from a server that wants the job token proved.
inline constexpr std::uint64_t hello_auth_magic = 0x687475616f726f63;

/// The proofs of store authentication (see `query`): the client's over (server nonce, client
/// nonce), the server's over the two the other way round.
COROCOLL_DECL transport::detail::auth_proof store_proof(
    std::string_view token, bool from_client, const transport::detail::auth_nonce& first,
    const transport::detail::auth_nonce& second);

/// The first byte of every reply on a connection that said HELLO.
enum class reply_status : std::uint8_t {
    ok = 0,
    too_large = 1,  // a key, value or request over the server's limits
    overflow = 2,   // ADD past the int64 range
    busy = 3,       // the server's byte budget for unfinished requests is spent
    invalid = 4,    // GET of a missing key, ADD to a value that is not a number
    unsupported = 5,
    denied = 6,  // the job token was not proved (see `query`)
};

/// The error a client reports for a refusal with status `s`.
COROCOLL_DECL std::error_code refusal_code(std::uint8_t s);

/// The largest key, value and key count a client reads in a reply, and the defaults of a
/// server's limits.
inline constexpr std::uint64_t max_key_bytes = std::uint64_t{1} << 16;
inline constexpr std::uint64_t max_value_bytes = std::uint64_t{1} << 30;
inline constexpr std::uint64_t max_keys_per_request = std::uint64_t{1} << 16;
inline constexpr std::uint64_t max_refusal_bytes = std::uint64_t{1} << 16;

/// Appends wire-format fields to a request or reply.
class wire_writer {
public:
    void u8(std::uint8_t v) { buf_.push_back(static_cast<char>(v)); }
    void i64(std::int64_t v) { raw(&v, sizeof(v)); }
    void u64(std::uint64_t v) { raw(&v, sizeof(v)); }
    void bytes(const std::string& s);
    /// Bytes as they are, without a length.
    void raw(const void* p, std::size_t n) { buf_.append(static_cast<const char*>(p), n); }
    std::span<const std::byte> view() const noexcept {
        return std::as_bytes(std::span<const char>(buf_.data(), buf_.size()));
    }
    void clear() noexcept { buf_.clear(); }
    std::size_t size() const noexcept { return buf_.size(); }
    std::size_t capacity() const noexcept { return buf_.capacity(); }
    /// Gives the memory back (after a large reply).
    void release() noexcept { std::string().swap(buf_); }

private:
    std::string buf_;
};

/// Reads wire-format fields from a socket, each bounded by the caller's options.
class wire_reader {
public:
    wire_reader(io::socket& s, io::op_options o) : s_(s), o_(std::move(o)) {}

    task<std::uint8_t> u8();
    task<std::int64_t> i64();
    task<std::uint64_t> u64();
    task<std::string> bytes(std::uint64_t limit, const char* what);

private:
    io::socket& s_;
    io::op_options o_;
};

/// What a server accepts in one request.
struct store_limits {
    std::uint64_t max_key_bytes = detail::max_key_bytes;
    std::uint64_t max_value_bytes = std::uint64_t{64} << 20;
    std::uint64_t max_keys_per_request = detail::max_keys_per_request;

    /// The most bytes one request may take: COMPARE_SET with two values of the limit.
    std::uint64_t max_request_bytes() const noexcept {
        return 1 + 3 * 8 + max_key_bytes + 2 * max_value_bytes;
    }
};

/// One request, as parsed.
struct store_request {
    query q{};
    std::vector<std::string> keys;  // one for most queries, any number for CHECK and WAIT
    std::string value;              // SET's value, COMPARE_SET's expected value
    std::string desired;            // COMPARE_SET's desired value
    std::int64_t delta = 0;         // ADD
};

/// Why a server refuses a request; `reason` names the request and its key.
struct refusal {
    reply_status status = reply_status::ok;
    std::string reason;
};

enum class parse_status { complete, incomplete, refused };

struct parse_result {
    parse_status status = parse_status::incomplete;
    /// complete: the bytes the request took. incomplete: the bytes (from the request's
    /// first) that must be there before parsing can go on.
    std::uint64_t bytes = 0;
    refusal why;
};

/// Parses one request from the bytes received so far, resuming where the last call stopped:
/// feed it the request's bytes from its first, more each time, until it says complete (then
/// `take` the request) or refused. Each field is copied once, when all of it is there, and a
/// length over the limits is refused before any of its bytes are awaited, so the caller never
/// holds more than a bounded request. Cost: the fields' bytes, once.
class request_parser {
public:
    explicit request_parser(const store_limits& l) noexcept : limits_(l) {}

    parse_result parse(std::string_view in);

    /// The complete request; the parser starts over for the next one.
    store_request take();

private:
    parse_result done() const;
    parse_result more(std::uint64_t need) const;
    parse_result refuse(reply_status s, std::string why) const;

    // "SET '/key'", as far as the request is known.
    std::string name() const;

    std::optional<parse_result> integer_field(std::string_view in, std::uint64_t& v);
    std::optional<parse_result> key_field(std::string_view in);
    std::optional<parse_result> string_field(std::string_view in, std::string& out,
                                             const char* what);

    store_limits limits_;
    store_request req_;
    std::uint64_t pos_ = 0;    // bytes of the request taken into fields
    std::uint64_t field_ = 0;  // fields taken
    std::uint64_t key_count_ = 0;
};

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
    /// Keys that some waiter waits for.
    std::size_t awaited_keys() const noexcept { return waiting_.size(); }

private:
    std::optional<refusal> add(const std::string& key, std::int64_t delta, wire_writer& out);

    void put(const std::string& key, std::string value);

    std::unordered_map<std::string, std::string> data_;
    std::unordered_map<std::string, std::vector<waiter*>> waiting_;
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
    /// libcrypto (see transport/auth.hpp).
    std::string job_token;
    /// With a job token: how long a new connection has to prove it (HELLO, then AUTH) before
    /// it is dropped. Until then it may hold `tcp_store_server::unproven_bytes` and send only
    /// those two requests, so that strangers cost the clients that hold the token nothing of
    /// the byte budget.
    std::chrono::milliseconds auth_timeout = std::chrono::seconds(10);
};

/// What a `tcp_store_server` has done and holds, for tests and monitoring. Counters only grow;
/// the others are the state at the time of `tcp_store_server::stats()`.
struct tcp_store_server_stats {
    /// Connections accepted so far.
    std::uint64_t connections_accepted = 0;
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
///
/// Hostile or broken clients cost bounded memory and time (`tcp_store_server_options`):
/// buffers grow as bytes arrive, up to one request's limit per connection and a budget over
/// all of them; a request must arrive whole within a deadline; a WAIT whose client goes away
/// is dropped with its descriptor; at EMFILE the accept loop backs off.
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

private:
    struct counters {
        std::atomic<std::uint64_t> connections_accepted{0};
        std::atomic<std::uint64_t> accept_failures{0};
        std::atomic<std::uint64_t> open_connections{0};
        std::atomic<std::uint64_t> parked_waits{0};
        std::atomic<std::uint64_t> buffered_bytes{0};
        std::atomic<std::uint64_t> peak_buffered_bytes{0};
        std::atomic<std::uint64_t> requests_refused{0};
        std::atomic<std::uint64_t> timed_out{0};
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
    static constexpr std::size_t small_buffer = std::size_t{4} << 10;
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
        std::optional<transport::detail::auth_nonce> server_nonce{};
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

    io::op_options send_options() const {
        return io::op_options(io::deadline_after(options_.request_timeout), stop_.get_token());
    }

    // Serves requests until the client leaves or must be dropped.
    task<> converse(connection& c);

    // Receives more of the request in progress, which needs `need` bytes in all to go on.
    // False when the client closed between requests.
    task<bool> receive(connection& c, std::uint64_t need);

    // Parks the connection until every key in `keys` exists. Meanwhile it reads from the
    // client, so that a client that goes away is noticed, and its WAIT dropped with its
    // descriptor; bytes that arrive are kept for the next request. False when the connection
    // must close (the client left, or the server stops).
    task<bool> park(connection& c, const std::vector<std::string>& keys);

    // AUTH: checks the client's proof of the job token over this connection's nonces and
    // appends the server's own proof to the reply; why not, when the client did not prove it.
    std::optional<detail::refusal> authenticate(connection& c, const std::string& proof);

    // Tells a client that said HELLO why its request is refused, then closes. The rest of
    // the request is read and dropped first (within the request deadline), so that the
    // client finishes sending and reads the answer, rather than meeting a reset.
    task<> refuse(connection& c, detail::refusal why);

    detail::refusal busy(const std::string& what) const;

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
///
/// Each connection starts with corocoll's HELLO, so that a `tcp_store_server` can say why it
/// refuses a request (a value over its limit, an ADD that would overflow): the error names
/// the request, its key and the server's reason. A server that closes the connection at HELLO
/// (torch's) is used without it from then on, at the cost of that one connection.
class tcp_store final : public store {
public:
    /// Connects to `server`, retrying with exponential backoff and jitter while the server is
    /// not up yet, for up to `timeout` (the store's timeout afterwards too). `job_token`
    /// (COROCOLL_JOB_TOKEN) answers a server that asks for it (a `tcp_store_server` with the
    /// same token), without sending it; a server that asks for a token this client lacks or
    /// proves differently is an error (permission_denied). A server that does not ask is used
    /// as it is: a forged store cannot get more than its entries, as mesh set-up proves the
    /// token between ranks.
    static task<std::shared_ptr<tcp_store>> connect(io::reactor& r, io::endpoint server,
                                                    duration timeout = default_timeout,
                                                    std::string job_token = {});

    /// The server's address.
    const io::endpoint& server() const noexcept { return server_; }

    COROCOLL_DECL task<> set(std::string key, std::string value) override;

    COROCOLL_DECL task<std::string> get(std::string key) override;

    COROCOLL_DECL task<std::int64_t> add(std::string key, std::int64_t delta) override;

    COROCOLL_DECL task<std::string> compare_set(std::string key, std::string expected,
                                                std::string desired) override;

    COROCOLL_DECL task<> wait(std::vector<std::string> keys, duration timeout) override;
    using store::wait;

    COROCOLL_DECL task<bool> check(std::vector<std::string> keys) override;

    COROCOLL_DECL task<bool> delete_key(std::string key) override;

    COROCOLL_DECL task<std::int64_t> num_keys() override;

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
                                      duration timeout);

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

    [[noreturn]] void fail(const std::system_error& e, const std::string& what);

    // Says HELLO on a new connection, unless the server is known not to understand it; true
    // when the connection can be used, false when the server closed it (torch's server closes
    // a connection at a query it does not know: the next one goes without HELLO).
    task<bool> hello(std::chrono::steady_clock::time_point deadline);

    // The client's half of AUTH (see detail::query), after a HELLO answered with a nonce.
    task<> authenticate(std::chrono::steady_clock::time_point answer_by);

    task<> reconnect(duration timeout);

    static constexpr std::chrono::seconds hello_answer_time{5};

    io::reactor& reactor_;
    io::endpoint server_;
    io::socket sock_;
    bool broken_ = true;
    bool status_replies_ = false;  // the server said HELLO back: replies start with a status
    bool plain_server_ = false;    // the server closed the connection at HELLO (torch's)
    std::string job_token_;        // proved to a server that asks for it
    async_mutex mutex_;
};

}  // namespace rendezvous

COROCOLL_END_NAMESPACE

// ---- definitions: inline in every translation unit, or compiled once (version.hpp) ----

#if COROCOLL_DEFINE_BODIES

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {
namespace detail {

COROCOLL_DECL transport::detail::auth_proof store_proof(
    std::string_view token, bool from_client, const transport::detail::auth_nonce& first,
    const transport::detail::auth_nonce& second) {
    std::string message = from_client ? "corocoll store client" : "corocoll store server";
    message.append(reinterpret_cast<const char*>(first.data()), first.size());
    message.append(reinterpret_cast<const char*>(second.data()), second.size());
    return transport::detail::hmac_sha256(token, message);
}

COROCOLL_DECL std::error_code refusal_code(std::uint8_t s) {
    switch (static_cast<reply_status>(s)) {
        case reply_status::too_large:
            return make_error_code(corocoll::errc::message_too_large);
        case reply_status::overflow:
            return std::make_error_code(std::errc::value_too_large);
        case reply_status::busy:
            return std::make_error_code(std::errc::no_buffer_space);
        case reply_status::invalid:
            return std::make_error_code(std::errc::invalid_argument);
        case reply_status::denied:
            return std::make_error_code(std::errc::permission_denied);
        default:
            return make_error_code(corocoll::errc::protocol_error);
    }
}

COROCOLL_DECL void wire_writer::bytes(const std::string& s) {
    u64(s.size());
    buf_ += s;
}

COROCOLL_DECL task<std::uint8_t> wire_reader::u8() {
    std::uint8_t v = 0;
    co_await s_.recv(std::as_writable_bytes(std::span(&v, 1)), o_);
    co_return v;
}

COROCOLL_DECL task<std::int64_t> wire_reader::i64() {
    std::int64_t v = 0;
    co_await s_.recv(std::as_writable_bytes(std::span(&v, 1)), o_);
    co_return v;
}

COROCOLL_DECL task<std::uint64_t> wire_reader::u64() {
    std::uint64_t v = 0;
    co_await s_.recv(std::as_writable_bytes(std::span(&v, 1)), o_);
    co_return v;
}

COROCOLL_DECL task<std::string> wire_reader::bytes(std::uint64_t limit, const char* what) {
    std::uint64_t n = co_await u64();
    if (n > limit) {
        corocoll::detail::throw_error(
            corocoll::errc::message_too_large,
            "corocoll: store: " + std::string(what) + " of " + std::to_string(n) + " bytes from " +
                s_.peer().to_string() + " exceeds the limit of " + std::to_string(limit));
    }
    std::string out(n, '\0');
    co_await s_.recv(std::as_writable_bytes(std::span(out.data(), out.size())), o_);
    co_return out;
}

COROCOLL_DECL parse_result request_parser::parse(std::string_view in) {
    if (pos_ == 0) {
        if (in.empty()) return more(1);
        req_.q = static_cast<query>(static_cast<unsigned char>(in[0]));
        pos_ = 1;
    }
    for (;;) {
        std::optional<parse_result> stop;
        switch (req_.q) {
            case query::set:
                if (field_ == 0)
                    stop = key_field(in);
                else if (field_ == 1)
                    stop = string_field(in, req_.value, "value");
                else
                    return done();
                break;
            case query::compare_set:
                if (field_ == 0)
                    stop = key_field(in);
                else if (field_ == 1)
                    stop = string_field(in, req_.value, "expected value");
                else if (field_ == 2)
                    stop = string_field(in, req_.desired, "desired value");
                else
                    return done();
                break;
            case query::get:
            case query::delete_key:
                if (field_ == 0)
                    stop = key_field(in);
                else
                    return done();
                break;
            case query::add:
                if (field_ == 0) {
                    stop = key_field(in);
                } else if (field_ == 1) {
                    std::uint64_t v = 0;
                    stop = integer_field(in, v);
                    req_.delta = static_cast<std::int64_t>(v);
                } else {
                    return done();
                }
                break;
            case query::check:
            case query::wait:
                if (field_ == 0) {
                    stop = integer_field(in, key_count_);
                    if (!stop && key_count_ > limits_.max_keys_per_request) {
                        return refuse(reply_status::too_large,
                                      name() + ": " + std::to_string(key_count_) +
                                          " keys exceed the server's limit of " +
                                          std::to_string(limits_.max_keys_per_request));
                    }
                } else if (field_ <= key_count_) {
                    stop = key_field(in);
                } else {
                    return done();
                }
                break;
            case query::get_num_keys:
                return done();
            case query::hello:
                if (field_ == 0) {
                    std::uint64_t magic = 0;
                    stop = integer_field(in, magic);
                    if (!stop && magic != hello_magic) {
                        return refuse(reply_status::unsupported, "HELLO: wrong magic");
                    }
                } else {
                    return done();
                }
                break;
            case query::auth:
                if (field_ == 0)
                    stop = string_field(in, req_.value, "proof");
                else
                    return done();
                break;
            case query::watch_key:
                return refuse(reply_status::unsupported, "WATCH_KEY is not supported");
            default:
                return refuse(reply_status::unsupported,
                              "unknown query " + std::to_string(static_cast<unsigned>(req_.q)));
        }
        if (stop) return *stop;
    }
}

COROCOLL_DECL store_request request_parser::take() {
    store_request out = std::move(req_);
    req_ = store_request{};
    pos_ = 0;
    field_ = 0;
    key_count_ = 0;
    return out;
}

COROCOLL_DECL parse_result request_parser::done() const {
    parse_result r;
    r.status = parse_status::complete;
    r.bytes = pos_;
    return r;
}

COROCOLL_DECL parse_result request_parser::more(std::uint64_t need) const {
    if (need > limits_.max_request_bytes()) {
        return refuse(reply_status::too_large,
                      name() + ": the request takes more than the server's limit of " +
                          std::to_string(limits_.max_request_bytes()) + " bytes");
    }
    parse_result r;
    r.bytes = need;
    return r;
}

COROCOLL_DECL parse_result request_parser::refuse(reply_status s, std::string why) const {
    parse_result r;
    r.status = parse_status::refused;
    r.why = refusal{s, std::move(why)};
    return r;
}

COROCOLL_DECL std::string request_parser::name() const {
    static constexpr const char* names[] = {"SET",        "COMPARE_SET", "GET",
                                            "ADD",        "CHECK",       "WAIT",
                                            "GETNUMKEYS", "WATCH_KEY",   "DELETE_KEY"};
    auto q = static_cast<unsigned>(req_.q);
    std::string out = q < std::size(names) ? names[q] : req_.q == query::auth ? "AUTH" : "HELLO";
    if (!req_.keys.empty()) out += " '" + req_.keys.front() + "'";
    return out;
}

COROCOLL_DECL std::optional<parse_result> request_parser::integer_field(std::string_view in,
                                                                        std::uint64_t& v) {
    if (in.size() - pos_ < 8) return more(pos_ + 8);
    std::memcpy(&v, in.data() + pos_, 8);
    pos_ += 8;
    ++field_;
    return std::nullopt;
}

COROCOLL_DECL std::optional<parse_result> request_parser::key_field(std::string_view in) {
    std::string key;
    auto stop = string_field(in, key, "key");
    if (!stop) req_.keys.push_back(std::move(key));
    return stop;
}

COROCOLL_DECL std::optional<parse_result> request_parser::string_field(std::string_view in,
                                                                       std::string& out,
                                                                       const char* what) {
    if (in.size() - pos_ < 8) return more(pos_ + 8);
    std::uint64_t n = 0;
    std::memcpy(&n, in.data() + pos_, 8);
    std::uint64_t limit =
        std::strcmp(what, "key") == 0 ? limits_.max_key_bytes : limits_.max_value_bytes;
    if (n > limit) {
        return refuse(reply_status::too_large, name() + ": " + what + " of " + std::to_string(n) +
                                                   " bytes exceeds the server's limit of " +
                                                   std::to_string(limit) + " bytes");
    }
    if (in.size() - pos_ - 8 < n) return more(pos_ + 8 + n);
    out.assign(in.data() + pos_ + 8, n);
    pos_ += 8 + n;
    ++field_;
    return std::nullopt;
}

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
        case query::get_num_keys:
            out.i64(static_cast<std::int64_t>(data_.size()));
            return std::nullopt;
        case query::delete_key:
            out.i64(static_cast<std::int64_t>(data_.erase(r.keys[0])));
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
}  // namespace rendezvous

namespace rendezvous {

COROCOLL_DECL tcp_store_server::~tcp_store_server() {
    if (!thread_.joinable()) return;
    reactor_->post(shutdown_);
    thread_.join();
}

COROCOLL_DECL void tcp_store_server::start() {
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

COROCOLL_DECL tcp_store_server_stats tcp_store_server::stats() const noexcept {
    auto get = [](const std::atomic<std::uint64_t>& a) {
        return a.load(std::memory_order_relaxed);
    };
    tcp_store_server_stats out;
    out.connections_accepted = get(counters_.connections_accepted);
    out.accept_failures = get(counters_.accept_failures);
    out.open_connections = get(counters_.open_connections);
    out.parked_waits = get(counters_.parked_waits);
    out.buffered_bytes = get(counters_.buffered_bytes);
    out.peak_buffered_bytes = get(counters_.peak_buffered_bytes);
    out.requests_refused = get(counters_.requests_refused);
    out.timed_out = get(counters_.timed_out);
    return out;
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
        } catch (const std::system_error& e) {
            failed = e.code();
        }
        if (!failed || stopping_) continue;
        counters_.accept_failures.fetch_add(1, std::memory_order_relaxed);
        // A connection that was reset before it was accepted is that client's problem;
        // anything else (EMFILE, ENFILE, ENOBUFS, ENOMEM) fails again if retried at once,
        // and would burn a core until a descriptor frees up.
        if (failed == std::errc::connection_aborted) continue;
        try {
            co_await reactor_->sleep_for(backoff, stop_.get_token());
        } catch (const std::system_error&) {
            // Stopped: the loop condition ends it.
        }
        backoff = std::min(backoff * 2, options_.accept_backoff_max);
    }
    co_await connections.join();
}

COROCOLL_DECL task<> tcp_store_server::handle(io::socket s) {
    counters_.open_connections.fetch_add(1, std::memory_order_relaxed);
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
                c.server_nonce = transport::detail::auth_random_nonce();
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
            if (!table_.all_present(req.keys) && !co_await park(c, req.keys)) co_return;
            c.out.u8(detail::wait_stop_waiting);
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

COROCOLL_DECL task<bool> tcp_store_server::park(connection& c,
                                                const std::vector<std::string>& keys) {
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
        if (c.in.size() >= max_behind_wait) co_return false;
        std::size_t got = 0;
        try {
            std::size_t capacity = std::max(c.in.capacity(), c.in.size() + small_buffer);
            if (!recharge(c, capacity + c.out.capacity())) co_return false;
            auto room = c.in.prepare(small_buffer, capacity);
            got = co_await c.sock.recv_some(room, w.wake.get_token());
        } catch (const std::system_error& e) {
            // Woken: the loop condition says why. Anything else: the client is gone.
            if (e.code() == std::errc::operation_canceled) continue;
            throw;
        }
        if (got == 0) co_return false;
        c.in.commit(got);
    }
    co_return !stopping_;
}

COROCOLL_DECL std::optional<detail::refusal> tcp_store_server::authenticate(
    connection& c, const std::string& proof) {
    namespace auth = transport::detail;
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

COROCOLL_DECL task<std::shared_ptr<tcp_store>> tcp_store::connect(io::reactor& r,
                                                                  io::endpoint server,
                                                                  duration timeout,
                                                                  std::string job_token) {
    std::shared_ptr<tcp_store> s(new tcp_store(r, server, timeout));
    s->job_token_ = std::move(job_token);
    co_await s->reconnect(timeout);
    co_return s;
}

COROCOLL_DECL task<> tcp_store::set(std::string key, std::string value) {
    auto lock = co_await mutex_.scoped_lock();
    detail::wire_writer w;
    w.u8(static_cast<std::uint8_t>(detail::query::set));
    w.bytes(wire_key(key));
    w.bytes(value);
    co_await request(w, "set '" + key + "'");
}

COROCOLL_DECL task<std::string> tcp_store::get(std::string key) {
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

COROCOLL_DECL task<std::int64_t> tcp_store::add(std::string key, std::int64_t delta) {
    auto lock = co_await mutex_.scoped_lock();
    detail::wire_writer w;
    w.u8(static_cast<std::uint8_t>(detail::query::add));
    w.bytes(wire_key(key));
    w.i64(delta);
    std::string what = "add to '" + key + "'";
    auto in = co_await request(w, what);
    co_return co_await guarded(in.i64(), what);
}

COROCOLL_DECL task<std::string> tcp_store::compare_set(std::string key, std::string expected,
                                                       std::string desired) {
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

COROCOLL_DECL task<> tcp_store::wait(std::vector<std::string> keys, duration timeout) {
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

COROCOLL_DECL task<bool> tcp_store::check(std::vector<std::string> keys) {
    auto lock = co_await mutex_.scoped_lock();
    detail::wire_writer w;
    w.u8(static_cast<std::uint8_t>(detail::query::check));
    w.u64(keys.size());
    for (const auto& k : keys) w.bytes(wire_key(k));
    std::string what = "check " + rendezvous::detail::join_keys(keys);
    auto in = co_await request(w, what);
    co_return co_await guarded(in.u8(), what) == detail::check_ready;
}

COROCOLL_DECL task<bool> tcp_store::delete_key(std::string key) {
    auto lock = co_await mutex_.scoped_lock();
    detail::wire_writer w;
    w.u8(static_cast<std::uint8_t>(detail::query::delete_key));
    w.bytes(wire_key(key));
    std::string what = "delete '" + key + "'";
    auto in = co_await request(w, what);
    co_return co_await guarded(in.i64(), what) > 0;
}

COROCOLL_DECL task<std::int64_t> tcp_store::num_keys() {
    auto lock = co_await mutex_.scoped_lock();
    detail::wire_writer w;
    w.u8(static_cast<std::uint8_t>(detail::query::get_num_keys));
    auto in = co_await request(w, "num_keys");
    co_return co_await guarded(in.i64(), "num_keys");
}

COROCOLL_DECL task<detail::wire_reader> tcp_store::request(const detail::wire_writer& w,
                                                           std::string what, duration timeout) {
    if (broken_) co_await reconnect(this->timeout());
    io::op_options o(io::deadline_after(timeout));
    try {
        co_await sock_.send(w.view(), o);
    } catch (const std::system_error& e) {
        broken_ = true;
        fail(e, what);
    }
    detail::wire_reader in(sock_, o);
    if (status_replies_) {
        std::uint8_t status = co_await guarded(in.u8(), what, timeout);
        if (status != static_cast<std::uint8_t>(detail::reply_status::ok)) {
            std::string why =
                co_await guarded(in.bytes(detail::max_refusal_bytes, "refusal"), what, timeout);
            // The server closes the connection after a refusal.
            broken_ = true;
            sock_.close();
            corocoll::detail::throw_error(detail::refusal_code(status),
                                          "corocoll: store " + server_.to_string() + ": " + what +
                                              ": refused by the server: " + why);
        }
    }
    co_return in;
}

COROCOLL_DECL void tcp_store::fail(const std::system_error& e, const std::string& what) {
    corocoll::detail::throw_error(e.code(), "corocoll: store " + server_.to_string() + ": " + what +
                                                ": " + corocoll::detail::context_of(e));
}

COROCOLL_DECL task<bool> tcp_store::hello(std::chrono::steady_clock::time_point deadline) {
    status_replies_ = false;
    if (plain_server_) co_return true;
    detail::wire_writer w;
    w.u8(static_cast<std::uint8_t>(detail::query::hello));
    w.u64(detail::hello_magic);
    std::uint64_t reply = 0;
    // Ours answers at once and torch's closes at once; something that says nothing for
    // seconds is not a store, and waiting for it until the timeout helps nobody.
    auto answer_by = std::min(deadline, io::deadline_after(hello_answer_time));
    try {
        co_await sock_.send(w.view(), answer_by);
        co_await sock_.recv(std::as_writable_bytes(std::span(&reply, 1)), answer_by);
    } catch (const std::system_error& e) {
        if (e.code() == std::errc::timed_out && answer_by < deadline) {
            corocoll::detail::throw_error(
                corocoll::errc::protocol_error,
                "corocoll: store " + server_.to_string() +
                    ": the server accepted the connection but did not answer HELLO within " +
                    std::to_string(hello_answer_time.count()) + " s; is it a store?");
        }
        if (e.code() != corocoll::errc::connection_closed &&
            e.code() != std::errc::connection_reset && e.code() != std::errc::broken_pipe) {
            throw;
        }
        plain_server_ = true;
        sock_.close();
        co_return false;
    }
    if (reply == detail::hello_auth_magic) {
        co_await authenticate(answer_by);
        status_replies_ = true;
        co_return true;
    }
    if (reply != detail::hello_magic) {
        corocoll::detail::throw_error(corocoll::errc::protocol_error,
                                      "corocoll: store " + server_.to_string() +
                                          ": the server answered HELLO with something else; "
                                          "is it a store?");
    }
    status_replies_ = true;
    co_return true;
}

COROCOLL_DECL task<> tcp_store::authenticate(std::chrono::steady_clock::time_point answer_by) {
    namespace auth = transport::detail;
    auto denied = [&](const std::string& why) {
        corocoll::detail::throw_error(std::make_error_code(std::errc::permission_denied),
                                      "corocoll: store " + server_.to_string() + ": " + why);
    };
    if (job_token_.empty()) {
        denied(
            "the server serves only clients that know the job token; set "
            "COROCOLL_JOB_TOKEN to the job's token");
    }
    auth::auth_nonce server_nonce{};
    co_await sock_.recv(server_nonce, answer_by);
    auto client_nonce = auth::auth_random_nonce();
    auto proof = detail::store_proof(job_token_, true, server_nonce, client_nonce);
    detail::wire_writer w;
    w.u8(static_cast<std::uint8_t>(detail::query::auth));
    w.u64(client_nonce.size() + proof.size());
    w.raw(client_nonce.data(), client_nonce.size());
    w.raw(proof.data(), proof.size());
    co_await sock_.send(w.view(), answer_by);
    detail::wire_reader in(sock_, io::op_options(answer_by));
    std::uint8_t status = co_await in.u8();
    if (status != static_cast<std::uint8_t>(detail::reply_status::ok)) {
        denied("AUTH refused: " + co_await in.bytes(detail::max_refusal_bytes, "refusal"));
    }
    std::string theirs = co_await in.bytes(auth::proof_bytes, "AUTH proof");
    auto expected = detail::store_proof(job_token_, false, client_nonce, server_nonce);
    auth::auth_proof got{};
    if (theirs.size() == got.size()) std::memcpy(got.data(), theirs.data(), got.size());
    if (theirs.size() != got.size() || !auth::same_proof(got, expected)) {
        denied("the server did not prove that it knows the job token");
    }
}

COROCOLL_DECL task<> tcp_store::reconnect(duration timeout) {
    sock_.close();
    auto deadline = io::deadline_after(timeout);
    std::minstd_rand jitter(
        static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
    auto backoff = std::chrono::milliseconds(10);
    for (;;) {
        std::error_code last;
        try {
            sock_ = co_await io::socket::connect(reactor_, server_, deadline);
            if (co_await hello(deadline)) {
                broken_ = false;
                co_return;
            }
            continue;  // a torch server closed the connection at our HELLO: again without
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
            corocoll::detail::throw_error(
                std::make_error_code(std::errc::timed_out),
                "corocoll: store: could not connect to " + server_.to_string() + " within " +
                    std::to_string(timeout.count()) + " ms (last error: " + last.message() + ")");
        }
        // Sleep backoff ± 25%, never past the deadline; double it up to a second.
        auto spread = backoff.count() / 2 + 1;
        auto sleep = std::chrono::milliseconds(backoff.count() * 3 / 4 +
                                               static_cast<long>(jitter() % spread));
        co_await reactor_.sleep_until(std::min(now + sleep, deadline));
        backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
}

}  // namespace rendezvous

COROCOLL_END_NAMESPACE

#endif  // COROCOLL_DEFINE_BODIES
