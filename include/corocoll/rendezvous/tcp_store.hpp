#pragma once

// The TCP store's client, `tcp_store`: a `store` over one connection to a `tcp_store_server`
// or to torch's TCPStore server. Includes the server too, which a program that serves its
// own store needs beside the client.

#include <corocoll/core/async_mutex.hpp>
#include <corocoll/core/error.hpp>
#include <corocoll/core/task.hpp>
#include <corocoll/io/endpoint.hpp>
#include <corocoll/io/reactor.hpp>
#include <corocoll/io/socket.hpp>
#include <corocoll/rendezvous/store.hpp>
#include <corocoll/rendezvous/store_protocol.hpp>
#include <corocoll/rendezvous/tcp_store_server.hpp>
#include <corocoll/version.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <system_error>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {

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
    ///
    /// `wait_for_server` false: for a server known to have been up (a stand-in for a store,
    /// say): a refused or reset connection fails at once, then and at every reconnection,
    /// instead of being tried again until `timeout`.
    static task<std::shared_ptr<tcp_store>> connect(io::reactor& r, io::endpoint server,
                                                    duration timeout = default_timeout,
                                                    std::string job_token = {},
                                                    bool wait_for_server = true);

    COROCOLL_DECL ~tcp_store() override;

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

    /// One round trip to a corocoll server (a WAIT and a MULTI_GET sent together); to torch's
    /// server, which has no MULTI_GET, a WAIT and a GET per key.
    COROCOLL_DECL task<std::vector<std::string>> multi_get(std::vector<std::string> keys,
                                                           duration timeout) override;
    using store::multi_get;

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
    // Reads a reply's status (from a server that answered HELLO) and returns a reader for
    // the rest; a refusal drops the connection and throws, naming `what` and the reason.
    task<detail::wire_reader> reply_of(std::string what, duration timeout, io::op_options o);

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
    // torch 2.x's opening on a new connection (VALIDATE and PING): true when the server
    // echoed PING (2.x, from then on in its numbering), false when it closed the connection
    // (1.13: the next one goes without an opening).
    task<bool> torch2_hello(std::chrono::steady_clock::time_point deadline);

    // The client's half of AUTH (see detail::query), after a HELLO answered with a nonce.
    task<> authenticate(std::chrono::steady_clock::time_point answer_by);

    task<> reconnect(duration timeout);
    // Names the new connection's local end to a server in this process (see
    // detail::local_store_clients), instead of the last one's.
    void note_local_end();

    static constexpr std::chrono::seconds hello_answer_time{5};

    io::reactor& reactor_;
    io::endpoint server_;
    io::socket sock_;
    bool broken_ = true;
    bool status_replies_ = false;  // the server said HELLO back: replies start with a status
    bool plain_server_ = false;    // the server closed the connection at HELLO (torch's)
    bool dialect_known_ = false;   // a torch server's numbering was found out
    bool torch2_ = false;          // ... and it is torch 2.x's (see detail::query)
    std::string job_token_;        // proved to a server that asks for it
    bool wait_for_server_ = true;  // see connect
    async_mutex mutex_;
    std::string local_end_;  // see note_local_end
};

}  // namespace rendezvous

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/rendezvous/impl/tcp_store.ipp>
#endif
