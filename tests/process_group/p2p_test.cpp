#include "../support/pattern.hpp"
#include "../support/ranks.hpp"

#include <doctest/doctest.h>

#include <sys/socket.h>

#include <atomic>
#include <stdexcept>
#include <tuple>

using namespace corocoll_test;

namespace {

void expect(bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error("check failed: " + what);
}

}  // namespace

TEST_CASE("p2p moves 0 B to 64 MiB between two ranks with content checked, both ways") {
    const std::size_t sizes[] = {0, 1, 2, 63, 64, 65, 4095, 4096, 65537, (1u << 20) + 3, 64u << 20};
    auto errors = run_threads(2, [&](cc::process_group& pg) -> cc::task<> {
        int peer = 1 - pg.rank();
        unsigned seed = 0;
        for (std::size_t size : sizes) {
            auto mine = pattern(size, ++seed * 2 + static_cast<unsigned>(pg.rank()));
            auto theirs = pattern(size, seed * 2 + static_cast<unsigned>(peer));
            std::vector<std::byte> in(size);
            // Both directions at once: each rank sends while it receives.
            auto [from, unused] = co_await cc::when_all(pg.recv(in, peer), pg.send(mine, peer));
            expect(from == peer, "sender rank");
            expect(in == theirs, "content of " + std::to_string(size) + " bytes");
        }
    });
    check_every_rank_ok(errors);
}

TEST_CASE("receives match by tag, whatever order the messages arrive in") {
    auto errors = run_threads(2, [](cc::process_group& pg) -> cc::task<> {
        if (pg.rank() == 0) {
            for (int tag = 0; tag < 5; ++tag) {
                std::vector<int> v{tag * 100};
                co_await pg.send(v, 1, tag);
            }
        } else {
            // Posted in reverse: tag 4 is wanted first but arrives last.
            for (int tag = 4; tag >= 0; --tag) {
                std::vector<int> v{-1};
                co_await pg.recv(v, 0, tag);
                expect(v[0] == tag * 100, "value for tag " + std::to_string(tag));
            }
        }
    });
    check_every_rank_ok(errors);
}

TEST_CASE("messages between one pair with one tag never overtake each other") {
    auto errors = run_threads(2, [](cc::process_group& pg) -> cc::task<> {
        constexpr int count = 300;
        if (pg.rank() == 0) {
            std::vector<cc::work<>> sends;
            std::vector<std::vector<int>> bufs;
            bufs.reserve(count);
            for (int i = 0; i < count; ++i) {
                bufs.push_back(std::vector<int>(static_cast<std::size_t>(1 + i % 7) * 1000, i));
                sends.push_back(pg.isend(bufs.back(), 1, 7));
            }
            for (auto& s : sends) co_await s;
        } else {
            for (int i = 0; i < count; ++i) {
                std::vector<int> v(7000);
                co_await pg.recv(v, 0, 7);
                expect(v[0] == i, "message " + std::to_string(i) + " in order");
            }
        }
    });
    check_every_rank_ok(errors);
}

TEST_CASE("recv from any source reports the sender") {
    auto errors = run_threads(4, [](cc::process_group& pg) -> cc::task<> {
        if (pg.rank() != 0) {
            std::vector<int> v{pg.rank()};
            co_await pg.send(v, 0);
        } else {
            std::vector<int> seen;
            for (int i = 0; i < 3; ++i) {
                std::vector<int> v{-1};
                int from = co_await pg.recv(v, cc::any_source);
                expect(v[0] == from, "payload names its sender");
                seen.push_back(from);
            }
            std::sort(seen.begin(), seen.end());
            expect(seen == std::vector<int>{1, 2, 3}, "one message from each rank");
        }
    });
    check_every_rank_ok(errors);
}

TEST_CASE("1,000 concurrent isends and irecvs complete with their data") {
    auto errors = run_threads(2, [](cc::process_group& pg) -> cc::task<> {
        constexpr int count = 1000;
        std::vector<std::vector<std::int64_t>> bufs(count);
        std::vector<cc::work<>> sends;
        std::vector<cc::work<int>> recvs;
        int peer = 1 - pg.rank();
        for (int i = 0; i < count; ++i) {
            if (pg.rank() == 0) {
                bufs[i] = std::vector<std::int64_t>(16, i);
                sends.push_back(pg.isend(bufs[i], peer, i));
            } else {
                bufs[i] = std::vector<std::int64_t>(16, -1);
                recvs.push_back(pg.irecv(bufs[i], peer, i));
            }
        }
        for (auto& s : sends) co_await s;
        for (auto& r : recvs) expect(co_await r == 0, "sender");
        if (pg.rank() == 1) {
            for (int i = 0; i < count; ++i)
                expect(bufs[i][15] == i, "payload " + std::to_string(i));
        }
    });
    check_every_rank_ok(errors);
}

