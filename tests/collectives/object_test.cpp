#include "../support/largest_allocation.hpp"

#include <corocoll/collectives/object.hpp>

#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cc = corocoll;

// The largest single allocation since the last reset shows that forged lengths are rejected
// before anything is allocated for them.
using corocoll_test::largest_allocation;

namespace object_test {

struct point {
    int x = 0;
    double y = 0;
    char tag = 0;
    bool operator==(const point&) const = default;
};

enum class color : std::uint8_t { red = 1, green = 2 };

/// A user type with non-trivial members, customized by free functions in its namespace.
struct person {
    std::string name;
    std::vector<int> scores;
    std::optional<std::string> nickname;
    std::map<std::string, point> places;
    bool operator==(const person&) const = default;
};

void corocoll_serialize(cc::object_writer& w, const person& p) {
    w.write(p.name);
    w.write(p.scores);
    w.write(p.nickname);
    w.write(p.places);
}

void corocoll_deserialize(cc::object_reader& r, person& p) {
    r.read(p.name);
    r.read(p.scores);
    r.read(p.nickname);
    r.read(p.places);
}

/// Trivially copyable, but customized (as hidden friends): the customization wins over the
/// memcpy. Encodes in one byte and checks it on the way back.
struct small {
    int value = 0;
    bool operator==(const small&) const = default;
    friend void corocoll_serialize(cc::object_writer& w, const small& s) {
        w.write_value(static_cast<std::uint8_t>(s.value));
    }
    friend void corocoll_deserialize(cc::object_reader& r, small& s) {
        auto byte = r.read_value<std::uint8_t>();
        if (byte == 0xff) r.throw_invalid("small of 255");
        s.value = byte;
    }
};

/// Writes nothing at all: containers of it cannot be checked against the bytes left.
struct empty_thing {
    bool operator==(const empty_thing&) const = default;
    friend void corocoll_serialize(cc::object_writer&, const empty_thing&) {}
    friend void corocoll_deserialize(cc::object_reader&, empty_thing&) {}
};

struct only_writes {
    friend void corocoll_serialize(cc::object_writer&, const only_writes&) {}
};

struct not_copyable_thing {
    std::unique_ptr<int> p;
};

struct no_default {
    explicit no_default(int v) : value(v) {}
    int value;
};

}  // namespace object_test

// A type the user does not own: the ADL pair may live in namespace corocoll, which ADL
// searches through object_writer's (inline) namespace.
namespace corocoll {
inline void corocoll_serialize(object_writer& w, const std::deque<int>& d) {
    w.write_length(d.size());
    for (int v : d) w.write_value(v);
}
inline void corocoll_deserialize(object_reader& r, std::deque<int>& d) {
    std::uint64_t n = r.read_length();
    if (n > r.remaining() / sizeof(int)) r.throw_truncated("a std::deque<int>");
    d.clear();
    for (std::uint64_t i = 0; i < n; ++i) d.push_back(r.read_value<int>());
}
}  // namespace corocoll

using namespace object_test;

namespace {

template <class T>
T round_trip(const T& value) {
    return cc::from_bytes<T>(cc::to_bytes(value));
}

/// Runs `f`, which must throw `std::system_error` with `errc::protocol_error` and a message
/// containing `needle`; returns the message.
template <class F>
std::string expect_protocol_error(F&& f, std::string_view needle = {}) {
    try {
        f();
    } catch (const std::system_error& e) {
        CHECK(e.code() == cc::errc::protocol_error);
        std::string what = e.what();
        CHECK_MESSAGE(what.find(needle) != std::string::npos, what);
        CHECK(what.rfind("corocoll: object: ", 0) == 0);
        return what;
    }
    FAIL("no protocol error");
    return {};
}

/// `bytes` with the 8 bytes at `offset` replaced by `n`.
std::string forge_length(std::string bytes, std::size_t offset, std::uint64_t n) {
    REQUIRE(offset + sizeof(n) <= bytes.size());
    std::memcpy(bytes.data() + offset, &n, sizeof(n));
    return bytes;
}

std::string random_bytes(std::size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    return s;
}

person sample_person(int i) {
    person p;
    p.name = "rank " + std::to_string(i);
    for (int k = 0; k < i; ++k) p.scores.push_back(k * i);
    if (i % 2 == 1) p.nickname = std::string("n\0ck", 4);
    p.places["home"] = {i, 0.5 * i, 'h'};
    if (i > 1) p.places["work"] = {-i, 1e300, 'w'};
    return p;
}

}  // namespace

