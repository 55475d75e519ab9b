#include <corocoll/collectives/dtype.hpp>
#include <corocoll/collectives/reduce_op.hpp>

#include "../support/bool_vector.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <ios>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace cc = corocoll;

// The types and their dtypes.
static_assert(cc::dtype_of<std::int8_t> == cc::dtype::int8);
static_assert(cc::dtype_of<std::uint8_t> == cc::dtype::uint8);
static_assert(cc::dtype_of<std::int32_t> == cc::dtype::int32);
static_assert(cc::dtype_of<std::int64_t> == cc::dtype::int64);
static_assert(cc::dtype_of<float> == cc::dtype::float32);
static_assert(cc::dtype_of<const double> == cc::dtype::float64);
static_assert(cc::dtype_of<cc::float16> == cc::dtype::float16);
static_assert(cc::dtype_of<cc::bfloat16> == cc::dtype::bfloat16);
// By kind and size, not exact type: `long long` and `long` are both int64 here.
static_assert(cc::dtype_of<long long> == cc::dtype::int64);
static_assert(cc::dtype_of<unsigned long long> == cc::dtype::uint64);
static_assert(cc::dtype_of<long> == cc::dtype::int64);
static_assert(cc::dtype_of<std::int16_t> == cc::dtype::int16);
static_assert(cc::dtype_of<std::uint16_t> == cc::dtype::uint16);
static_assert(cc::dtype_of<std::uint32_t> == cc::dtype::uint32);
static_assert(cc::dtype_of<unsigned char> == cc::dtype::uint8);
static_assert(cc::dtype_of<signed char> == cc::dtype::int8);
static_assert(cc::dtype_of<bool> == cc::dtype::bool_);
static_assert(cc::dtype_of<std::complex<float>> == cc::dtype::complex64);
static_assert(cc::dtype_of<const std::complex<double>> == cc::dtype::complex128);
static_assert(!cc::element<long double>);
static_assert(!cc::element<std::complex<long double>>);
static_assert(!cc::element<std::string>);
static_assert(!cc::element<int*>);
static_assert(std::is_trivially_copyable_v<cc::float16> && sizeof(cc::float16) == 2);
static_assert(std::is_trivially_copyable_v<cc::bfloat16> && sizeof(cc::bfloat16) == 2);

// The conversions are usable in constant expressions.
static_assert(cc::float16(1.0f).bits == 0x3c00);
static_assert(cc::float16(-2.0f).bits == 0xc000);
static_assert(cc::float16(65504.0f).bits == 0x7bff);
static_assert(cc::float16(65520.0f).bits == 0x7c00);
static_assert(cc::float16(0x1p-24f).bits == 0x0001);
static_assert(static_cast<float>(cc::float16::from_bits(0x3555)) == 0x1.554p-2f);
static_assert(cc::bfloat16(1.0f).bits == 0x3f80);
static_assert(static_cast<float>(cc::bfloat16::from_bits(0xc2f7)) == -123.5f);

