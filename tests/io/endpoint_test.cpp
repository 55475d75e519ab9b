#include <corocoll/io/endpoint.hpp>

#include <doctest/doctest.h>

#include <stdexcept>

namespace cc = corocoll;

TEST_CASE("numeric IPv4 and IPv6 addresses parse and print back the same") {
    auto v4 = cc::io::endpoint::parse("127.0.0.1:29500");
    CHECK(v4.family() == AF_INET);
    CHECK(v4.port() == 29500);
    CHECK(v4.host() == "127.0.0.1");
    CHECK(v4.to_string() == "127.0.0.1:29500");
    auto v6 = cc::io::endpoint::parse("[::1]:80");
    CHECK(v6.family() == AF_INET6);
    CHECK(v6.port() == 80);
    CHECK(v6.to_string() == "[::1]:80");
    CHECK(cc::io::endpoint::from_numeric("198.18.0.1", 0).to_string() == "198.18.0.1:0");
    CHECK(cc::io::endpoint::loopback(7) == cc::io::endpoint::parse("127.0.0.1:7"));
}

TEST_CASE("malformed addresses and ports are rejected with the text in the message") {
    for (const char* bad : {"127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:12x",
                            "not-an-ip:80", "300.1.1.1:80", ":80"}) {
        CAPTURE(bad);
        try {
            (void)cc::io::endpoint::parse(bad);
            FAIL("accepted a bad address");
        } catch (const std::invalid_argument& e) {
            CHECK(std::string(e.what()).find("corocoll") != std::string::npos);
        }
    }
}

// Only names from /etc/hosts: an unknown name would send a DNS query off this machine.
TEST_CASE("localhost resolves through getaddrinfo to a loopback address") {
    auto e = cc::io::endpoint::resolve("localhost", 1234);
    CHECK(e.port() == 1234);
    CHECK((e.host() == "127.0.0.1" || e.host() == "::1"));
}

// Where the system cannot resolve it (no /etc/hosts), resolve() falls back to 127.0.0.1 for
// exactly these names.
TEST_CASE("localhost names are those RFC 6761 reserves") {
    for (const char* yes :
         {"localhost", "LocalHost", "localhost.", "rank0.localhost", "a.b.LOCALHOST."}) {
        CHECK_MESSAGE(cc::io::endpoint::is_localhost_name(yes), yes);
    }
    for (const char* no : {"", ".", "localhos", "notlocalhost", "localhost.example", "xlocalhost",
                           "localhost..", "127.0.0.1"}) {
        CHECK_MESSAGE(!cc::io::endpoint::is_localhost_name(no), no);
    }
}