// The concept agrees with what compiles.
static_assert(cc::serializable<int>);
static_assert(cc::serializable<bool>);
static_assert(cc::serializable<point>);
static_assert(cc::serializable<color>);
static_assert(cc::serializable<std::string>);
static_assert(cc::serializable<std::vector<std::vector<std::string>>>);
static_assert(cc::serializable<std::map<std::string, std::tuple<int, std::optional<double>>>>);
static_assert(cc::serializable<std::unordered_map<int, std::array<std::string, 2>>>);
static_assert(cc::serializable<std::pair<person, std::vector<bool>>>);
static_assert(cc::serializable<std::tuple<>>);
static_assert(cc::serializable<small>);
static_assert(cc::serializable<std::deque<int>>);
static_assert(cc::serializable<int[3]>);
static_assert(!cc::serializable<int*>);
static_assert(!cc::serializable<const char*>);
static_assert(!cc::serializable<std::string_view>);
static_assert(!cc::serializable<std::vector<int*>>);
static_assert(!cc::serializable<std::unique_ptr<int>>);
static_assert(!cc::serializable<not_copyable_thing>);
static_assert(!cc::serializable<only_writes>);
static_assert(!cc::serializable<std::deque<double>>);
static_assert(!cc::serializable<std::vector<no_default>>);
static_assert(!cc::serializable<std::map<int, std::vector<std::string_view>>>);

TEST_CASE("trivially copyable values round-trip bit for bit in sizeof(T) bytes") {
    for (int v : {0, 1, -1, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()}) {
        CHECK(round_trip(v) == v);
    }
    CHECK(cc::to_bytes(42).size() == sizeof(int));
    CHECK(round_trip(std::uint64_t{1} << 63) == std::uint64_t{1} << 63);
    CHECK(round_trip(std::int8_t{-5}) == -5);
    CHECK(round_trip('\0') == '\0');
    for (double d : {0.0, -0.0, 1.5, -1e-308, std::numeric_limits<double>::infinity()}) {
        double back = round_trip(d);
        CHECK(std::bit_cast<std::uint64_t>(back) == std::bit_cast<std::uint64_t>(d));
    }
    CHECK(std::isnan(round_trip(std::numeric_limits<double>::quiet_NaN())));
    CHECK(round_trip(color::green) == color::green);
    point p{-7, 3.25, 'z'};
    CHECK(round_trip(p) == p);
    CHECK(cc::to_bytes(p).size() == sizeof(point));
}

TEST_CASE("bools are one byte, 0 or 1, and other values are rejected") {
    CHECK(cc::to_bytes(true) == std::string("\x01", 1));
    CHECK(cc::to_bytes(false) == std::string("\x00", 1));
    CHECK(round_trip(true));
    CHECK_FALSE(round_trip(false));
    expect_protocol_error([] { (void)cc::from_bytes<bool>(std::string("\x02", 1)); },
                          "the 1-byte value of a bool is 2, not 0 or 1 (at byte 0)");
    expect_protocol_error([] { (void)cc::from_bytes<bool>(""); },
                          "truncated data reading the 1-byte value of a bool (0 left)");
}

