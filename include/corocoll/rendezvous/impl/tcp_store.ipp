// The bodies of the non-template functions declared in <corocoll/rendezvous/tcp_store.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/rendezvous/tcp_store.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {

COROCOLL_DECL task<std::shared_ptr<tcp_store>> tcp_store::connect(io::reactor& r,
                                                                  io::endpoint server,
                                                                  duration timeout,
                                                                  std::string job_token,
                                                                  bool wait_for_server) {
    std::shared_ptr<tcp_store> s(new tcp_store(r, server, timeout));
    s->job_token_ = std::move(job_token);
    s->wait_for_server_ = wait_for_server;
    co_await s->reconnect(timeout);
    co_return s;
}

COROCOLL_DECL task<> tcp_store::set(std::string key, std::string value) {
    auto lock = co_await mutex_.scoped_lock();
    detail::wire_writer w;
    w.u8(detail::wire_number(detail::query::set, torch2_));
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
    w.u8(detail::wire_number(detail::query::get, torch2_));
    w.bytes(wire_key(key));
    std::string what = "get '" + key + "'";
    auto in = co_await request(w, what);
    co_return co_await guarded(in.bytes(detail::max_value_bytes, "value"), what);
}

COROCOLL_DECL task<std::int64_t> tcp_store::add(std::string key, std::int64_t delta) {
    auto lock = co_await mutex_.scoped_lock();
    detail::wire_writer w;
    w.u8(detail::wire_number(detail::query::add, torch2_));
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
    w.u8(detail::wire_number(detail::query::compare_set, torch2_));
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
    w.u8(detail::wire_number(detail::query::wait, torch2_));
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

COROCOLL_DECL task<std::vector<std::string>> tcp_store::multi_get(std::vector<std::string> keys,
                                                                  duration timeout) {
    // Known since connect: a torch server closed the connection at our HELLO.
    if (!status_replies_) co_return co_await store::multi_get(std::move(keys), timeout);
    auto lock = co_await mutex_.scoped_lock();
    detail::wire_writer w;
    w.u8(detail::wire_number(detail::query::wait, torch2_));
    w.u64(keys.size());
    for (const auto& k : keys) w.bytes(wire_key(k));
    w.u8(detail::wire_number(detail::query::multi_get, torch2_));
    w.u64(keys.size());
    for (const auto& k : keys) w.bytes(wire_key(k));
    std::string what = "multi_get " + rendezvous::detail::join_keys(keys);
    auto in = co_await request(w, what, timeout);
    std::uint8_t reply = co_await guarded(in.u8(), what, timeout);
    if (reply != detail::wait_stop_waiting) {
        broken_ = true;
        corocoll::detail::throw_error(corocoll::errc::protocol_error,
                                      "corocoll: store " + server_.to_string() + ": " + what +
                                          ": unexpected reply " + std::to_string(reply));
    }
    // The MULTI_GET's reply: its status, then the values.
    auto values_in = co_await reply_of(what, timeout, io::op_options(io::deadline_after(timeout)));
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
        values.push_back(
            co_await guarded(values_in.bytes(detail::max_value_bytes, "value"), what, timeout));
    }
    co_return values;
}

COROCOLL_DECL task<bool> tcp_store::check(std::vector<std::string> keys) {
    auto lock = co_await mutex_.scoped_lock();
    detail::wire_writer w;
    w.u8(detail::wire_number(detail::query::check, torch2_));
    w.u64(keys.size());
    for (const auto& k : keys) w.bytes(wire_key(k));
    std::string what = "check " + rendezvous::detail::join_keys(keys);
    auto in = co_await request(w, what);
    co_return co_await guarded(in.u8(), what) == detail::check_ready;
}

COROCOLL_DECL task<bool> tcp_store::delete_key(std::string key) {
    auto lock = co_await mutex_.scoped_lock();
    detail::wire_writer w;
    w.u8(detail::wire_number(detail::query::delete_key, torch2_));
    w.bytes(wire_key(key));
    std::string what = "delete '" + key + "'";
    auto in = co_await request(w, what);
    co_return co_await guarded(in.i64(), what) > 0;
}