namespace {

constexpr cc::dtype all_dtypes[] = {
    cc::dtype::int8,    cc::dtype::uint8,     cc::dtype::int32,      cc::dtype::int64,
    cc::dtype::float32, cc::dtype::float64,   cc::dtype::float16,    cc::dtype::bfloat16,
    cc::dtype::int16,   cc::dtype::uint16,    cc::dtype::uint32,     cc::dtype::uint64,
    cc::dtype::bool_,   cc::dtype::complex64, cc::dtype::complex128,
};
constexpr cc::reduce_op all_ops[] = {
    cc::reduce_op::sum,  cc::reduce_op::product, cc::reduce_op::min,  cc::reduce_op::max,
    cc::reduce_op::band, cc::reduce_op::bor,     cc::reduce_op::bxor, cc::reduce_op::avg,
};
// 0, 1, odd lengths, and both sides of the kernels' blocks (64 elements, 256 for 16-bit floats).
constexpr std::size_t lengths[] = {0, 1, 7, 63, 64, 65, 255, 256, 257, 1000};

float float_of_bits(std::uint32_t x) { return std::bit_cast<float>(x); }
std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

bool half_is_nan(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

// The value of a binary16 by its definition, in double: no bit tricks shared with the library.
double half_value(std::uint16_t h) {
    const int e = (h >> 10) & 0x1f;
    const int m = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0x1f) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
    if (e == 0) return sign * std::ldexp(m, -24);
    return sign * std::ldexp(1024 + m, e - 25);
}

// The value of a bfloat16 by its definition.
double bf16_value(std::uint16_t b) {
    const int e = (b >> 7) & 0xff;
    const int m = b & 0x7f;
    const double sign = (b & 0x8000) ? -1.0 : 1.0;
    if (e == 0xff) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
    if (e == 0) return sign * std::ldexp(m, -133);
    return sign * std::ldexp(128 + m, e - 134);
}

// Round-to-nearest-even to a 16-bit format by search: the finite non-negative values, in
// increasing order of bits, are `count` consecutive codes from 0; `value` gives each code's
// number. Beyond the largest finite value, a value at or above its midpoint with the next
// power of two (where the next code would be) overflows to infinity.
template <class Value>
std::uint16_t nearest_code(double x, std::uint16_t inf_code, Value value) {
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(x);
    const std::uint16_t max_code = static_cast<std::uint16_t>(inf_code - 1);
    const double max = value(max_code);
    const double overflow = max + (max - value(static_cast<std::uint16_t>(max_code - 1))) / 2;
    if (a >= overflow) return sign | inf_code;
    // Smallest code whose value is >= a.
    std::uint32_t lo = 0;
    std::uint32_t hi = max_code;
    if (a > max) return sign | max_code;
    while (lo < hi) {
        const std::uint32_t mid = (lo + hi) / 2;
        if (value(static_cast<std::uint16_t>(mid)) < a) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    const auto above = static_cast<std::uint16_t>(lo);
    if (value(above) == a || above == 0) return sign | above;
    const auto below = static_cast<std::uint16_t>(above - 1);
    const double down = a - value(below);
    const double up = value(above) - a;
    if (down < up) return sign | below;
    if (up < down) return sign | above;
    return sign | ((below & 1) ? above : below);
}

std::uint16_t reference_half(double x) { return nearest_code(x, 0x7c00, half_value); }
std::uint16_t reference_bf16(double x) { return nearest_code(x, 0x7f80, bf16_value); }

// The floats that matter most for a rounding to 16 bits: every value of the format, each
// midpoint between neighbours (the ties), one float ulp either side of each midpoint, the
// edges of the ranges, and random bit patterns.
std::vector<float> conversion_inputs(bool half, std::size_t randoms) {
    std::vector<float> v;
    for (std::uint32_t code = 0; code < 0x7c00u + (half ? 0 : 0x380u); ++code) {
        const auto c = static_cast<std::uint16_t>(code);
        const double here = half ? half_value(c) : bf16_value(c);
        const double next = half ? half_value(static_cast<std::uint16_t>(c + 1))
                                 : bf16_value(static_cast<std::uint16_t>(c + 1));
        if (std::isnan(here)) continue;
        const float mid = static_cast<float>((here + next) / 2);  // exact: few bits
        for (const float f : {static_cast<float>(here), mid, std::nextafter(mid, 0.0f),
                              std::nextafter(mid, INFINITY)}) {
            v.push_back(f);
            v.push_back(-f);
        }
    }
    for (const float f : {0.0f,
                          -0.0f,
                          INFINITY,
                          -INFINITY,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::lowest(),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min(),
                          65504.0f,
                          65519.996f,
                          65520.0f,
                          65536.0f,
                          0x1p-25f,
                          std::nextafter(0x1p-25f, 1.0f),
                          std::nextafter(0x1p-25f, 0.0f),
                          0x1.8p-24f,
                          0x1p-14f,
                          std::nextafter(0x1p-14f, 0.0f),
                          0x1.ff8p-15f,
                          0x1.ffcp-15f,
                          1e-30f}) {
        v.push_back(f);
        v.push_back(-f);
    }
    std::mt19937 rng(1234);
    for (std::size_t i = 0; i < randoms; ++i) v.push_back(float_of_bits(rng()));
    // Random floats within the float16 range, where rounding is neither trivial nor overflow.
    for (std::size_t i = 0; i < randoms; ++i) {
        v.push_back(float_of_bits((rng() & 0x807fffffu) | ((98u + rng() % 46) << 23)));
    }
    return v;
}

}  // namespace

TEST_CASE("every float16 converts to float and back to the same bits, a NaN to a quiet NaN") {
    for (std::uint32_t code = 0; code <= 0xffffu; ++code) {
        const auto h = static_cast<std::uint16_t>(code);
        const float f = static_cast<float>(cc::float16::from_bits(h));
        const std::uint16_t back = cc::float16(f).bits;
        if (half_is_nan(h)) {
            CHECK(std::isnan(f));
            CHECK(back == (h | 0x200u));  // quiet bit set, payload and sign kept
        } else {
            CHECK(back == h);
            // The float is the half's value exactly (compared with its definition).
            CHECK(static_cast<double>(f) == half_value(h));
            CHECK(std::signbit(f) == ((h & 0x8000) != 0));
        }
    }
}

TEST_CASE("float to float16 rounds to nearest even like an independent reference") {
    const std::vector<float> inputs = conversion_inputs(true, 200000);
    std::size_t wrong = 0;
    for (const float f : inputs) {
        const std::uint16_t got = cc::float16(f).bits;
        std::uint16_t want;
        if (std::isnan(f)) {
            want = static_cast<std::uint16_t>(((bits_of(f) >> 16) & 0x8000u) | 0x7e00u |
                                              ((bits_of(f) >> 13) & 0x3ffu));
        } else {
            want = reference_half(f);
        }
        if (got != want && ++wrong <= 10) {
            FAIL_CHECK("float16(" << f << " = 0x" << std::hex << bits_of(f) << ") is 0x" << got
                                  << ", expected 0x" << want);
        }
#ifdef __FLT16_MANT_DIG__
        // The compiler's own _Float16 (g++ 12 on x86-64: libgcc's correctly rounded conversion).
        if (!std::isnan(f)) {
            const auto native = std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
            if (got != native && ++wrong <= 10) {
                FAIL_CHECK("float16(0x" << std::hex << bits_of(f) << ") is 0x" << got
                                        << ", _Float16 gives 0x" << native);
            }
        }
#endif
    }
    CHECK(wrong == 0);
    CHECK(inputs.size() > 500000);
}

TEST_CASE("float16 overflows to infinity and underflows to subnormals and zero as IEEE says") {
    CHECK(cc::float16(65504.0f).bits == 0x7bff);
    CHECK(cc::float16(65519.996f).bits == 0x7bff);  // just below the midpoint with 65536
    CHECK(cc::float16(65520.0f).bits == 0x7c00);    // the midpoint: ties to even = infinity
    CHECK(cc::float16(-1e10f).bits == 0xfc00);
    CHECK(cc::float16(INFINITY).bits == 0x7c00);
    CHECK(cc::float16(0x1p-24f).bits == 0x0001);         // smallest subnormal
    CHECK(cc::float16(0x1p-25f).bits == 0x0000);         // half of it: ties to even, zero
    CHECK(cc::float16(0x1.000002p-25f).bits == 0x0001);  // just above the tie
    CHECK(cc::float16(0x1.8p-24f).bits == 0x0002);       // 1.5 steps: ties to even, 2
    CHECK(cc::float16(-0x1p-30f).bits == 0x8000);        // negative zero keeps its sign
    CHECK(cc::float16(0x1.ff8p-15f).bits == 0x03ff);     // largest subnormal
    CHECK(cc::float16(0x1.ffcp-15f).bits == 0x0400);     // tie with 2^-14: to even, a normal
    CHECK(cc::float16(std::nextafter(0x1.ffcp-15f, 0.0f)).bits == 0x03ff);
    CHECK(half_is_nan(cc::float16(std::numeric_limits<float>::quiet_NaN()).bits));
    CHECK(half_is_nan(cc::float16(std::numeric_limits<float>::signaling_NaN()).bits));
    CHECK((cc::float16(std::numeric_limits<float>::signaling_NaN()).bits & 0x200u) != 0);
}

TEST_CASE("every bfloat16 converts to float and back to the same bits, a NaN to a quiet NaN") {
    for (std::uint32_t code = 0; code <= 0xffffu; ++code) {
        const auto b = static_cast<std::uint16_t>(code);
        const float f = static_cast<float>(cc::bfloat16::from_bits(b));
        const std::uint16_t back = cc::bfloat16(f).bits;
        if (bf16_is_nan(b)) {
            CHECK(std::isnan(f));
            CHECK(back == (b | 0x40u));
        } else {
            CHECK(back == b);
            CHECK(static_cast<double>(f) == bf16_value(b));
            CHECK(std::signbit(f) == ((b & 0x8000) != 0));
        }
    }
}

TEST_CASE("float to bfloat16 rounds to nearest even like an independent reference") {
    const std::vector<float> inputs = conversion_inputs(false, 200000);
    std::size_t wrong = 0;
    for (const float f : inputs) {
        const std::uint16_t got = cc::bfloat16(f).bits;
        const std::uint16_t want = std::isnan(f)
                                       ? static_cast<std::uint16_t>((bits_of(f) >> 16) | 0x40u)
                                       : reference_bf16(f);
        if (got != want && ++wrong <= 10) {
            FAIL_CHECK("bfloat16(" << f << " = 0x" << std::hex << bits_of(f) << ") is 0x" << got
                                   << ", expected 0x" << want);
        }
    }
    CHECK(wrong == 0);
    // Ties: 1 + 2^-8 lies between 1 (even) and 1 + 2^-7; 1 + 3 * 2^-8 between two, the upper even.
    CHECK(cc::bfloat16(1.00390625f).bits == 0x3f80);
    CHECK(cc::bfloat16(1.01171875f).bits == 0x3f82);
    // The largest finite float is above the midpoint past the largest finite bfloat16.
    CHECK(cc::bfloat16(std::numeric_limits<float>::max()).bits == 0x7f80);
    CHECK(cc::bfloat16(float_of_bits(0x7f7f7fffu)).bits == 0x7f7f);
    CHECK(cc::bfloat16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
    CHECK(cc::bfloat16(float_of_bits(0x00018000u)).bits == 0x0002);  // subnormal tie, to even
}

TEST_CASE("float16 and bfloat16 compare as numbers, not as bits") {
    const auto nan16 = cc::float16(NAN);
    CHECK_FALSE(nan16 == nan16);
    CHECK(nan16 != nan16);
    CHECK(cc::float16(0.0f) == cc::float16(-0.0f));
    CHECK(cc::float16(1.0f) < cc::float16(2.0f));
    CHECK(cc::float16{}.bits == 0);
    const auto nanb = cc::bfloat16(NAN);
    CHECK_FALSE(nanb == nanb);
    CHECK(cc::bfloat16(0.0f) == cc::bfloat16(-0.0f));
    CHECK(cc::bfloat16(-1.0f) < cc::bfloat16(0.5f));
    CHECK(cc::bfloat16{}.bits == 0);
}

TEST_CASE("dtype sizes, names and kinds match torch's") {
    const char* names[] = {"int8",    "uint8",   "int32",    "int64",     "float32",
                           "float64", "float16", "bfloat16", "int16",     "uint16",
                           "uint32",  "uint64",  "bool",     "complex64", "complex128"};
    const std::size_t sizes[] = {1, 1, 4, 8, 4, 8, 2, 2, 2, 2, 4, 8, 1, 8, 16};
    for (std::size_t i = 0; i < std::size(all_dtypes); ++i) {
        CHECK(std::string(cc::dtype_name(all_dtypes[i])) == names[i]);
        CHECK(cc::dtype_size(all_dtypes[i]) == sizes[i]);
        CHECK(cc::is_integral(all_dtypes[i]) == (i < 4 || (i >= 8 && i < 12)));
        CHECK(cc::is_complex(all_dtypes[i]) == (i >= 13));
    }
    // Wire values: the first eight as before, the new ones after them.
    CHECK(static_cast<int>(cc::dtype::int8) == 1);
    CHECK(static_cast<int>(cc::dtype::bfloat16) == 8);
    CHECK(static_cast<int>(cc::dtype::complex128) == 15);
    CHECK(cc::dtype_size(static_cast<cc::dtype>(0)) == 0);
    CHECK(cc::dtype_size(static_cast<cc::dtype>(16)) == 0);
    CHECK(std::string(cc::dtype_name(static_cast<cc::dtype>(0))) == "unknown dtype");
}

TEST_CASE(
    "ops are supported as torch's (bitwise on integers and bool, no order on complex, "
    "no avg on bool), and a refusal names op and dtype") {
    const char* names[] = {"sum", "product", "min", "max", "band", "bor", "bxor", "avg"};
    for (std::size_t i = 0; i < std::size(all_ops); ++i) {
        const cc::reduce_op op = all_ops[i];
        CHECK(std::string(cc::op_name(op)) == names[i]);
        const bool bitwise =
            op == cc::reduce_op::band || op == cc::reduce_op::bor || op == cc::reduce_op::bxor;
        for (const cc::dtype t : all_dtypes) {
            CAPTURE(cc::op_name(op));
            CAPTURE(cc::dtype_name(t));
            const bool ordered = op == cc::reduce_op::min || op == cc::reduce_op::max;
            const bool expected = bitwise   ? cc::is_integral(t) || t == cc::dtype::bool_
                                  : ordered ? !cc::is_complex(t)
                                  : op == cc::reduce_op::avg ? t != cc::dtype::bool_
                                                             : true;
            CHECK(cc::op_supported(op, t) == expected);
            const std::string reason = cc::unsupported_reason(op, t);
            if (cc::op_supported(op, t)) {
                CHECK(reason.empty());
                continue;
            }
            CHECK(reason.find(std::string("reduce_op ") + cc::op_name(op)) != std::string::npos);
            CHECK(reason.find(cc::dtype_name(t)) != std::string::npos);
            // reduce_into refuses the pair with that message and leaves the buffer alone.
            std::byte inout[16] = {};
            const std::byte in[16] = {std::byte{0xff}};
            const std::string message = "corocoll: " + reason;
            CHECK_THROWS_WITH_AS(cc::reduce_into(op, t, inout, in, 2), message.c_str(),
                                 std::invalid_argument);
            CHECK(inout[0] == std::byte{0});
        }
    }
    CHECK(cc::unsupported_reason(cc::reduce_op::band, cc::dtype::float32) ==
          "reduce_op band is not defined for float32 (bitwise ops need an integer type)");
    // Values read off the wire that are not ops or dtypes.
    CHECK_FALSE(cc::op_supported(static_cast<cc::reduce_op>(0), cc::dtype::int32));
    CHECK_FALSE(cc::op_supported(static_cast<cc::reduce_op>(9), cc::dtype::int32));
    CHECK_FALSE(cc::op_supported(cc::reduce_op::sum, static_cast<cc::dtype>(0)));
    CHECK(cc::unsupported_reason(static_cast<cc::reduce_op>(9), cc::dtype::int32) ==
          "reduce_op 9 is not a known reduce_op");
    CHECK(cc::unsupported_reason(cc::reduce_op::sum, static_cast<cc::dtype>(42)) ==
          "dtype 42 is not a known dtype");
    CHECK(std::string(cc::op_name(static_cast<cc::reduce_op>(0))) == "unknown reduce_op");
}

namespace {

// What one element of the result must be, computed the obvious way: integers in 64-bit
// unsigned arithmetic truncated back (wrap-around), floats directly, 16-bit floats in float.
template <class T>
T reference_apply(cc::reduce_op op, T a, T b) {
    if constexpr (std::is_same_v<T, bool>) {
        switch (op) {
            case cc::reduce_op::sum:
            case cc::reduce_op::max:
            case cc::reduce_op::bor:
                return a || b;
            case cc::reduce_op::product:
            case cc::reduce_op::min:
            case cc::reduce_op::band:
                return a && b;
            case cc::reduce_op::bxor:
                return a != b;
            default:
                break;
        }
    } else if constexpr (cc::detail::is_complex_v<T>) {
        if (op == cc::reduce_op::product) return a * b;
        return a + b;
    } else if constexpr (std::is_integral_v<T>) {
        // Through int64_t: negative values sign-extend, so the low bits of the 64-bit result
        // are the wrapped-around result of T.
        const auto ua = static_cast<std::uint64_t>(static_cast<std::int64_t>(a));
        const auto ub = static_cast<std::uint64_t>(static_cast<std::int64_t>(b));
        switch (op) {
            case cc::reduce_op::sum:
            case cc::reduce_op::avg:
                return static_cast<T>(ua + ub);
            case cc::reduce_op::product:
                return static_cast<T>(ua * ub);
            case cc::reduce_op::min:
                return std::min(a, b);
            case cc::reduce_op::max:
                return std::max(a, b);
            case cc::reduce_op::band:
                return static_cast<T>(ua & ub);
            case cc::reduce_op::bor:
                return static_cast<T>(ua | ub);
            case cc::reduce_op::bxor:
                return static_cast<T>(ua ^ ub);
        }
    } else if constexpr (std::is_floating_point_v<T>) {
        switch (op) {
            case cc::reduce_op::sum:
            case cc::reduce_op::avg:
                return a + b;
            case cc::reduce_op::product:
                return a * b;
            case cc::reduce_op::min:
            case cc::reduce_op::max:
                // NaN propagates; of two equal values (-0 and +0) the incoming `b` is kept.
                if (std::isnan(a)) return a;
                if (std::isnan(b)) return b;
                if (a == b) return b;
                return op == cc::reduce_op::min ? std::min(a, b) : std::max(a, b);
            default:
                break;
        }
    } else {
        return T(reference_apply<float>(op, static_cast<float>(a), static_cast<float>(b)));
    }
    FAIL("no reference for this op");
    return T{};
}

// Equal representations, or both NaN.
template <class T>
bool same(T a, T b) {
    if constexpr (cc::detail::is_complex_v<T>) {
        return same(a.real(), b.real()) && same(a.imag(), b.imag());
    } else if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(a) && std::isnan(b)) return true;
        if constexpr (sizeof(T) == 4) {
            return bits_of(a) == bits_of(b);
        } else {
            return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
        }
    } else if constexpr (std::is_integral_v<T>) {
        return a == b;
    } else {
        if (std::isnan(static_cast<float>(a)) && std::isnan(static_cast<float>(b))) return true;
        return a.bits == b.bits;
    }
}

template <class T>
T random_element(std::mt19937_64& rng) {
    if constexpr (std::is_same_v<T, bool>) {
        return (rng() & 1) != 0;
    } else if constexpr (cc::detail::is_complex_v<T>) {
        // Finite parts: NaN and infinity handling of std::complex's product is the library's.
        std::uniform_real_distribution<double> d(-1000, 1000);
        using V = typename T::value_type;
        return T(static_cast<V>(d(rng)), static_cast<V>(d(rng)));
    } else if constexpr (std::is_integral_v<T>) {
        return static_cast<T>(rng());  // the whole range: sums and products overflow
    } else if constexpr (std::is_floating_point_v<T>) {
        const std::uint64_t r = rng();
        switch (r % 8) {
            case 0:  // any bit pattern: NaNs, infinities, subnormals, huge values
                if constexpr (sizeof(T) == 4) {
                    return float_of_bits(static_cast<std::uint32_t>(r >> 3));
                } else {
                    return std::bit_cast<double>(r >> 3 | (r << 61));
                }
            case 1: {
                constexpr T specials[] = {0, -0.0, 1, -1, INFINITY, -INFINITY, NAN};
                return specials[(r >> 3) % std::size(specials)];
            }
            default:
                return static_cast<T>(std::uniform_real_distribution<double>(-1000, 1000)(rng));
        }
    } else {
        return T::from_bits(static_cast<std::uint16_t>(rng()));
    }
}

template <class T>
void check_reduce(cc::reduce_op op, std::mt19937_64& rng) {
    constexpr std::size_t guard = 3;
    for (const std::size_t n : lengths) {
        CAPTURE(n);
        corocoll_test::vector_of<T> inout(n + guard);
        corocoll_test::vector_of<T> in(n + guard);
        for (auto& x : inout) x = random_element<T>(rng);
        for (auto& x : in) x = random_element<T>(rng);
        const corocoll_test::vector_of<T> before = inout;
        cc::reduce_into(op, cc::dtype_of<T>, reinterpret_cast<std::byte*>(inout.data()),
                        reinterpret_cast<const std::byte*>(in.data()), n);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < n; ++i) {
            if (!same(inout[i], reference_apply(op, before[i], in[i])) && ++wrong <= 3) {
                FAIL_CHECK("element " << i << " is wrong");
            }
        }
        CHECK(wrong == 0);
        for (std::size_t i = n; i < n + guard; ++i) CHECK(same(inout[i], before[i]));  // untouched
    }
}