TEST_CASE("strings round-trip: empty, one byte, embedded NULs and 1 MiB") {
    std::string nuls("a\0b\0\0c", 6);
    for (const std::string& s : {std::string(), std::string("x"), nuls, random_bytes(1 << 20, 1)}) {
        CAPTURE(s.size());
        std::string bytes = cc::to_bytes(s);
        CHECK(bytes.size() == 8 + s.size());
        CHECK(cc::from_bytes<std::string>(bytes) == s);
    }
}

TEST_CASE("vectors round-trip: of ints, strings, vectors, bools and structs, sizes 0, 1, many") {
    for (std::size_t n : {0u, 1u, 2u, 1000u}) {
        CAPTURE(n);
        std::vector<int> ints(n);
        std::vector<std::string> strings;
        std::vector<std::vector<int>> nested;
        std::vector<bool> bools;
        std::vector<point> points;
        for (std::size_t i = 0; i < n; ++i) {
            ints[i] = static_cast<int>(i * 7919) - 5;
            strings.emplace_back(i % 5, static_cast<char>('a' + i % 26));
            nested.emplace_back(i % 3, static_cast<int>(i));
            bools.push_back(i % 3 == 0);
            points.push_back({static_cast<int>(i), i * 0.5, 'p'});
        }
        CHECK(cc::to_bytes(ints).size() == 8 + 4 * n);
        CHECK(round_trip(ints) == ints);
        CHECK(round_trip(strings) == strings);
        CHECK(round_trip(nested) == nested);
        CHECK(cc::to_bytes(bools).size() == 8 + n);
        CHECK(round_trip(bools) == bools);
        CHECK(round_trip(points) == points);
    }
}

TEST_CASE("deserializing into a non-empty object replaces its contents") {
    std::vector<std::string> v{"old", "stuff", "here"};
    std::string bytes = cc::to_bytes(std::vector<std::string>{"new"});
    cc::object_reader r(bytes);
    r.read(v);
    CHECK(v == std::vector<std::string>{"new"});
    std::map<int, int> m{{1, 1}, {2, 2}};
    std::string bytes2 = cc::to_bytes(std::map<int, int>{{3, 3}});
    cc::object_reader r2(bytes2);
    r2.read(m);
    CHECK(m == std::map<int, int>{{3, 3}});
    std::optional<int> o = 5;
    std::string bytes3 = cc::to_bytes(std::optional<int>{});
    cc::object_reader r3(bytes3);
    r3.read(o);
    CHECK_FALSE(o.has_value());
    // A reader over a temporary string does not compile.
    static_assert(!std::is_constructible_v<cc::object_reader, std::string&&>);
    static_assert(std::is_constructible_v<cc::object_reader, std::string&>);
    static_assert(std::is_constructible_v<cc::object_reader, const char(&)[4]>);
}

TEST_CASE("pairs, tuples, optionals, arrays and maps round-trip") {
    CHECK(round_trip(std::pair<int, std::string>{3, "three"}) ==
          std::pair<int, std::string>{3, "three"});
    CHECK(cc::to_bytes(std::tuple<>{}).empty());
    CHECK(round_trip(std::tuple<>{}) == std::tuple<>{});
    std::tuple<int, std::string, std::vector<double>, bool> t{1, "one", {1.0, 2.0}, true};
    CHECK(round_trip(t) == t);
    CHECK(round_trip(std::optional<std::string>{}) == std::nullopt);
    CHECK(round_trip(std::optional<std::string>{""}) == std::optional<std::string>{""});
    CHECK(cc::to_bytes(std::optional<int>{}).size() == 1);
    CHECK(cc::to_bytes(std::optional<int>{7}).size() == 5);
    CHECK(round_trip(std::optional<int>{7}) == 7);
    std::array<int, 3> a{1, 2, 3};
    CHECK(cc::to_bytes(a).size() == 12);
    CHECK(round_trip(a) == a);
    std::array<std::string, 2> as{"x", ""};
    CHECK(round_trip(as) == as);
    std::array<bool, 3> ab{true, false, true};
    CHECK(round_trip(ab) == ab);
    CHECK(round_trip(std::array<int, 0>{}) == std::array<int, 0>{});
    std::map<std::string, int> m{{"b", 2}, {"a", 1}, {"", 0}};
    CHECK(round_trip(m) == m);
    CHECK(round_trip(std::map<int, int>{}).empty());
    std::unordered_map<int, std::vector<std::string>> um;
    for (int i = 0; i < 100; ++i) um[i * 31] = std::vector<std::string>(i % 4, "v");
    CHECK(round_trip(um) == um);
    std::map<int, std::optional<std::pair<std::string, std::tuple<bool, double>>>> deep{
        {1, std::nullopt}, {2, std::pair{"two", std::tuple{true, 2.5}}}};
    CHECK(round_trip(deep) == deep);
}

