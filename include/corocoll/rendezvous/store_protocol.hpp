#pragma once

// The TCP store's wire: torch 1.13's TCPStore protocol with corocoll's HELLO and AUTH
// extension, the reader and writer of its fields, and the parser that a server feeds with the
// bytes of a request as they arrive. Shared by the server (tcp_store_server.hpp) and the
// client (tcp_store.hpp); no I/O of its own but the reader's.

#include <corocoll/core/auth.hpp>
#include <corocoll/core/error.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/io/socket.hpp>
#include <corocoll/version.hpp>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
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
//
// MULTI_GET (0xC2), the second extension, is laid out as WAIT (a u64 key count, then the
// keys) and answered with one byte vector per key, in the request's order; a missing key
// refuses the whole request, naming the key. corocoll's client sends it only to a server
// that answered HELLO (torch 1.13's has no such query), right behind a WAIT for the same keys,
// so that one round trip waits for the keys and brings their values.
//
// torch 2.x, from the release that added client validation (2.1 or 2.2; read in torch's
// sources, TCPStoreBackend.hpp), numbers its queries from VALIDATE = 0: SET 1, COMPARE_SET 2,
// GET 3, ADD 4, CHECK 5, WAIT 6, GETNUMKEYS 7, DELETE_KEY 8, APPEND 9, MULTI_GET 10,
// MULTI_SET 11, CANCEL_WAIT 12, PING 13, then QUEUE_PUSH 14, QUEUE_POP 15, QUEUE_LEN 16 and,
// in the newest, LIST_KEYS 17 and BARRIER 18. Its client opens each connection with VALIDATE
// and the u32 `torch2_validation_magic` (no reply), and then PING with a u32 nonce, which the
// server echoes. The fields are 1.13's, and: APPEND a key and bytes, appended to the value
// (no reply); MULTI_GET as corocoll's; MULTI_SET an int64 count and that many key and value
// pairs (no reply); CANCEL_WAIT, sent after a WAIT the client gave up on, answered
// `wait_canceled` instead of the WAIT's answer; LIST_KEYS answered with an int64 count and the
// keys. A server tells the two apart by a connection's first request: byte 0 followed by the
// magic is 2.x's VALIDATE (in 1.13's numbering a SET whose key announces more than 1 GB). The
// queues and BARRIER are not served: the connection is closed, as for any query the server
// does not know. `query` holds 1.13's numbers and corocoll's; 2.x's are mapped onto it, and the
// 2.x queries 1.13 lacks get numbers from 0xD0 on, which no client sends (a 1.13-numbered byte
// there is an unknown query).
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
    multi_get = 0xC2,
    // torch 2.x's, by their internal numbers (see above).
    validate = 0xD0,
    append = 0xD1,
    multi_set = 0xD2,
    cancel_wait = 0xD3,
    ping = 0xD4,
    list_keys = 0xD5,
};

/// torch 2.x's queries in its numbering: `torch2_queries[n]` is the query numbered n (VALIDATE
/// to PING; LIST_KEYS, 17, comes after the queues, which are not served).
inline constexpr query torch2_queries[] = {
    query::validate,  query::set,       query::compare_set,  query::get,        query::add,
    query::check,     query::wait,      query::get_num_keys, query::delete_key, query::append,
    query::multi_get, query::multi_set, query::cancel_wait,  query::ping,
};
inline constexpr std::uint8_t torch2_list_keys = 17;

/// The byte of `q` on the wire: 1.13's (and corocoll's) number, or torch 2.x's.
constexpr std::uint8_t wire_number(query q, bool torch2) noexcept {
    if (!torch2) return static_cast<std::uint8_t>(q);
    if (q == query::list_keys) return torch2_list_keys;
    for (std::size_t n = 0; n < std::size(torch2_queries); ++n) {
        if (torch2_queries[n] == q) return static_cast<std::uint8_t>(n);
    }
    return static_cast<std::uint8_t>(q);  // corocoll's own (HELLO, AUTH): not numbered by torch
}

/// torch 2.x's VALIDATE magic, a native-endian u32 after the query byte.
inline constexpr std::uint32_t torch2_validation_magic = 0x3C85F7CE;
/// torch 2.x's number of CANCEL_WAIT, which a 2.x client sends while its WAIT is parked.
inline constexpr std::uint8_t torch2_cancel_wait = 12;
inline constexpr std::uint8_t check_ready = 0;
inline constexpr std::uint8_t check_not_ready = 1;
inline constexpr std::uint8_t wait_stop_waiting = 0;
inline constexpr std::uint8_t wait_canceled = 1;  // torch 2.x's answer to CANCEL_WAIT
/// "corocoll" in a little-endian u64.
inline constexpr std::uint64_t hello_magic = 0x6c6c6f636f726f63;
/// "coroauth": HELLO's answer from a server that wants the job token proved.
inline constexpr std::uint64_t hello_auth_magic = 0x687475616f726f63;

/// The proofs of store authentication (see `query`): the client's over (server nonce, client
/// nonce), the server's over the two the other way round.
COROCOLL_DECL corocoll::detail::auth_proof store_proof(std::string_view token, bool from_client,
                                                       const corocoll::detail::auth_nonce& first,
                                                       const corocoll::detail::auth_nonce& second);

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
    // One for most queries, any number for CHECK, WAIT and MULTI_GET.
    std::vector<std::string> keys;
    std::string value;                // SET's value, COMPARE_SET's expected value
    std::string desired;              // COMPARE_SET's desired value
    std::int64_t delta = 0;           // ADD; PING's nonce
    std::vector<std::string> values;  // MULTI_SET's, one per key
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

    /// The connection speaks torch 2.x's numbering (its first request was VALIDATE).
    bool torch2() const noexcept { return torch2_; }

private:
    parse_result done() const;
    parse_result more(std::uint64_t need) const;
    parse_result refuse(reply_status s, std::string why) const;

    // "SET '/key'", as far as the request is known.
    std::string name() const;

    std::optional<parse_result> integer_field(std::string_view in, std::uint64_t& v);
    std::optional<parse_result> u32_field(std::string_view in, std::uint64_t& v);
    // The query byte `b` of a request, in this connection's numbering.
    std::optional<parse_result> query_byte(unsigned char b);
    std::optional<parse_result> key_field(std::string_view in);
    std::optional<parse_result> string_field(std::string_view in, std::string& out,
                                             const char* what);

    store_limits limits_;
    store_request req_;
    std::uint64_t pos_ = 0;    // bytes of the request taken into fields
    std::uint64_t field_ = 0;  // fields taken
    std::uint64_t key_count_ = 0;
    bool first_ = true;  // no request parsed yet on this connection
    bool torch2_ = false;
};

}  // namespace detail

}  // namespace rendezvous

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/rendezvous/impl/store_protocol.ipp>
#endif
