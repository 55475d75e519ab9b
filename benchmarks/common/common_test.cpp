// Tests of benchmarks/common/: the parser, the report writer and bus_factor. Built as C++17,
// as compare/gloo_perf.cpp includes these headers.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "args.hpp"
#include "bandwidth.hpp"
#include "report.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace {

// The message of the usage_error `f` throws ("" where it throws none).
template <class F>
std::string error_of(F f) {
    try {
        f();
    } catch (const perf::usage_error& e) {
        return e.what();
    }
    return "";
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// Runs `a.parse` over `words` (the program name first).
bool parse(perf::args& a, std::vector<const char*> words) {
    words.insert(words.begin(), "prog");
    return a.parse(static_cast<int>(words.size()), words.data());
}

// What a report writes to its stream, through `write`.
template <class F>
std::string written(perf::format f, F write) {
    std::FILE* file = std::tmpfile();
    REQUIRE(file != nullptr);
    {
        perf::report r(f, "", file);
        write(r);
    }
    std::rewind(file);
    std::string out;
    for (int ch; (ch = std::fgetc(file)) != EOF;) out += static_cast<char>(ch);
    std::fclose(file);
    return out;
}

}  // namespace

TEST_CASE("a size reads K, M and G as powers of 1024, and a fraction that comes out whole") {
    CHECK(perf::parse_size("-b", "0") == 0);
    CHECK(perf::parse_size("-b", "64") == 64);
    CHECK(perf::parse_size("-b", "4K") == 4096);
    CHECK(perf::parse_size("-b", "4k") == 4096);
    CHECK(perf::parse_size("-s", "1.5M") == 1572864);
    CHECK(perf::parse_size("-s", "0.5K") == 512);
    CHECK(perf::parse_size("-s", "1.0") == 1);
    CHECK(perf::parse_size("-s", "0.0009765625M") == 1024);
    CHECK(perf::parse_size("-e", "2G") == std::size_t{2} << 30);
}

TEST_CASE("a size that is not a whole number of bytes is refused, never rounded") {
    CHECK(error_of([] { perf::parse_size("-s", "1.3M"); }) ==
          "-s 1.3M: not a whole number of bytes");
    CHECK(contains(error_of([] { perf::parse_size("-s", "1.5"); }), "not a whole number"));
    CHECK(contains(error_of([] { perf::parse_size("-s", "0.1K"); }), "not a whole number"));
}

TEST_CASE("a size that is not a number, or too large, is refused naming the flag") {
    for (const char* bad : {"", "K", "abc", "4X", "4KB", "-1", "1e6", " 4", "4 ", "1.2.3", "."}) {
        CAPTURE(bad);
        CHECK(contains(error_of([bad] { perf::parse_size("-b", bad); }),
                       std::string("-b ") + bad + ": expected a size"));
    }
    CHECK(contains(error_of([] { perf::parse_size("-e", "99999999999999999999999"); }),
                   "too many digits"));
    CHECK(contains(error_of([] { perf::parse_size("-e", "17179869184G"); }), "too large"));
}

TEST_CASE("format_size writes what parse_size reads back") {
    for (std::size_t b : {std::size_t{0}, std::size_t{1}, std::size_t{1536}, std::size_t{4096},
                          std::size_t{32} << 20, std::size_t{3} << 30}) {
        CHECK(perf::parse_size("-b", perf::format_size(b)) == b);
    }
    CHECK(perf::format_size(std::size_t{32} << 20) == "32M");
    CHECK(perf::format_size(1536) == "1536");
}

TEST_CASE("options are read as -b 4, -b4, --minbytes 4 and --minbytes=4 alike") {
    for (const auto& words : std::vector<std::vector<const char*>>{
             {"-b", "4"}, {"-b4"}, {"--minbytes", "4"}, {"--minbytes=4"}}) {
        perf::sweep s;
        perf::args a("prog", "test");
        s.declare(a);
        CHECK(parse(a, words));
        CHECK(s.min_bytes == 4);
    }
}

TEST_CASE("an unknown option, a missing value and a bad value each name the flag") {
    perf::sweep s;
    perf::args a("prog", "test");
    s.declare(a);
    CHECK(error_of([&] { parse(a, {"-x", "1"}); }) == "unknown option -x");
    CHECK(error_of([&] { parse(a, {"stray"}); }) == "unexpected argument 'stray'");
    CHECK(error_of([&] { parse(a, {"-n"}); }) == "-n needs a value (N)");
    CHECK(error_of([&] {
              parse(a, {"-n", "0"});
          }) == "-n 0: expected a whole number from 1 to 1000000000");
    CHECK(error_of([&] {
              parse(a, {"-n", "3x"});
          }) == "-n 3x: expected a whole number from 1 to 1000000000");
    CHECK(error_of([&] { parse(a, {"-c", "2"}); }) == "-c 2: expected a whole number from 0 to 1");
    CHECK(error_of([&] { parse(a, {"-f", "1"}); }) == "-f 1: expected a number above 1");
    CHECK(error_of([&] { parse(a, {"-f", "inf"}); }) == "-f inf: expected a number above 1");
    CHECK(error_of([&] { parse(a, {"-b", "8", "-e", "4"}); }) == "-e 4 is below -b 8");
}