TEST_CASE("batch_isend_irecv exchanges around a ring of 5 ranks") {
    auto errors = run_threads(5, [](cc::process_group& pg) -> cc::task<> {
        int next = (pg.rank() + 1) % pg.size(), prev = (pg.rank() + pg.size() - 1) % pg.size();
        std::vector<int> out{pg.rank() * 11}, in{-1};
        auto works =
            pg.batch_isend_irecv({cc::p2p_op::isend(out, next), cc::p2p_op::irecv(in, prev)});
        for (auto& w : works) co_await w;
        expect(in[0] == prev * 11, "value from the previous rank");
    });
    check_every_rank_ok(errors);
}

TEST_CASE("unexpected messages beyond the buffer bound wait in TCP, and none is lost") {
    thread_ranks_options o;
    o.limits.unexpected_bytes_per_peer = 1 << 20;
    auto errors = run_threads(
        2,
        [](cc::process_group& pg) -> cc::task<> {
            constexpr int count = 16;  // 16 x 512 KiB = 8 MiB, eight times the bound
            if (pg.rank() == 0) {
                for (int i = 0; i < count; ++i) {
                    auto v = pattern(512 << 10, static_cast<unsigned>(i));
                    co_await pg.send(v, 1, i % 3);
                }
            } else {
                co_await pg.reactor().sleep_for(200ms);  // let the sender run ahead
                for (int i = 0; i < count; ++i) {
                    std::vector<std::byte> v(512 << 10);
                    co_await pg.recv(v, 0, i % 3);
                    expect(v == pattern(512 << 10, static_cast<unsigned>(i)),
                           "message " + std::to_string(i));
                }
            }
        },
        o);
    check_every_rank_ok(errors);
}

TEST_CASE("a message longer than the receive buffer is an error, and the stream goes on") {
    auto errors = run_threads(2, [](cc::process_group& pg) -> cc::task<> {
        if (pg.rank() == 0) {
            std::vector<int> big(100, 1), small{5};
            co_await pg.send(big, 1);
            co_await pg.send(small, 1);
        } else {
            std::vector<int> v(10);
            bool failed = false;
            try {
                co_await pg.recv(v, 0);
            } catch (const std::system_error& e) {
                failed = e.code() == cc::errc::message_too_large &&
                         std::string(e.what()).find("400 bytes") != std::string::npos;
            }
            expect(failed, "too-long message reported with its size");
            co_await pg.recv(v, 0);
            expect(v[0] == 5, "the next message still arrives");
        }
    });
    check_every_rank_ok(errors);
}

TEST_CASE("bad peers are rejected before anything is sent") {
    auto errors = run_threads(2, [](cc::process_group& pg) -> cc::task<> {
        std::vector<int> v{1};
        bool out_of_range = false, self = false;
        try {
            co_await pg.send(v, 2);
        } catch (const std::invalid_argument& e) {
            out_of_range =
                std::string(e.what()).find("rank 2 is outside [0, 2)") != std::string::npos;
        }
        try {
            co_await pg.recv(v, pg.rank());
        } catch (const std::invalid_argument& e) {
            self = std::string(e.what()).find("this rank itself") != std::string::npos;
        }
        expect(out_of_range && self, "both rejected with reasons");
    });
    check_every_rank_ok(errors);
}

TEST_CASE("a receive nobody answers times out with the group's timeout") {
    thread_ranks_options o;
    o.timeout = 2s;
    auto errors = run_threads(
        2,
        [](cc::process_group& pg) -> cc::task<> {
            if (pg.rank() == 0) {
                // Stays in the group (sending nothing) past rank 1's deadline.
                co_await pg.reactor().sleep_for(2500ms);
            } else {
                std::vector<int> v(1);
                auto t0 = std::chrono::steady_clock::now();
                bool timed_out = false;
                try {
                    co_await pg.recv(v, 0, 99);
                } catch (const std::system_error& e) {
                    timed_out = e.code() == std::errc::timed_out &&
                                std::string(e.what()).find("recv from rank 0 (tag 99)") !=
                                    std::string::npos;
                }
                auto waited = std::chrono::steady_clock::now() - t0;
                expect(timed_out, "timed_out naming the op");
                expect(waited >= 1900ms && waited < 5s, "about the timeout");
            }
        },
        o);
    check_every_rank_ok(errors);
}

TEST_CASE("8 ranks as threads, started in random order with delays, pass messages all ways") {
    thread_ranks_options o;
    o.max_start_delay = 300ms;
    auto errors = run_threads(
        8,
        [](cc::process_group& pg) -> cc::task<> {
            std::vector<cc::task<>> ops;
            std::vector<std::vector<int>> in(8, std::vector<int>(3, -1)), out(8);
            for (int peer = 0; peer < pg.size(); ++peer) {
                if (peer == pg.rank()) continue;
                out[peer] = {pg.rank(), peer, pg.rank() * 8 + peer};
                ops.push_back(pg.send(out[peer], peer, 5));
                ops.push_back(
                    [](cc::process_group& g, std::vector<int>& buf, int from) -> cc::task<> {
                        co_await g.recv(buf, from, 5);
                    }(pg, in[peer], peer));
            }
            co_await cc::when_all(std::move(ops));
            for (int peer = 0; peer < pg.size(); ++peer) {
                if (peer == pg.rank()) continue;
                expect(in[peer] == std::vector<int>{peer, pg.rank(), peer * 8 + pg.rank()},
                       "message from " + std::to_string(peer));
            }
        },
        o);
    check_every_rank_ok(errors);
}

