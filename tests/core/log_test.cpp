#include <corocoll/corocoll.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace cc = corocoll;

namespace {

struct kept {
    cc::log_level level;
    std::string subsystem;
    int rank;
    std::string message;
    std::string line;
};

void keep(const cc::log_record& r, void* context) noexcept {
    static_cast<std::vector<kept>*>(context)->push_back(
        {r.level, std::string(r.subsystem), r.rank, std::string(r.message), std::string(r.line)});
}

// What reaches file descriptor 2 while `body` runs.
template <class F>
std::string stderr_during(F body) {
    std::fflush(stderr);
    char name[] = "/tmp/corocoll-log-XXXXXX";
    int file = ::mkstemp(name);
    REQUIRE(file >= 0);
    ::unlink(name);
    int saved = ::dup(2);
    ::dup2(file, 2);
    body();
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    std::string text(4096, '\0');
    auto n = ::pread(file, text.data(), text.size(), 0);
    ::close(file);
    text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    return text;
}

}  // namespace

TEST_CASE("a log sink gets corocoll's lines instead of stderr, at the level set from code") {
    std::vector<kept> got;
    cc::set_log_sink(keep, &got);
    cc::set_log_level(cc::log_level::info);
    CHECK(cc::get_log_level() == cc::log_level::info);
    auto path =
        std::filesystem::temp_directory_path() / ("corocoll-log-" + std::to_string(::getpid()));
    std::filesystem::remove(path);
    auto printed = stderr_during([&] {
        // A group of one logs its set-up at INFO.
        cc::io::reactor r;
        cc::init_options o;
        o.rank = 0;
        o.world_size = 1;
        o.init_method = "file://" + path.string();
        auto pg = r.run(cc::init_process_group(r, o));
        r.run(pg->close());
        COROCOLL_LOG(trace, "TEST", "not at info");
        COROCOLL_LOG(warn, "TEST", "answer ", 42);
    });
    std::filesystem::remove(path);
    CHECK(printed == "");
    REQUIRE(got.size() >= 2);
    bool ready = false;
    for (const auto& k : got) {
        CHECK(k.level != cc::log_level::trace);
        if (k.subsystem == "INIT" && k.message == "group 'default' ready: rank 0 of 1") {
            ready = true;
            CHECK(k.level == cc::log_level::info);
            CHECK(k.rank == 0);
            CHECK(k.line.find("] INFO INIT: group 'default' ready: rank 0 of 1\n") !=
                  std::string::npos);
        }
    }
    CHECK(ready);
    CHECK(got.back().level == cc::log_level::warn);
    CHECK(got.back().subsystem == "TEST");
    CHECK(got.back().message == "answer 42");

    // Without a sink the same lines go to stderr again; level none turns them off.
    cc::set_log_sink(nullptr);
    auto count = got.size();
    printed = stderr_during([] { COROCOLL_LOG(warn, "TEST", "to stderr"); });
    CHECK(printed.find("] WARN TEST: to stderr\n") != std::string::npos);
    cc::set_log_level(cc::log_level::none);
    printed = stderr_during([] { COROCOLL_LOG(warn, "TEST", "nowhere"); });
    CHECK(printed == "");
    CHECK(got.size() == count);
}
