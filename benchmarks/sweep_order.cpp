// sweep_order: the copies of a 2-rank single-copy all_gather (collectives/all_gather_shm.hpp),
// without the library, in two processes: each rank copies its input block into its output,
// meets the other, copies the other's input block into its output with process_vm_readv and
// meets it again. Each call either goes forward every time, or every other call backward (the
// other's block first, in pieces from its end, then its own, also from the end), as
// shm_arena::next_sweep_backward does. Prints the time per call (the slower rank's) for both.
//
//   sweep_order [--block KiB] [--piece KiB] [--iters N] [--offset BYTES]
//   (defaults 512, 64, 4000, 0: the buffers start that many bytes into their first page)
//
// With blocks of 512 KiB a rank touches 2 MiB per call (its input, its output, the other's
// input through the kernel's copy): as much as the L2 of a core of the machine in
// docs/performance.md. Not a test: run it by hand from a release build.

#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

struct alignas(64) shared_line {
    std::atomic<std::uint64_t> value{0};
};

// What both processes see: arrival counters, input addresses, pids, and each rank's time.
struct meeting {
    shared_line arrived[2];
    shared_line input[2];
    shared_line pid[2];
    shared_line ns[2];
};

struct page_buffer {
    explicit page_buffer(std::size_t bytes)
        : at(static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))) {
        if (at == nullptr) std::abort();
    }
    ~page_buffer() { std::free(at); }
    page_buffer(const page_buffer&) = delete;
    page_buffer& operator=(const page_buffer&) = delete;
    std::byte* data() const noexcept { return at; }
    std::byte* at;
};

struct options {
    std::size_t block = 512 << 10;
    std::size_t piece = 64 << 10;
    std::size_t offset = 0;  // bytes into their first page that the buffers start
    int iters = 4000;
};

void copy_from(pid_t pid, const std::byte* from, std::byte* to, std::size_t bytes) {
    iovec local{to, bytes};
    iovec remote{const_cast<std::byte*>(from), bytes};
    if (::process_vm_readv(pid, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(bytes)) {
        std::perror("sweep_order: process_vm_readv");
        std::_Exit(1);
    }
}

void read_pieces(pid_t pid, const std::vector<iovec>& local, const std::vector<iovec>& remote,
                 std::size_t bytes) {
    if (::process_vm_readv(pid, local.data(), local.size(), remote.data(), remote.size(), 0) !=
        static_cast<ssize_t>(bytes)) {
        std::perror("sweep_order: process_vm_readv");
        std::_Exit(1);
    }
}

// One rank's loop; returns the ns per call.
std::uint64_t run(meeting& m, int me, const options& o, bool alternate) {
    const int other = 1 - me;
    // Page-aligned, then --offset bytes in (glibc's large chunks start 16 bytes in).
    page_buffer in_pages(o.offset + o.block), out_pages(o.offset + 2 * o.block);
    std::byte* in = in_pages.data() + o.offset;
    std::byte* out = out_pages.data() + o.offset;
    std::memset(in, me + 1, o.block);
    std::memset(out, 0, 2 * o.block);
    std::uint64_t step = 0;
    auto meet = [&] {
        m.arrived[me].value.store(++step, std::memory_order_release);
        while (m.arrived[other].value.load(std::memory_order_acquire) < step) {
            __builtin_ia32_pause();
        }
    };
    m.input[me].value.store(reinterpret_cast<std::uintptr_t>(in));
    m.pid[me].value.store(static_cast<std::uint64_t>(::getpid()));
    meet();
    const auto* theirs = reinterpret_cast<const std::byte*>(m.input[other].value.load());
    const auto pid = static_cast<pid_t>(m.pid[other].value.load());
    std::byte* mine_out = out + static_cast<std::size_t>(me) * o.block;
    std::byte* their_out = out + static_cast<std::size_t>(other) * o.block;
    // A backward call's one process_vm_readv: the pieces listed from the last, at most 64 of
    // them (as shm_arena::copy_from).
    const std::size_t piece = std::max(o.piece, (o.block + 63) / 64);
    std::vector<iovec> local, remote;
    for (std::size_t end = o.block; end > 0;) {
        const std::size_t from = end > piece ? end - piece : 0;
        local.push_back({their_out + from, end - from});
        remote.push_back({const_cast<std::byte*>(theirs) + from, end - from});
        end = from;
    }
    const int warmup = o.iters / 10;
    std::chrono::steady_clock::time_point start;
    for (int i = 0; i < warmup + o.iters; ++i) {
        if (i == warmup) {
            meet();
            start = std::chrono::steady_clock::now();
        }
        if (!alternate || i % 2 == 0) {
            std::memcpy(mine_out, in, o.block);
            meet();
            copy_from(pid, theirs, their_out, o.block);
        } else {
            meet();
            read_pieces(pid, local, remote, o.block);
            for (std::size_t end = o.block; end > 0;) {
                const std::size_t from = end > o.piece ? end - o.piece : 0;
                std::memcpy(mine_out + from, in + from, end - from);
                end = from;
            }
        }
        meet();
    }
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
    if (out[static_cast<std::size_t>(other) * o.block] != std::byte(other + 1)) {
        std::fprintf(stderr, "sweep_order: rank %d copied the wrong bytes\n", me);
        std::_Exit(1);
    }
    return static_cast<std::uint64_t>(ns) / static_cast<std::uint64_t>(o.iters);
}

// Both ranks' loops; returns the slower rank's ns per call.
std::uint64_t measure(const options& o, bool alternate) {
    void* at =
        ::mmap(nullptr, sizeof(meeting), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (at == MAP_FAILED) {
        std::perror("sweep_order: mmap");
        std::exit(1);
    }
    auto* m = new (at) meeting;
    std::fflush(stdout);
    pid_t child = ::fork();
    if (child < 0) {
        std::perror("sweep_order: fork");
        std::exit(1);
    }
    const int me = child == 0 ? 1 : 0;
    m->ns[me].value.store(run(*m, me, o, alternate));
    if (child == 0) std::_Exit(0);
    int status = 0;
    ::waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::exit(1);
    std::uint64_t slower = std::max(m->ns[0].value.load(), m->ns[1].value.load());
    ::munmap(at, sizeof(meeting));
    return slower;
}

}  // namespace

int main(int argc, char** argv) {
    options o;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        const long v = std::strtol(argv[i + 1], nullptr, 10);
        if (v < 0 || (v == 0 && flag != "--offset")) {
            std::fprintf(stderr, "sweep_order: %s needs a positive number\n", flag.c_str());
            return 2;
        }
        if (flag == "--block") {
            o.block = static_cast<std::size_t>(v) << 10;
        } else if (flag == "--piece") {
            o.piece = static_cast<std::size_t>(v) << 10;
        } else if (flag == "--offset") {
            o.offset = static_cast<std::size_t>(v);
        } else if (flag == "--iters") {
            o.iters = static_cast<int>(v);
        } else {
            std::fprintf(
                stderr,
                "usage: sweep_order [--block KiB] [--piece KiB] [--iters N] [--offset BYTES]\n");
            return 2;
        }
    }
    const std::uint64_t forward = measure(o, false);
    const std::uint64_t alternate = measure(o, true);
    std::printf(
        "block %zu KiB, pieces %zu KiB, %d calls: forward %.2f us, every other "
        "backward %.2f us\n",
        o.block >> 10, o.piece >> 10, o.iters, static_cast<double>(forward) / 1e3,
        static_cast<double>(alternate) / 1e3);
}