template <class F>
void with_type(cc::dtype t, F&& f) {
    switch (t) {
        case cc::dtype::int8:
            return f(std::int8_t{});
        case cc::dtype::uint8:
            return f(std::uint8_t{});
        case cc::dtype::int32:
            return f(std::int32_t{});
        case cc::dtype::int64:
            return f(std::int64_t{});
        case cc::dtype::float32:
            return f(float{});
        case cc::dtype::float64:
            return f(double{});
        case cc::dtype::float16:
            return f(cc::float16{});
        case cc::dtype::bfloat16:
            return f(cc::bfloat16{});
        case cc::dtype::int16:
            return f(std::int16_t{});
        case cc::dtype::uint16:
            return f(std::uint16_t{});
        case cc::dtype::uint32:
            return f(std::uint32_t{});
        case cc::dtype::uint64:
            return f(std::uint64_t{});
        case cc::dtype::bool_:
            return f(bool{});
        case cc::dtype::complex64:
            return f(std::complex<float>{});
        case cc::dtype::complex128:
            return f(std::complex<double>{});
    }
}

template <class V>
void reduce(cc::reduce_op op, V& inout, const std::type_identity_t<V>& in) {
    using T = std::remove_cv_t<std::remove_reference_t<decltype(*inout.data())>>;
    REQUIRE(inout.size() == in.size());
    cc::reduce_into(op, cc::dtype_of<T>, reinterpret_cast<std::byte*>(inout.data()),
                    reinterpret_cast<const std::byte*>(in.data()), inout.size());
}

