// The GPU layer where no GPU is needed: type and op mapping, argument errors, the polled waits
// (on plain conditions), and set-up failing clearly where there is no device. Runs on every
// machine that has the CUDA runtime and NCCL libraries, with or without a GPU.

#include <corocoll/gpu.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>

namespace cc = corocoll;
using namespace std::chrono_literals;

namespace {

std::string message_of(const std::exception_ptr& e) {
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        return x.what();
    }
    return {};
}

}  // namespace

TEST_CASE("C++ element types map to NCCL's, every one NCCL has") {
    using cc::gpu::nccl_type_of;
    CHECK(nccl_type_of<std::int8_t>() == ncclInt8);
    CHECK(nccl_type_of<std::uint8_t>() == ncclUint8);
    CHECK(nccl_type_of<std::int32_t>() == ncclInt32);
    CHECK(nccl_type_of<std::uint32_t>() == ncclUint32);
    CHECK(nccl_type_of<std::int64_t>() == ncclInt64);
    CHECK(nccl_type_of<long long>() == ncclInt64);
    CHECK(nccl_type_of<std::uint64_t>() == ncclUint64);
    CHECK(nccl_type_of<__half>() == ncclFloat16);
    CHECK(nccl_type_of<cc::float16>() == ncclFloat16);
    CHECK(nccl_type_of<float>() == ncclFloat32);
    CHECK(nccl_type_of<double>() == ncclFloat64);
    CHECK(nccl_type_of<__nv_bfloat16>() == ncclBfloat16);
    CHECK(nccl_type_of<cc::bfloat16>() == ncclBfloat16);
    CHECK(nccl_type_of<__nv_fp8_e4m3>() == ncclFloat8e4m3);
    CHECK(nccl_type_of<__nv_fp8_e5m2>() == ncclFloat8e5m2);
    CHECK_FALSE(cc::gpu::nccl_element<bool>);
    CHECK_FALSE(cc::gpu::nccl_element<std::int16_t>);
    for (int t = 0; t < ncclNumTypes; ++t) {
        CHECK(std::string(cc::gpu::nccl_type_name(static_cast<ncclDataType_t>(t))) != "unknown");
    }
}

TEST_CASE("reduce ops map to NCCL's; the bitwise ones are refused with a reason") {
    using cc::reduce_op;
    CHECK(cc::gpu::nccl_op_of(reduce_op::sum, "") == ncclSum);
    CHECK(cc::gpu::nccl_op_of(reduce_op::product, "") == ncclProd);
    CHECK(cc::gpu::nccl_op_of(reduce_op::min, "") == ncclMin);
    CHECK(cc::gpu::nccl_op_of(reduce_op::max, "") == ncclMax);
    CHECK(cc::gpu::nccl_op_of(reduce_op::avg, "") == ncclAvg);
    for (auto op : {reduce_op::band, reduce_op::bor, reduce_op::bxor}) {
        CHECK_FALSE(cc::gpu::nccl_has(op));
        try {
            (void)cc::gpu::nccl_op_of(op, "corocoll: rank 2: all_reduce: ");
            FAIL("no error for ", cc::op_name(op));
        } catch (const std::invalid_argument& e) {
            std::string what = e.what();
            CAPTURE(what);
            CHECK(what.find("rank 2: all_reduce") != std::string::npos);
            CHECK(what.find(cc::op_name(op)) != std::string::npos);
            CHECK(what.find("NCCL backend") != std::string::npos);
        }
    }
}

TEST_CASE("a polled wait finishes, fails with the reason, or times out, naming op and rank") {
    cc::io::reactor r;
    // Done at once: no reactor turn.
    int asked = 0;
    r.run([&]() -> cc::task<> {
        co_await cc::gpu::until(r,
                                [&](std::string&) noexcept {
                                    ++asked;
                                    return cc::gpu::progress::done;
                                },
                                cc::io::deadline_after(1s), {"all_reduce", 3});
    }());
    CHECK(asked == 1);

    // Done after a while, set from another thread.
    std::atomic<bool> flag{false};
    std::jthread setter([&] {
        std::this_thread::sleep_for(50ms);
        flag = true;
    });
    r.run([&]() -> cc::task<> {
        co_await cc::gpu::until(r,
                                [&](std::string&) noexcept {
                                    return flag ? cc::gpu::progress::done
                                                : cc::gpu::progress::pending;
                                },
                                cc::io::deadline_after(5s), {"broadcast", 0});
    }());
    CHECK(flag);

    // Failed: the check's reason, with op and rank.
    auto failing = [&]() -> cc::task<> {
        co_await cc::gpu::until(r,
                                [&](std::string& why) noexcept {
                                    why = "NCCL: remote process exited";
                                    return cc::gpu::progress::failed;
                                },
                                cc::io::deadline_after(5s), {"reduce_scatter", 1});
    };
    std::exception_ptr e;
    try {
        r.run(failing());
    } catch (...) {
        e = std::current_exception();
    }
    REQUIRE(e);
    CHECK(message_of(e) == "corocoll: rank 1: reduce_scatter: NCCL: remote process exited");

    // Never done: the deadline, as std::errc::timed_out.
    auto t0 = std::chrono::steady_clock::now();
    try {
        r.run([&]() -> cc::task<> {
            co_await cc::gpu::until(
                r, [](std::string&) noexcept { return cc::gpu::progress::pending; },
                cc::io::deadline_after(100ms), {"all_gather", 5});
        }());
        FAIL("no timeout");
    } catch (const std::system_error& x) {
        CHECK(x.code() == std::errc::timed_out);
        std::string what = x.what();
        CAPTURE(what);
        CHECK(what.find("rank 5: all_gather") != std::string::npos);
        CHECK(what.find("deadline") != std::string::npos);
    }
    CHECK(std::chrono::steady_clock::now() - t0 >= 99ms);
    CHECK_FALSE(r.watching());
}