TEST_CASE("user types round-trip through corocoll_serialize/corocoll_deserialize found by ADL") {
    person p = sample_person(3);
    CHECK(round_trip(p) == p);
    CHECK(round_trip(person{}) == person{});
    std::vector<person> people;
    people.reserve(5);
    for (int i = 0; i < 5; ++i) people.push_back(sample_person(i));
    CHECK(round_trip(people) == people);
    std::map<std::string, person> by_name;
    for (const person& q : people) by_name[q.name] = q;
    CHECK(round_trip(by_name) == by_name);

    // The customization wins over the memcpy of a trivially copyable type.
    CHECK(cc::to_bytes(small{9}).size() == 1);
    CHECK(round_trip(std::vector<small>{{1}, {2}, {3}}) == std::vector<small>{{1}, {2}, {3}});
    expect_protocol_error([] { (void)cc::from_bytes<small>(std::string("\xff", 1)); },
                          "small of 255 (at byte 1)");

    // A customization for a type the user does not own, in namespace corocoll.
    std::deque<int> d{4, 5, 6};
    CHECK(cc::to_bytes(d).size() == 8 + 12);
    CHECK(round_trip(d) == d);

    // Containers of types that encode to nothing at all.
    std::vector<empty_thing> empties(1000);
    CHECK(cc::to_bytes(empties).size() == 8);
    CHECK(round_trip(empties) == empties);
    CHECK(round_trip(std::vector<std::tuple<>>(5)).size() == 5);
}

TEST_CASE("object_writer appends and object_reader reads several values in sequence") {
    std::string out = "hdr";
    cc::object_writer w(out);
    w.write(std::string("abc"));
    w.write(17);
    w.write_length(2);
    w.write_bytes("xy", 2);
    w.write_bytes(nullptr, 0);
    CHECK(w.size() == 3 + 11 + 4 + 8 + 2);
    CHECK(&w.bytes() == &out);

    cc::object_reader r(std::string_view(out).substr(3));
    CHECK(r.read<std::string>() == "abc");
    CHECK(r.read<int>() == 17);
    CHECK(r.read_length() == 2);
    CHECK(r.position() == 11 + 4 + 8);
    CHECK(r.read_view(2) == "xy");
    CHECK(r.at_end());
    CHECK(r.remaining() == 0);
    expect_protocol_error([&] { (void)r.read_view(1); }, "truncated data reading 1 byte (0 left)");
    expect_protocol_error([&] { (void)r.read_value<int>(); },
                          "truncated data reading an int of 4 bytes (0 left)");

    std::vector<std::byte> raw(4);
    int v = 12345;
    std::memcpy(raw.data(), &v, 4);
    cc::object_reader rs{std::span<const std::byte>(raw)};
    CHECK(rs.read<int>() == 12345);
}