template <class T>
void average(std::vector<T>& data, int world_size) {
    cc::finish_avg(cc::dtype_of<T>, reinterpret_cast<std::byte*>(data.data()), data.size(),
                   world_size);
}

}  // namespace

TEST_CASE("reduce_into matches a scalar reference for every dtype, supported op and length") {
    std::mt19937_64 rng(42);
    for (const cc::dtype t : all_dtypes) {
        for (const cc::reduce_op op : all_ops) {
            if (!cc::op_supported(op, t)) continue;
            CAPTURE(cc::dtype_name(t));
            CAPTURE(cc::op_name(op));
            with_type(t, [&](auto tag) { check_reduce<decltype(tag)>(op, rng); });
        }
    }
}

TEST_CASE("integer sums and products wrap around instead of overflowing") {
    std::vector<std::int8_t> i8 = {127, -128, 100, 16};
    reduce(cc::reduce_op::sum, i8, {1, -1, 100, 16});
    CHECK(i8 == std::vector<std::int8_t>{-128, 127, -56, 32});
    reduce(cc::reduce_op::product, i8, {2, 3, 3, 8});
    CHECK(i8 == std::vector<std::int8_t>{0, 125, 88, 0});

    std::vector<std::uint8_t> u8 = {255, 16};
    reduce(cc::reduce_op::sum, u8, {1, 0});
    reduce(cc::reduce_op::product, u8, {7, 16});
    CHECK(u8 == std::vector<std::uint8_t>{0, 0});

    constexpr auto i32max = std::numeric_limits<std::int32_t>::max();
    constexpr auto i32min = std::numeric_limits<std::int32_t>::min();
    std::vector<std::int32_t> i32 = {i32max, i32min, 65536};
    reduce(cc::reduce_op::sum, i32, {1, -1, 0});
    CHECK(i32 == std::vector<std::int32_t>{i32min, i32max, 65536});
    reduce(cc::reduce_op::product, i32, {1, 1, 65536});
    CHECK(i32[2] == 0);

    constexpr auto i64max = std::numeric_limits<std::int64_t>::max();
    constexpr auto i64min = std::numeric_limits<std::int64_t>::min();
    std::vector<std::int64_t> i64 = {i64max, i64min, i64min};
    reduce(cc::reduce_op::sum, i64, {1, -1, 0});
    CHECK(i64 == std::vector<std::int64_t>{i64min, i64max, i64min});
    reduce(cc::reduce_op::product, i64, {-1, 2, -1});
    CHECK(i64 == std::vector<std::int64_t>{i64min, -2, i64min});
}