TEST_CASE("backend names: the CPU init points NCCL users to the GPU one, and back") {
    cc::io::reactor r;
    cc::init_options o;
    o.backend = "nccl";
    o.rank = 0;
    o.world_size = 1;
    try {
        r.run(cc::init_process_group(r, o));
        FAIL("no error");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("corocoll::gpu::init_process_group") != std::string::npos);
    }
    o.backend = "tcp";
    try {
        r.run(cc::gpu::init_process_group(r, o));
        FAIL("no error");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("sets up backend \"nccl\"") != std::string::npos);
    }
}

TEST_CASE("NCCL set-up without a usable device fails at once and says why") {
    cc::io::reactor r;
    cc::init_options o;
    o.backend = "nccl";
    o.rank = 0;
    o.world_size = 1;
    o.timeout = 10s;
    o.init_method = "file:///tmp/corocoll_gpu_api_test_" + std::to_string(::getpid());
    int devices = cc::gpu::device_count();
    cc::gpu::nccl_options g;
    g.device = devices;  // one past the last: no such device wherever this runs
    auto t0 = std::chrono::steady_clock::now();
    std::exception_ptr e;
    try {
        r.run(cc::gpu::init_process_group(r, o, g));
    } catch (...) {
        e = std::current_exception();
    }
    std::remove(o.init_method.substr(7).c_str());
    REQUIRE(e);
    std::string what = message_of(e);
    CAPTURE(what);
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
    if (devices == 0) {
        CHECK(what.find("needs a CUDA device") != std::string::npos);
        CHECK(what.find(cc::gpu::no_device_reason()) != std::string::npos);
    } else {
        CHECK(what.find("rank 0 would use CUDA device " + std::to_string(devices)) !=
              std::string::npos);
    }
}

TEST_CASE("device memory without a device: the error names the call") {
    if (cc::gpu::device_count() > 0) return;  // covered by the device tests there
    try {
        cc::gpu::device_buffer<float> b(16);
        FAIL("cudaMalloc succeeded without a device");
    } catch (const cc::gpu::cuda_error& e) {
        CHECK(std::string(e.what()).find("cudaMalloc of 64 bytes") != std::string::npos);
        CHECK(e.code() != cudaSuccess);
    }
}

TEST_CASE("a local rank beyond the visible devices takes local_rank modulo their count") {
    using cc::gpu::detail::pick_device;
    // srun --gpus-per-task=1, or a CUDA_VISIBLE_DEVICES per rank: each rank sees one device.
    CHECK(pick_device(3, 3, -1, 1) == 0);
    CHECK(pick_device(5, 5, -1, 4) == 1);
    CHECK(pick_device(6, -1, -1, 4) == 2);  // no local rank: rank modulo the count
    CHECK(pick_device(0, 0, 2, 4) == 2);
    // An explicit device is the user's word: one the process does not see is an error.
    CHECK_THROWS_WITH_AS((void)pick_device(0, 0, 4, 4),
                         doctest::Contains("would use CUDA device 4 (nccl_options::device)"),
                         std::invalid_argument);
}

TEST_CASE("the host of a GPU is NCCL's: NCCL_HOSTID, else the host name and the boot id") {
    std::string boot;
    if (std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
        char buf[64] = {};
        if (std::fscanf(f, "%63s", buf) == 1) boot = buf;
        std::fclose(f);
    }
    const char* saved = std::getenv("NCCL_HOSTID");
    std::string keep = saved != nullptr ? saved : "";
    ::unsetenv("NCCL_HOSTID");
    std::string id = cc::gpu::detail::host_identity();
    CHECK(id == cc::gpu::detail::host_name() + boot);
    CHECK_FALSE(boot.empty());
    ::setenv("NCCL_HOSTID", "node-17", 1);
    CHECK(cc::gpu::detail::host_identity() == "node-17");
    if (saved != nullptr) {
        ::setenv("NCCL_HOSTID", keep.c_str(), 1);
    } else {
        ::unsetenv("NCCL_HOSTID");
    }
}
