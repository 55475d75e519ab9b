// Fuzz target for the store server's protocol: an input is the byte stream one client sends.
// It goes through the server's request parser and store table (rendezvous/tcp_store.hpp) the
// way a connection does, without sockets, and checks what must hold whatever the bytes are:
//
// - parsing the stream in pieces (as it arrives from a socket) gives the same requests, and
//   the same refusal, as parsing it whole;
// - the parser never asks for more than one request's limit of buffered bytes;
// - an ADD's reply is the exact sum of the old value and the delta, or a refusal (no wrap);
// - a WAIT is woken once, only when its last missing key appears; waiters whose "client goes
//   away" are taken out of every list (ASan sees a stale one), and none is left listed.
//
// Built with libFuzzer where the compiler has it (clang: -fsanitize=fuzzer), else with
// standalone_driver.cpp, a seeded random-mutation loop; tests/fuzz/README.md says how to run
// either.

#include <corocoll/rendezvous/tcp_store.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <string>
#include <string_view>
#include <vector>

namespace rdv = corocoll::rendezvous;
namespace d = corocoll::rendezvous::detail;

namespace {

// Small limits, so that inputs of a few KiB reach them.
d::store_limits fuzz_limits() {
    d::store_limits l;
    l.max_key_bytes = 64;
    l.max_value_bytes = 1024;
    l.max_keys_per_request = 16;
    return l;
}

void check(bool ok) {
    if (!ok) __builtin_trap();
}

struct parsed {
    std::vector<d::store_request> requests;
    bool refused = false;
    d::reply_status why{};
};

bool same(const d::store_request& a, const d::store_request& b) {
    return a.q == b.q && a.keys == b.keys && a.value == b.value && a.desired == b.desired &&
           a.delta == b.delta;
}

// Parses `in` as a connection does: whole when `cut` is 0, else received in pieces of 1 to
// `cut` bytes, their sizes drawn from a generator seeded with `cut`.
parsed parse_stream(std::string_view in, unsigned cut) {
    const d::store_limits limits = fuzz_limits();
    d::request_parser parser(limits);
    parsed out;
    std::size_t begin = 0;  // the current request's first byte
    std::size_t end = 0;    // bytes received
    std::uint32_t lcg = cut;
    for (;;) {
        d::parse_result r = parser.parse(in.substr(begin, end - begin));
        if (r.status == d::parse_status::complete) {
            check(r.bytes >= 1 && r.bytes <= end - begin);
            out.requests.push_back(parser.take());
            begin += r.bytes;
            continue;
        }
        if (r.status == d::parse_status::refused) {
            check(!r.why.reason.empty());
            out.refused = true;
            out.why = r.why.status;
            return out;
        }
        check(r.bytes > end - begin);
        check(r.bytes <= limits.max_request_bytes());
        if (end == in.size()) return out;  // the client stops here
        std::size_t step = in.size();
        if (cut != 0) {
            lcg = lcg * 1664525u + 1013904223u;
            step = 1 + (lcg >> 16) % cut;
        }
        end = std::min(in.size(), end + step);
    }
}

struct harness_waiter : d::store_table::waiter {
    std::vector<std::string> keys;
    int woken = 0;
    bool seen = false;  // its wake-up was checked
    static void on_ready(d::store_table::waiter& w) noexcept {
        ++static_cast<harness_waiter&>(w).woken;
    }
};

std::int64_t read_i64(const d::wire_writer& out, std::size_t at) {
    std::int64_t v = 0;
    check(out.size() >= at + sizeof(v));
    std::memcpy(&v, out.view().data() + at, sizeof(v));
    return v;
}

// Applies the requests to a table as the server does; DELETE_KEY also makes the oldest parked
// WAIT's client go away.
void apply(std::vector<d::store_request>& requests) {
    d::store_table table;
    std::list<harness_waiter> parked;
    for (auto& req : requests) {
        d::wire_writer out;
        if (req.q == d::query::hello || req.q == d::query::auth) continue;  // not the table's
        if (req.q == d::query::wait) {
            if (table.all_present(req.keys)) continue;
            auto& w = parked.emplace_back();
            w.ready = &harness_waiter::on_ready;
            w.keys = req.keys;
            table.park(w, w.keys);
            check(w.missing > 0);
            continue;
        }
        if (req.q == d::query::delete_key && !parked.empty()) {
            table.unpark(parked.front(), parked.front().keys);
            parked.pop_front();
        }
        // ADD: the old value as the table holds it, to check the sum against.
        bool had_old = false;
        std::int64_t old = 0;
        if (req.q == d::query::add && table.all_present(req.keys)) {
            d::store_request get{d::query::get, req.keys, {}, {}, 0, {}};
            d::wire_writer value;
            check(!table.apply(get, value));
            std::string text(reinterpret_cast<const char*>(value.view().data()) + 8,
                             value.size() - 8);
            try {
                old = d::parse_store_int(req.keys[0], text);
                had_old = true;
            } catch (const std::invalid_argument&) {
            }
        }
        std::int64_t delta = req.delta;
        auto no = table.apply(req, out);
        if (req.q == d::query::add) {
            std::int64_t sum = 0;
            bool overflows = __builtin_add_overflow(had_old ? old : 0, delta, &sum);
            if (overflows) check(no && no->status == d::reply_status::overflow);
            if (!no) check(read_i64(out, 0) == sum);
        }
        if (no) check(out.size() == 0);
        for (auto& w : parked) {
            check(w.woken <= 1);
            check((w.woken == 1) == (w.missing == 0));
            // Woken by this very request (DELETE wakes nobody): its keys are all there.
            if (w.woken == 1 && !w.seen) {
                check(table.all_present(w.keys));
                w.seen = true;
            }
        }
    }
    // Every client that is still waiting goes away now.
    for (auto& w : parked) table.unpark(w, w.keys);
    check(table.awaited_keys() == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    // The first byte says how the stream is cut into pieces (as a socket delivers it); the
    // rest is the stream.
    if (size == 0) return 0;
    std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);
    parsed whole = parse_stream(stream, 0);
    parsed pieces = parse_stream(stream, 1 + data[0] % 64);
    check(whole.refused == pieces.refused && whole.why == pieces.why);
    check(whole.requests.size() == pieces.requests.size());
    for (std::size_t i = 0; i < whole.requests.size(); ++i) {
        check(same(whole.requests[i], pieces.requests[i]));
    }
    apply(whole.requests);
    return 0;
}