TEST_CASE("min and max propagate NaN from either side, for every floating dtype") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (const cc::dtype t :
         {cc::dtype::float32, cc::dtype::float64, cc::dtype::float16, cc::dtype::bfloat16}) {
        CAPTURE(cc::dtype_name(t));
        with_type(t, [&](auto tag) {
            using T = decltype(tag);
            if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, cc::float16> ||
                          std::is_same_v<T, cc::bfloat16>) {
                // Long enough for the vectorized blocks and the scalar tail to meet NaNs.
                const std::size_t n = 300;
                for (const cc::reduce_op op : {cc::reduce_op::min, cc::reduce_op::max}) {
                    CAPTURE(cc::op_name(op));
                    std::vector<T> inout(n, T(1.0f));
                    std::vector<T> in(n, T(2.0f));
                    for (std::size_t i = 0; i < n; i += 3) inout[i] = T(nan);
                    for (std::size_t i = 1; i < n; i += 3) in[i] = T(nan);
                    reduce(op, inout, in);
                    for (std::size_t i = 0; i < n; ++i) {
                        const float want =
                            i % 3 == 2 ? (op == cc::reduce_op::min ? 1.0f : 2.0f) : nan;
                        CHECK(same(static_cast<float>(inout[i]), want));
                    }
                }
            }
        });
    }
}