COROCOLL_DECL task<std::int64_t> tcp_store::num_keys() {
    auto lock = co_await mutex_.scoped_lock();
    detail::wire_writer w;
    w.u8(detail::wire_number(detail::query::get_num_keys, torch2_));
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
    co_return co_await reply_of(what, timeout, std::move(o));
}

COROCOLL_DECL task<detail::wire_reader> tcp_store::reply_of(std::string what, duration timeout,
                                                            io::op_options o) {
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

COROCOLL_DECL task<bool> tcp_store::torch2_hello(std::chrono::steady_clock::time_point deadline) {
    // VALIDATE, then PING with a nonce that a 2.x server echoes. torch 1.13's reads the two as
    // a SET whose key length is the magic, PING's byte and the nonce's first 3 bytes: with
    // those 0xFF it is past what a std::vector can hold, so 1.13's server fails at once and
    // closes the connection, allocating nothing.
    detail::wire_writer w;
    w.u8(detail::wire_number(detail::query::validate, true));
    const std::uint32_t magic = detail::torch2_validation_magic;
    w.raw(&magic, sizeof(magic));
    w.u8(detail::wire_number(detail::query::ping, true));
    const std::uint32_t nonce = 0x00FFFFFFu | (static_cast<std::uint32_t>(::getpid()) << 24);
    w.raw(&nonce, sizeof(nonce));
    std::uint32_t echo = 0;
    auto answer_by = std::min(deadline, io::deadline_after(hello_answer_time));
    try {
        co_await sock_.send(w.view(), answer_by);
        co_await sock_.recv(std::as_writable_bytes(std::span(&echo, 1)), answer_by);
    } catch (const std::system_error& e) {
        if (e.code() == std::errc::timed_out && answer_by < deadline) {
            corocoll::detail::throw_error(
                corocoll::errc::protocol_error,
                "corocoll: store " + server_.to_string() +
                    ": the server accepted the connection but answered neither HELLO nor "
                    "torch 2.x's PING within " +
                    std::to_string(hello_answer_time.count()) +
                    " s; is it a store, and one with descriptors to spare (a store out of "
                    "them, at its RLIMIT_NOFILE, leaves new clients unanswered)?");
        }
        if (e.code() != corocoll::errc::connection_closed &&
            e.code() != std::errc::connection_reset && e.code() != std::errc::broken_pipe) {
            throw;
        }
        dialect_known_ = true;  // torch 1.13's: plain, in its numbering
        sock_.close();
        co_return false;
    }
    if (echo != nonce) {
        corocoll::detail::throw_error(corocoll::errc::protocol_error,
                                      "corocoll: store " + server_.to_string() +
                                          ": the server answered torch 2.x's PING with something "
                                          "else; is it a store?");
    }
    torch2_ = true;
    dialect_known_ = true;
    co_return true;
}

COROCOLL_DECL task<bool> tcp_store::hello(std::chrono::steady_clock::time_point deadline) {
    status_replies_ = false;
    if (plain_server_) {
        // A torch server: which numbering, once; torch 2.x's validates every connection.
        if (!dialect_known_ || torch2_) co_return co_await torch2_hello(deadline);
        co_return true;
    }
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
        // torch's servers close the connection at a query they do not know, but for torch
        // 2.x's libuv server, which neither answers nor closes: both are tried with torch's
        // own opening next (`torch2_hello`, which says so if that goes unanswered too).
        const bool unanswered = e.code() == std::errc::timed_out && answer_by < deadline;
        if (!unanswered && e.code() != corocoll::errc::connection_closed &&
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
    namespace auth = corocoll::detail;
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

COROCOLL_DECL tcp_store::~tcp_store() {
    if (!local_end_.empty()) detail::local_store_clients::instance().remove(local_end_);
}

COROCOLL_DECL void tcp_store::note_local_end() {
    auto& own = detail::local_store_clients::instance();
    if (!local_end_.empty()) own.remove(std::exchange(local_end_, std::string()));
    try {
        local_end_ = sock_.local_endpoint().to_string();
    } catch (const std::system_error&) {
        return;  // a server in this process counts it as another's: it waits for it longer
    }
    own.add(local_end_);
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
            note_local_end();
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
            // A server that was up and refuses now is gone.
            if (!wait_for_server_ && last != std::errc::timed_out) fail(e, "connect");
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
