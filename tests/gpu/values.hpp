#pragma once

// Element values of every type NCCL moves, for the GPU tests: small integers (exact in every
// type, fp8 included), converted through CUDA's own host conversions, and device buffers read
// back and compared. Test code only.

#include <corocoll/gpu.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace corocoll_test {

template <class T>
T value(double x) {
    if constexpr (std::is_same_v<T, __half>) {
        return __double2half(x);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        return __double2bfloat16(x);
    } else if constexpr (std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>) {
        return T(static_cast<float>(x));
    } else {
        return static_cast<T>(x);
    }
}

template <class T>
double number(T v) {
    if constexpr (std::is_same_v<T, __half>) {
        return __half2float(v);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        return __bfloat162float(v);
    } else if constexpr (std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>) {
        return static_cast<float>(v);
    } else {
        return static_cast<double>(v);
    }
}

/// (base + i) % `mod` for element i.
template <class T>
std::vector<T> ramp(std::size_t n, int base, int mod = 7) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = value<T>((base + static_cast<int>(i)) % mod);
    return v;
}

template <class T>
std::vector<T> read(const corocoll::gpu::device_buffer<T>& d) {
    std::vector<T> h(d.size());
    d.copy_to(h);
    return h;
}

/// Element-wise equal (within `tolerance`, relative, for avg's premultiplied rounding).
template <class T>
void same(const std::vector<T>& got, const std::vector<T>& want, const char* what,
          double tolerance = 0) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
        INFO(std::string(what), " element ", i);
        if (tolerance == 0) {
            REQUIRE(number(got[i]) == number(want[i]));
        } else {
            REQUIRE(std::abs(number(got[i]) - number(want[i])) <=
                    tolerance * std::abs(number(want[i])) + 1e-12);
        }
    }
}

/// Awaits `f.template operator()<T>()` for every element type NCCL has (the fp8 ones only
/// when `fp8`): integers, the 16-bit floats, float, double.
template <class F>
corocoll::task<> for_each_nccl_type(F f, bool fp8 = true) {
    co_await f.template operator()<std::int8_t>();
    co_await f.template operator()<std::uint8_t>();
    co_await f.template operator()<std::int32_t>();
    co_await f.template operator()<std::uint32_t>();
    co_await f.template operator()<std::int64_t>();
    co_await f.template operator()<std::uint64_t>();
    co_await f.template operator()<__half>();
    co_await f.template operator()<float>();
    co_await f.template operator()<double>();
    co_await f.template operator()<__nv_bfloat16>();
    if (fp8) {
        co_await f.template operator()<__nv_fp8_e4m3>();
        co_await f.template operator()<__nv_fp8_e5m2>();
    }
}

}  // namespace corocoll_test