TEST_CASE("a rank that closes early does not disturb the others") {
    auto errors = run_threads(3, [](cc::process_group& pg) -> cc::task<> {
        if (pg.rank() == 0) co_return;  // leaves at once: its goodbye is no failure
        int peer = 3 - pg.rank();
        co_await pg.reactor().sleep_for(100ms);
        for (int i = 0; i < 20; ++i) {
            std::vector<int> out{i}, in{-1};
            co_await cc::when_all(pg.send(out, peer), pg.recv(in, peer));
            expect(in[0] == i, "exchange between ranks 1 and 2");
        }
        // Receiving from the departed rank fails at once, naming it.
        std::vector<int> v(1);
        bool named = false;
        try {
            co_await pg.recv(v, 0);
        } catch (const std::system_error& e) {
            named =
                std::string(e.what()).find("rank 0 closed its process group") != std::string::npos;
        }
        expect(named, "recv from the departed rank names it");
    });
    check_every_rank_ok(errors);
}

TEST_CASE("a world size that differs between ranks fails set-up with both sizes named") {
    cc::rendezvous::tcp_store_server server(cc::io::endpoint::loopback(0));
    auto errors = run_ranks(2, [&](int rank, cc::io::reactor& r) -> cc::task<> {
        cc::init_options init;
        init.rank = rank;
        init.world_size = rank == 0 ? 2 : 3;  // rank 1 believes in 3 ranks
        init.timeout = 3s;
        init.store = co_await cc::rendezvous::tcp_store::connect(r, server.local_endpoint(), 3s);
        auto pg = co_await cc::init_process_group(r, init);
        co_await pg->close();
    });
    // Whoever reads the other's hello reports the mismatch; the other side fails too.
    bool named = false;
    for (const auto& e : errors) {
        if (what(e).find("world size 3") != std::string::npos &&
            what(e).find("world size 2") != std::string::npos)
            named = true;
    }
    CHECK(named);
    CHECK(what(errors[0]) != "");
    CHECK(what(errors[1]) != "");
}

TEST_CASE("set-up with a rank missing fails within the timeout, saying who is awaited") {
    thread_ranks_options o;
    o.timeout = 1s;
    auto server = std::make_shared<cc::rendezvous::tcp_store_server>(cc::io::endpoint::loopback(0));
    cc::io::reactor r;
    auto t0 = std::chrono::steady_clock::now();
    std::string error;
    try {
        auto main = [&]() -> cc::task<> {
            cc::init_options init;
            init.rank = 0;
            init.world_size = 2;
            init.timeout = 1s;
            init.store =
                co_await cc::rendezvous::tcp_store::connect(r, server->local_endpoint(), 1s);
            auto pg = co_await cc::init_process_group(r, init);
            co_await pg->close();
        };
        r.run(main());
    } catch (const std::exception& e) {
        error = e.what();
    }
    auto waited = std::chrono::steady_clock::now() - t0;
    CHECK(error.find("missing: rank(s) 1") != std::string::npos);
    CHECK(waited < 5s);
}

namespace {

int send_buffer_of(int fd) {
    int bytes = 0;
    socklen_t len = sizeof(bytes);
    ::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, &len);
    return bytes;
}

}  // namespace

TEST_CASE("connections between ranks on one host get the small send buffer; 0 keeps autotuning") {
    cc::io::reactor r;
    for (std::size_t want : {std::size_t{256} << 10, std::size_t{0}}) {
        CAPTURE(want);
        auto listener = cc::io::acceptor::listen(r, cc::io::endpoint::loopback(0));
        auto pair = r.run(
            cc::when_all(listener.accept(), cc::io::socket::connect(r, listener.local_endpoint())));
        std::vector<cc::io::socket> to_1(2), to_0(2);
        to_1[1] = std::move(std::get<0>(pair));
        to_0[0] = std::move(std::get<1>(pair));
        int fd = to_1[1].native_handle();
        int before = send_buffer_of(fd);
        cc::transport::engine_options o;
        o.same_host_send_buffer = want;
        cc::transport::engine e0(r, 0, 2, std::move(to_1), o);
        cc::transport::engine e1(r, 1, 2, std::move(to_0), o);
        if (want != 0) {
            CHECK(send_buffer_of(fd) == static_cast<int>(2 * want));  // the kernel doubles it
        } else {
            CHECK(send_buffer_of(fd) == before);
        }
        // 8 MiB through the half-megabyte buffer, both ways at once.
        auto out = pattern(8u << 20, 7);
        std::vector<std::byte> in0(out.size()), in1(out.size());
        auto deadline = cc::io::deadline_after(std::chrono::seconds(30));
        r.run(cc::when_all(e0.send(out, 1, 5, deadline), e1.recv(in1, 0, 5, deadline),
                           e1.send(out, 0, 6, deadline), e0.recv(in0, 1, 6, deadline)));
        CHECK(in0 == out);
        CHECK(in1 == out);
        r.run(cc::when_all(e0.close(), e1.close()));
    }
}