TEST_CASE("truncation errors name what was being read and how much was left") {
    std::string s = cc::to_bytes(std::string(1000, 'x')).substr(0, 8 + 12);
    expect_protocol_error([&] { (void)cc::from_bytes<std::string>(s); },
                          "corocoll: object: truncated data reading a std::string of 1000 bytes "
                          "(12 left)");
    expect_protocol_error([] { (void)cc::from_bytes<std::vector<int>>("abc"); },
                          "truncated data reading the 8-byte length of a std::vector<int> "
                          "(3 left)");
    std::string v = cc::to_bytes(std::vector<int>{1, 2, 3});
    expect_protocol_error([&] { (void)cc::from_bytes<std::vector<int>>(v.substr(0, 17)); },
                          "a std::vector<int> of 3 elements of 4 bytes each (9 left)");
    std::string vs = cc::to_bytes(std::vector<std::string>{"a", "b"});
    expect_protocol_error(
        [&] { (void)cc::from_bytes<std::vector<std::string>>(vs.substr(0, 15)); },
        "a std::vector<std::string> of 2 elements of at least 8 bytes each (7 left)");
    expect_protocol_error([] { (void)cc::from_bytes<point>("12"); },
                          "truncated data reading an object_test::point of " +
                              std::to_string(sizeof(point)) + " bytes (2 left)");
    expect_protocol_error([] { (void)cc::from_bytes<std::optional<int>>(""); },
                          "the 1-byte flag of a std::optional<int> (0 left)");
}

TEST_CASE("every truncated prefix of a nested object throws protocol_error") {
    using nested =
        std::tuple<std::map<std::string, std::vector<std::pair<int, std::string>>>,
                   std::vector<person>, std::optional<std::array<small, 2>>, std::vector<bool>,
                   std::unordered_map<int, std::optional<double>>, std::deque<int>, point>;
    nested value;
    std::get<0>(value)["alpha"] = {{1, "one"}, {2, std::string("t\0o", 3)}};
    std::get<0>(value)["beta"] = {};
    std::get<0>(value)[""] = {{3, ""}};
    for (int i = 0; i < 4; ++i) std::get<1>(value).push_back(sample_person(i));
    std::get<2>(value) = std::array<small, 2>{small{1}, small{2}};
    std::get<3>(value) = {true, false, true};
    std::get<4>(value) = {{1, 1.5}, {2, std::nullopt}};
    std::get<5>(value) = {7, 8};
    std::get<6>(value) = {1, 2.0, 'c'};

    std::string bytes = cc::to_bytes(value);
    REQUIRE(cc::from_bytes<nested>(bytes) == value);
    for (std::size_t k = 0; k < bytes.size(); ++k) {
        CAPTURE(k);
        // A copy of exactly k bytes, so that ASan sees any read past its end.
        auto prefix = std::make_unique<char[]>(k + 1);
        std::memcpy(prefix.get(), bytes.data(), k);
        expect_protocol_error(
            [&] { (void)cc::from_bytes<nested>(std::string_view(prefix.get(), k)); }, "truncated");
    }
}