TEST_CASE("float16 sums and products are correctly rounded, as if done in binary16") {
    // Sums and products of two halves are exact in double; the result must be that value
    // rounded once, which widening to float and rounding back achieves.
    std::mt19937_64 rng(7);
    std::vector<cc::float16> a(5000), b(5000);
    for (std::size_t i = 0; i < a.size(); ++i) {
        do {
            a[i] = cc::float16::from_bits(static_cast<std::uint16_t>(rng()));
            b[i] = cc::float16::from_bits(static_cast<std::uint16_t>(rng()));
        } while (half_is_nan(a[i].bits) || half_is_nan(b[i].bits) ||
                 (a[i].bits & 0x7fff) == 0x7c00 || (b[i].bits & 0x7fff) == 0x7c00);
    }
    for (const cc::reduce_op op : {cc::reduce_op::sum, cc::reduce_op::product}) {
        CAPTURE(cc::op_name(op));
        std::vector<cc::float16> r = a;
        reduce(op, r, b);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < a.size(); ++i) {
            const double x = half_value(a[i].bits);
            const double y = half_value(b[i].bits);
            const double exact = op == cc::reduce_op::sum ? x + y : x * y;
            const std::uint16_t want = reference_half(exact);
            if (r[i].bits != want) ++wrong;
        }
        CHECK(wrong == 0);
    }
}

