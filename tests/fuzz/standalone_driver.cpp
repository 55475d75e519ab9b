// A main() for a fuzz target where libFuzzer is missing (g++): a seeded random-mutation loop.
// It takes a few of libFuzzer's flags, so that the same command runs either build:
//
//   <target> [-seed=N] [-runs=N] [-max_total_time=S] [-max_len=N] [-seed_inputs=f1,f2,...]
//            [corpus dir or file ...]
//
// Every corpus input runs once as it is, then mutated copies of them (bit flips, bytes set to
// boundary values, inserted or erased ranges, copies within an input, splices of two inputs,
// 8-byte lengths set to 0, 1, limits and 2^63) until the run count or the time is used up.
// There is no coverage feedback: it finds what random mutation around a good corpus finds.
// A crash is a crash (the sanitizers report it); the input that caused it is saved as
// <-artifact_prefix>crash-input. At the end it prints the inputs run.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

using bytes = std::vector<std::uint8_t>;

bool flag(const char* arg, const char* name, long long& value) {
    std::size_t n = std::strlen(name);
    if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
    value = std::atoll(arg + n + 1);
    return true;
}

void load(const std::filesystem::path& p, std::vector<bytes>& corpus) {
    if (std::filesystem::is_directory(p)) {
        std::vector<std::filesystem::path> files;
        for (const auto& e : std::filesystem::directory_iterator(p)) files.push_back(e.path());
        std::sort(files.begin(), files.end());  // the same order, so a seed replays
        for (const auto& f : files) load(f, corpus);
        return;
    }
    std::ifstream in(p, std::ios::binary);
    if (!in) {
        std::fprintf(stderr, "standalone_driver: cannot read %s\n", p.c_str());
        std::exit(2);
    }
    corpus.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void mutate(bytes& b, const std::vector<bytes>& corpus, std::mt19937_64& rng, std::size_t max_len) {
    auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
    static constexpr std::uint64_t lengths[] = {
        0, 1, 8, 63, 64, 65, 1023, 1024, 1025, 1u << 16, 1u << 30, ~0ull >> 1, 1ull << 63, ~0ull};
    int steps = 1 + static_cast<int>(rng() % 4);
    for (int s = 0; s < steps; ++s) {
        switch (rng() % 8) {
            case 0:  // flip a bit
                if (!b.empty()) b[pick(b.size())] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
                break;
            case 1: {  // a byte to a boundary value or a query type
                static constexpr std::uint8_t values[] = {0, 1, 2,    3,    4,    5,   6,
                                                          7, 8, 0xC0, 0x7f, 0x80, 0xff};
                if (!b.empty()) b[pick(b.size())] = values[pick(std::size(values))];
                break;
            }
            case 2: {  // insert random bytes
                std::size_t n = 1 + pick(16);
                bytes more(n);
                for (auto& x : more) x = static_cast<std::uint8_t>(rng());
                b.insert(b.begin() + static_cast<std::ptrdiff_t>(pick(b.size() + 1)), more.begin(),
                         more.end());
                break;
            }
            case 3: {  // erase a range
                if (b.empty()) break;
                std::size_t at = pick(b.size());
                std::size_t n = 1 + pick(std::min<std::size_t>(b.size() - at, 32));
                b.erase(b.begin() + static_cast<std::ptrdiff_t>(at),
                        b.begin() + static_cast<std::ptrdiff_t>(at + n));
                break;
            }
            case 4: {  // copy a range elsewhere (repeats a request)
                if (b.empty()) break;
                std::size_t at = pick(b.size());
                std::size_t n = 1 + pick(std::min<std::size_t>(b.size() - at, 256));
                bytes part(b.begin() + static_cast<std::ptrdiff_t>(at),
                           b.begin() + static_cast<std::ptrdiff_t>(at + n));
                b.insert(b.begin() + static_cast<std::ptrdiff_t>(pick(b.size() + 1)), part.begin(),
                         part.end());
                break;
            }
            case 5: {  // splice with another input
                const bytes& other = corpus[pick(corpus.size())];
                std::size_t keep = pick(b.size() + 1);
                b.resize(keep);
                std::size_t from = pick(other.size() + 1);
                b.insert(b.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
                break;
            }
            default: {  // an 8-byte length or integer to a boundary value
                std::uint64_t v = lengths[pick(std::size(lengths))];
                if (rng() % 4 == 0) v = ~v + 1;  // the negative, as an int64 reads it
                if (b.size() < 8) break;
                std::memcpy(b.data() + pick(b.size() - 7), &v, 8);
                break;
            }
        }
    }
    if (b.size() > max_len) b.resize(max_len);
}

// The input being run, saved by the crash handler as <artifact prefix>crash-input.
const bytes* current = nullptr;
std::string crash_path = "crash-input";

extern "C" void save_input(int sig) {
    if (current != nullptr) {
        int fd = ::open(crash_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            std::size_t done = 0;
            while (done < current->size()) {
                ssize_t n = ::write(fd, current->data() + done, current->size() - done);
                if (n <= 0) break;
                done += static_cast<std::size_t>(n);
            }
            ::close(fd);
            static const char msg[] = "standalone_driver: the input is saved as crash-input\n";
            [[maybe_unused]] ssize_t ignored = ::write(2, msg, sizeof(msg) - 1);
        }
    }
    ::signal(sig, SIG_DFL);
    ::raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
    long long seed = 1, runs = -1, max_time = 0, max_len = 4096;
    std::vector<bytes> corpus;
    for (int i = 1; i < argc; ++i) {
        if (flag(argv[i], "-seed", seed) || flag(argv[i], "-runs", runs) ||
            flag(argv[i], "-max_total_time", max_time) || flag(argv[i], "-max_len", max_len)) {
            continue;
        }
        if (std::strncmp(argv[i], "-artifact_prefix=", 17) == 0) {
            crash_path = std::string(argv[i] + 17) + "crash-input";
            continue;
        }
        if (std::strncmp(argv[i], "-seed_inputs=", 13) == 0) {
            std::string list = argv[i] + 13;
            for (std::size_t at = 0; at <= list.size();) {
                std::size_t comma = std::min(list.find(',', at), list.size());
                if (comma > at) load(list.substr(at, comma - at), corpus);
                at = comma + 1;
            }
            continue;
        }
        if (argv[i][0] == '-') {
            std::fprintf(stderr, "standalone_driver: ignoring %s\n", argv[i]);
            continue;
        }
        load(argv[i], corpus);
    }
    if (runs < 0 && max_time <= 0) runs = 100000;
    if (corpus.empty()) corpus.emplace_back();
    auto start = std::chrono::steady_clock::now();
    auto out_of_time = [&] {
        return max_time > 0 &&
               std::chrono::steady_clock::now() - start >= std::chrono::seconds(max_time);
    };
    for (int sig : {SIGABRT, SIGILL, SIGSEGV, SIGBUS, SIGFPE, SIGTRAP}) ::signal(sig, save_input);
    long long done = 0;
    for (const auto& input : corpus) {
        current = &input;
        LLVMFuzzerTestOneInput(input.data(), input.size());
        ++done;
    }
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
    bytes input;
    while ((runs < 0 || done < runs) && !out_of_time()) {
        input = corpus[rng() % corpus.size()];
        mutate(input, corpus, rng, static_cast<std::size_t>(max_len));
        current = &input;
        LLVMFuzzerTestOneInput(input.data(), input.size());
        ++done;
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "standalone_driver: %lld inputs (%zu from the corpus) in %.0f s, seed %lld, "
        "0 crashes\n",
        done, corpus.size(), secs, seed);
    return 0;
}