TEST_CASE("a forged length of 2^60 throws at once without allocating for it") {
    auto check_forged = [](auto type_tag, const std::string& bytes, std::size_t offset,
                           std::string_view needle) {
        using T = typename decltype(type_tag)::type;
        for (std::uint64_t n : {std::uint64_t{1} << 60, std::uint64_t{1} << 31,
                                std::numeric_limits<std::uint64_t>::max()}) {
            CAPTURE(n);
            std::string forged = forge_length(bytes, offset, n);
            auto start = std::chrono::steady_clock::now();
            largest_allocation = 0;
            try {
                (void)cc::from_bytes<T>(forged);
                FAIL("accepted a forged length");
            } catch (const std::system_error& e) {
                std::size_t largest = largest_allocation;
                CHECK(largest < (std::size_t{1} << 20));
                CHECK(e.code() == cc::errc::protocol_error);
                std::string what = e.what();
                CHECK_MESSAGE(what.find(needle) != std::string::npos, what);
            }
            CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
        }
    };
    auto tag = [](auto* p) { return std::type_identity<std::remove_pointer_t<decltype(p)>>{}; };

    check_forged(tag((std::string*)nullptr), cc::to_bytes(std::string("abc")), 0,
                 "truncated data reading a std::string of");
    check_forged(tag((std::vector<int>*)nullptr), cc::to_bytes(std::vector<int>{1, 2}), 0,
                 "elements of 4 bytes each");
    check_forged(tag((std::vector<std::string>*)nullptr),
                 cc::to_bytes(std::vector<std::string>{"a"}), 0, "of at least 8 bytes each");
    check_forged(tag((std::vector<std::vector<int>>*)nullptr),
                 cc::to_bytes(std::vector<std::vector<int>>{{1, 2, 3}}), 8,
                 "a std::vector<int> of");
    check_forged(tag((std::vector<bool>*)nullptr), cc::to_bytes(std::vector<bool>{true}), 0,
                 "std::vector<bool>");
    check_forged(tag((std::map<int, int>*)nullptr), cc::to_bytes(std::map<int, int>{{1, 2}}), 0,
                 "entries of at least 8 bytes each");
    check_forged(tag((std::unordered_map<int, std::string>*)nullptr),
                 cc::to_bytes(std::unordered_map<int, std::string>{{1, "x"}}), 0,
                 "std::unordered_map<int, std::string>");
    check_forged(tag((std::vector<person>*)nullptr),
                 cc::to_bytes(std::vector<person>{sample_person(2)}), 0, "std::vector<");
    check_forged(tag((std::vector<empty_thing>*)nullptr), cc::to_bytes(std::vector<empty_thing>(3)),
                 0, "std::vector<");
    check_forged(tag((std::vector<std::tuple<>>*)nullptr),
                 cc::to_bytes(std::vector<std::tuple<>>(3)), 0, "std::vector<std::tuple<>>");
}

TEST_CASE("from_bytes rejects trailing bytes") {
    expect_protocol_error([] { (void)cc::from_bytes<int>(cc::to_bytes(42) + "x"); },
                          "1 byte left over after reading an int of 4 bytes");
    expect_protocol_error(
        [] {
            (void)cc::from_bytes<std::vector<std::string>>(
                cc::to_bytes(std::vector<std::string>{"a"}) + "garbage");
        },
        "7 bytes left over after reading a std::vector<std::string> of 17 bytes");
    // Bytes of a longer value read as a shorter one.
    expect_protocol_error([] { (void)cc::from_bytes<int>(cc::to_bytes(std::int64_t{1})); },
                          "4 bytes left over");
}

TEST_CASE("invalid optional flags and duplicate map keys are rejected") {
    std::string opt = cc::to_bytes(std::optional<int>{1});
    opt[0] = 2;
    expect_protocol_error([&] { (void)cc::from_bytes<std::optional<int>>(opt); },
                          "the 1-byte flag of a std::optional<int> is 2, not 0 or 1");
    std::string vb = cc::to_bytes(std::vector<bool>{true, false});
    vb[9] = 9;
    expect_protocol_error([&] { (void)cc::from_bytes<std::vector<bool>>(vb); },
                          "the 1-byte element of a std::vector<bool> is 9, not 0 or 1 (at byte 9)");

    // Two entries with the same key: a std::map of {1: 2, 3: 4} with the second key set to 1.
    std::string m = cc::to_bytes(std::map<int, int>{{1, 2}, {3, 4}});
    int one = 1;
    std::memcpy(m.data() + 16, &one, sizeof one);
    expect_protocol_error([&] { (void)cc::from_bytes<std::map<int, int>>(m); },
                          "duplicate key in entry 1 of a std::map<int, int>");
    std::string um = cc::to_bytes(std::unordered_map<int, int>{{1, 2}, {3, 4}});
    std::memcpy(um.data() + 16, um.data() + 8, sizeof one);
    expect_protocol_error([&] { (void)cc::from_bytes<std::unordered_map<int, int>>(um); },
                          "duplicate key in entry 1 of a std::unordered_map<int, int>");
}