TEST_CASE("finish_avg divides floats exactly rounded and integers truncating toward zero") {
    std::vector<std::int32_t> i32 = {7, -7, 6, -6, std::numeric_limits<std::int32_t>::min()};
    average(i32, 2);
    CHECK(i32 == std::vector<std::int32_t>{3, -3, 3, -3, -1073741824});

    // A world size an int8 could not hold is still the divisor.
    std::vector<std::int8_t> i8 = {127, -128, 100};
    average(i8, 3);
    CHECK(i8 == std::vector<std::int8_t>{42, -42, 33});
    i8 = {127, -128, 100};
    average(i8, 200);
    CHECK(i8 == std::vector<std::int8_t>{0, 0, 0});
    std::vector<std::uint8_t> u8 = {255, 254};
    average(u8, 300);
    CHECK(u8 == std::vector<std::uint8_t>{0, 0});
    u8 = {255, 254};
    average(u8, 5);
    CHECK(u8 == std::vector<std::uint8_t>{51, 50});

    std::vector<std::int64_t> i64 = {-9, std::numeric_limits<std::int64_t>::max()};
    average(i64, 4);
    CHECK(i64 == std::vector<std::int64_t>{-2, std::numeric_limits<std::int64_t>::max() / 4});

    // Floats, over the vectorized blocks and the tail: x / n, not x * (1 / n).
    for (const std::size_t n : lengths) {
        std::vector<float> f(n);
        std::vector<double> d(n);
        for (std::size_t i = 0; i < n; ++i) {
            f[i] = 0.1f * static_cast<float>(i) - 7.0f;
            d[i] = 0.1 * static_cast<double>(i) - 7.0;
        }
        std::vector<float> fw = f;
        std::vector<double> dw = d;
        average(f, 3);
        average(d, 3);
        for (std::size_t i = 0; i < n; ++i) {
            CHECK(same(f[i], fw[i] / 3.0f));
            CHECK(same(d[i], dw[i] / 3.0));
        }
    }
    std::vector<cc::float16> h = {cc::float16(1.0f), cc::float16(-65504.0f), cc::float16(NAN)};
    average(h, 3);
    CHECK(h[0].bits == cc::float16(1.0f / 3.0f).bits);
    CHECK(h[1].bits == cc::float16(-65504.0f / 3.0f).bits);
    CHECK(half_is_nan(h[2].bits));
    std::vector<cc::bfloat16> bf = {cc::bfloat16(10.0f), cc::bfloat16(-1e30f)};
    average(bf, 7);
    CHECK(bf[0].bits == cc::bfloat16(10.0f / 7.0f).bits);
    CHECK(bf[1].bits == cc::bfloat16(static_cast<float>(cc::bfloat16(-1e30f)) / 7.0f).bits);
}