TEST_CASE("a flag that moved is refused with the hint that names its new letter") {
    std::string type = "float";
    perf::args a("prog", "test");
    a.one_of("-d,--datatype", type, {"float", "double"}, "the type").moved("-t", "use -d");
    CHECK(error_of([&] { parse(a, {"-t", "float"}); }) == "-t: use -d");
    CHECK(error_of([&] { parse(a, {"-tfloat"}); }) == "-t: use -d");
    CHECK(parse(a, {"-d", "double"}));
    CHECK(type == "double");
    CHECK(error_of([&] { parse(a, {"-d", "int"}); }) == "-d int: expected one of float, double");
}

TEST_CASE("a list option takes one name, several with commas, or all") {
    std::vector<std::string> got{"a"};
    perf::args a("prog", "test");
    a.some_of("--coll", got, {"a", "b", "c"}, "which");
    CHECK(parse(a, {"--coll", "c,a"}));
    CHECK(got == std::vector<std::string>{"c", "a"});
    CHECK(parse(a, {"--coll", "all"}));
    CHECK(got == std::vector<std::string>{"a", "b", "c"});
    CHECK(contains(error_of([&] { parse(a, {"--coll", "a,,b"}); }), "--coll a,,b: expected"));
}

TEST_CASE("--help stops parsing and lists every option with its default") {
    perf::sweep s;
    perf::args a("prog", "What prog does.");
    s.declare(a);
    CHECK_FALSE(parse(a, {"-n", "3", "--help", "-x"}));
    std::string h = a.help();
    CHECK(contains(h, "usage: prog [options]"));
    CHECK(contains(h, "What prog does."));
    CHECK(contains(h, "-e, --maxbytes SIZE"));
    CHECK(contains(h, "(default 32M)"));
    CHECK(contains(h, "(default 20)"));  // as declared, not as parsed so far
    CHECK(contains(h, "-h, --help"));
}

TEST_CASE("the sweep's sizes go from -b to -e by -f and stop where the factor adds nothing") {
    perf::sweep s;
    s.min_bytes = 4;
    s.max_bytes = 64;
    s.factor = 4;
    CHECK(s.sizes() == std::vector<std::size_t>{4, 16, 64});
    s.min_bytes = 1;
    s.factor = 1.5;
    CHECK(s.sizes() == std::vector<std::size_t>{1});
}

TEST_CASE("JSON rows stay valid JSON: NaN and infinity are null, text is escaped") {
    std::string out = written(perf::format::json, [](perf::report& r) {
        r.row({{"a", {std::nan(""), 2}},
               {"b", {std::numeric_limits<double>::infinity(), 2}},
               {"c", {1.25, 3}},
               {"d", "say \"hi\"\\\n"},
               {"e", perf::value()},
               {"f", -1}});
    });
    CHECK(out ==
          "[\n  {\"a\": null, \"b\": null, \"c\": 1.250, \"d\": \"say \\\"hi\\\"\\\\\\u000a\", "
          "\"e\": null, \"f\": -1}\n]\n");
}

TEST_CASE("JSON has one row a line, and a report without rows is an empty array") {
    CHECK(written(perf::format::json, [](perf::report&) {}) == "[]\n");
    std::string out = written(perf::format::json, [](perf::report& r) {
        r.comment("not in JSON");
        r.row({{"size", 4}});
        r.row({{"size", 8}});
    });
    CHECK(out == "[\n  {\"size\": 4},\n  {\"size\": 8}\n]\n");
}

TEST_CASE("CSV has a header of the field names and an empty field where a value is absent") {
    std::string out = written(perf::format::csv, [](perf::report& r) {
        r.row({{"size", 4}, {"time", {std::nan(""), 1}}, {"note", "a,b"}, {"x", perf::value()}});
    });
    CHECK(out == "size,time,note,x\n4,,\"a,b\",\n");
}

TEST_CASE("the text table has banners, titles and units, and N/A in the cells a row lacks") {
    std::string out = written(perf::format::text, [](perf::report& r) {
        r.comment("title");
        r.table({{"", {{"size", "(B)", 6}}}, {"group", {{"time", "(us)", 6}, {"bw", "", 4}}}});
        r.row({{"size", 64}, {"time", {1.5, 2}}}, {64, {1.5, 2}});
    });
    CHECK(out ==
          "# title\n"
          "#             group\n"
          "#  size   time   bw\n"
          "#   (B)   (us)\n"
          "     64   1.50  N/A\n");
}

TEST_CASE("bus_factor is nccl-tests' for every collective") {
    CHECK(perf::bus_factor("all_reduce", 4) == doctest::Approx(1.5));
    CHECK(perf::bus_factor("all_gather", 4) == doctest::Approx(0.75));
    CHECK(perf::bus_factor("reduce_scatter", 3) == doctest::Approx(2.0 / 3));
    CHECK(perf::bus_factor("all_to_all", 2) == doctest::Approx(0.5));
    CHECK(perf::bus_factor("gather", 2) == doctest::Approx(0.5));
    CHECK(perf::bus_factor("scatter", 2) == doctest::Approx(0.5));
    CHECK(perf::bus_factor("broadcast", 8) == 1);
    CHECK(perf::bus_factor("reduce", 8) == 1);
    CHECK(perf::bus_factor("ping_pong", 2) == 1);
    CHECK_THROWS_AS(perf::bus_factor("barrier", 2), std::invalid_argument);
    CHECK(perf::algbw_gbs(1000, 1) == doctest::Approx(1));
    CHECK(perf::algbw_gbs(1000, 0) == 0);
}
