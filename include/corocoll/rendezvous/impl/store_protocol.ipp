// The bodies of the non-template functions declared in <corocoll/rendezvous/store_protocol.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/rendezvous/store_protocol.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {

namespace detail {

COROCOLL_DECL corocoll::detail::auth_proof store_proof(std::string_view token, bool from_client,
                                                       const corocoll::detail::auth_nonce& first,
                                                       const corocoll::detail::auth_nonce& second) {
    std::string message = from_client ? "corocoll store client" : "corocoll store server";
    message.append(reinterpret_cast<const char*>(first.data()), first.size());
    message.append(reinterpret_cast<const char*>(second.data()), second.size());
    return corocoll::detail::hmac_sha256(token, message);
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

COROCOLL_DECL std::optional<parse_result> request_parser::query_byte(unsigned char b) {
    if (!torch2_) {
        if (b >= static_cast<unsigned char>(query::validate)) {
            return refuse(reply_status::unsupported, "unknown query " + std::to_string(b));
        }
        req_.q = static_cast<query>(b);
        return std::nullopt;
    }
    if (b < std::size(torch2_queries)) {
        req_.q = torch2_queries[b];
        return std::nullopt;
    }
    static constexpr const char* unserved[] = {"QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN", "LIST_KEYS",
                                               "BARRIER"};
    if (b == torch2_list_keys) {
        req_.q = query::list_keys;
        return std::nullopt;
    }
    const std::size_t i = b - std::size(torch2_queries);
    return refuse(reply_status::unsupported,
                  "torch 2.x query " + std::to_string(b) +
                      (i < std::size(unserved) ? std::string(" (") + unserved[i] + ")" : "") +
                      " is not served");
}

COROCOLL_DECL parse_result request_parser::parse(std::string_view in) {
    if (pos_ == 0) {
        if (in.empty()) return more(1);
        const auto b = static_cast<unsigned char>(in[0]);
        if (first_ && b == 0) {
            // torch 2.x's VALIDATE, or 1.13's SET: the next 4 bytes tell (see `query`).
            if (in.size() < 5) return more(5);
            std::uint32_t magic = 0;
            std::memcpy(&magic, in.data() + 1, 4);
            if (magic == torch2_validation_magic) {
                first_ = false;
                torch2_ = true;
                req_.q = query::validate;
                pos_ = 5;
                return done();
            }
        }
        first_ = false;
        if (auto stop = query_byte(b)) return *stop;
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
            case query::multi_get:
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
            case query::cancel_wait:
            case query::list_keys:
                return done();
            case query::validate:
            case query::ping:
                // VALIDATE again (its first is taken above), PING: a u32.
                if (field_ == 0) {
                    std::uint64_t v = 0;
                    stop = u32_field(in, v);
                    if (!stop && req_.q == query::validate && v != torch2_validation_magic) {
                        return refuse(reply_status::unsupported, "VALIDATE: wrong magic");
                    }
                    req_.delta = static_cast<std::int64_t>(v);
                } else {
                    return done();
                }
                break;
            case query::append:
                if (field_ == 0)
                    stop = key_field(in);
                else if (field_ == 1)
                    stop = string_field(in, req_.value, "value");
                else
                    return done();
                break;
            case query::multi_set:
                if (field_ == 0) {
                    stop = integer_field(in, key_count_);
                    if (!stop && key_count_ > limits_.max_keys_per_request) {
                        return refuse(reply_status::too_large,
                                      name() + ": " + std::to_string(key_count_) +
                                          " keys exceed the server's limit of " +
                                          std::to_string(limits_.max_keys_per_request));
                    }
                } else if (field_ <= 2 * key_count_) {
                    if (field_ % 2 == 1) {
                        stop = key_field(in);
                    } else {
                        // Resumed until the value is whole: one slot per value.
                        if (req_.values.size() < field_ / 2) req_.values.emplace_back();
                        stop = string_field(in, req_.values.back(), "value");
                    }
                } else {
                    return done();
                }
                break;
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
    std::string out = q < std::size(names)           ? names[q]
                      : req_.q == query::auth        ? "AUTH"
                      : req_.q == query::multi_get   ? "MULTI_GET"
                      : req_.q == query::validate    ? "VALIDATE"
                      : req_.q == query::append      ? "APPEND"
                      : req_.q == query::multi_set   ? "MULTI_SET"
                      : req_.q == query::cancel_wait ? "CANCEL_WAIT"
                      : req_.q == query::ping        ? "PING"
                      : req_.q == query::list_keys   ? "LIST_KEYS"
                                                     : "HELLO";
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

COROCOLL_DECL std::optional<parse_result> request_parser::u32_field(std::string_view in,
                                                                    std::uint64_t& v) {
    if (in.size() - pos_ < 4) return more(pos_ + 4);
    std::uint32_t w = 0;
    std::memcpy(&w, in.data() + pos_, 4);
    v = w;
    pos_ += 4;
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

}  // namespace detail

}  // namespace rendezvous

COROCOLL_END_NAMESPACE