TEST_CASE("avg then finish_avg gives the mean over worlds of 1, 2, 3 and 5 ranks") {
    for (const int world : {1, 2, 3, 5}) {
        CAPTURE(world);
        std::vector<double> acc(1000);
        std::vector<std::int32_t> iacc(1000);
        std::vector<double> expected(acc.size(), 0.0);
        std::vector<std::int64_t> iexpected(acc.size(), 0);
        for (int r = 0; r < world; ++r) {
            std::vector<double> mine(acc.size());
            std::vector<std::int32_t> imine(acc.size());
            for (std::size_t i = 0; i < mine.size(); ++i) {
                mine[i] = static_cast<double>(r) + static_cast<double>(i) * 0.5;
                imine[i] = r * 10 - static_cast<std::int32_t>(i);
                expected[i] += mine[i];
                iexpected[i] += imine[i];
            }
            if (r == 0) {
                acc = mine;
                iacc = imine;
            } else {
                reduce(cc::reduce_op::avg, acc, mine);
                reduce(cc::reduce_op::avg, iacc, imine);
            }
        }
        average(acc, world);
        average(iacc, world);
        for (std::size_t i = 0; i < acc.size(); ++i) {
            CHECK(acc[i] == expected[i] / world);
            CHECK(iacc[i] == iexpected[i] / world);  // C++ division truncates, as documented
        }
    }
}

TEST_CASE("bool reduces logically as torch's, and complex sums, products and averages exactly") {
    corocoll_test::bool_vector a(4), b(4);
    const bool av[] = {false, false, true, true}, bv[] = {false, true, false, true};
    auto run = [&](cc::reduce_op op) {
        corocoll_test::bool_vector x(4), y(4);
        for (int i = 0; i < 4; ++i) x[i] = av[i], y[i] = bv[i];
        reduce(op, x, y);
        return std::vector<bool>(x.begin(), x.end());
    };
    const std::vector<bool> any{false, true, true, true}, all{false, false, false, true},
        odd{false, true, true, false};
    CHECK(run(cc::reduce_op::sum) == any);
    CHECK(run(cc::reduce_op::max) == any);
    CHECK(run(cc::reduce_op::bor) == any);
    CHECK(run(cc::reduce_op::product) == all);
    CHECK(run(cc::reduce_op::min) == all);
    CHECK(run(cc::reduce_op::band) == all);
    CHECK(run(cc::reduce_op::bxor) == odd);
    CHECK(cc::unsupported_reason(cc::reduce_op::avg, cc::dtype::bool_) ==
          "reduce_op avg is not defined for bool (avg needs numbers)");
    CHECK(cc::unsupported_reason(cc::reduce_op::max, cc::dtype::complex64) ==
          "reduce_op max is not defined for complex64 (complex numbers have no order)");

    // (1 + 2i)(3 - i) = 5 + 5i: a complex product, not one of the parts.
    std::vector<std::complex<double>> z{{1, 2}, {0, 1}}, w{{3, -1}, {0, 1}};
    reduce(cc::reduce_op::product, z, w);
    CHECK(z == std::vector<std::complex<double>>{{5, 5}, {-1, 0}});
    std::vector<std::complex<float>> s{{1, 2}, {-3, 4}}, t{{3, 6}, {1, 4}};
    reduce(cc::reduce_op::avg, s, t);
    cc::finish_avg(cc::dtype::complex64, reinterpret_cast<std::byte*>(s.data()), s.size(), 2);
    CHECK(s == std::vector<std::complex<float>>{{2, 4}, {-1, 4}});
}
