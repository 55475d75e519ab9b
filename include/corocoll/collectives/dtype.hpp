#pragma once

// Element types as they travel in frame headers (torch's dtypes), their sizes, and the
// conversions of the 16-bit floats (float16, bfloat16) to and from float.

#include <corocoll/version.hpp>

#include <bit>
#include <compare>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <type_traits>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

// The conversions are written without branches (selects, min, masks) so that g++ 12 and
// clang 14 vectorize loops over them at -O2 even with -ftrapping-math, which is on by default:
// g++ will not if-convert a floating-point operation that it has sunk into one arm of a branch,
// so every intermediate value below is used on every path.

/// The IEEE binary16 bits nearest to `f` (round to nearest, ties to even). Overflow gives an
/// infinity, a NaN gives a quiet NaN with the top bits of `f`'s payload, a result below the
/// smallest normal half is a correctly rounded subnormal. Branch-free; about 12 integer
/// instructions and one float addition.
///
/// The subnormal results come from the float addition `|f| + 0.5f`, whose ulp is the half's
/// subnormal step; it rounds in the thread's rounding mode, which is round to nearest even
/// unless the program changed it with `fesetround` (an assumption g++ and clang make anyway
/// without -frounding-math). Normal results are rounded with integer arithmetic.
constexpr std::uint16_t float_to_half_bits(float f) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t a = x & 0x7fffffffu;
    constexpr std::uint32_t min_normal = 113u << 23;  // 2^-14, the smallest normal half
    // Normal path: rebias the exponent (127 -> 15) and round away the low 13 mantissa bits.
    // A carry out of the mantissa bumps the exponent, which is what rounding up must do. Inputs
    // below 2^-14 are clamped to 2^-14 here (giving 0x400) and taken from `sub` by the min.
    const std::uint32_t an = a > min_normal ? a : min_normal;
    std::uint32_t r = an - (112u << 23);
    r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
    // Subnormal path: in |f| + 0.5 the mantissa's last bit is worth 2^-24, the half's subnormal
    // step, so the float adder does the rounding and the low mantissa bits are the result. For
    // |f| >= 2^-14 this is >= the normal path's value, so min() picks the right one either way.
    const std::uint32_t sub = std::bit_cast<std::uint32_t>(std::bit_cast<float>(a) + 0.5f) -
                              std::bit_cast<std::uint32_t>(0.5f);
    r = r < sub ? r : sub;
    // |f| >= 65520 (the midpoint between 65504, the largest half, and 2^16), infinities and
    // NaNs all land at or above 0x7c00 on both paths: clamp to infinity.
    r = r < 0x7c00u ? r : 0x7c00u;
    // NaN: set the quiet bit and keep the payload's top 10 bits.
    r |= (0u - static_cast<std::uint32_t>(a > 0x7f800000u)) & (0x200u | ((a >> 13) & 0x3ffu));
    return static_cast<std::uint16_t>(r | ((x >> 16) & 0x8000u));
}

/// The float equal to the IEEE binary16 `h`: exact for every value (every half is a float).
/// A signalling NaN comes back quiet, as IEEE conversions (and x86's vcvtph2ps) do; the payload
/// is kept. Branch-free.
constexpr float half_bits_to_float(std::uint16_t h) noexcept {
    const std::uint32_t em = h & 0x7fffu;  // exponent and mantissa
    const std::uint32_t normal = (em << 13) + (112u << 23);
    const std::uint32_t special = (normal + (112u << 23)) | (em > 0x7c00u ? 0x400000u : 0u);
    // A subnormal half is m * 2^-24: exact as a float product (m < 2^10, a power-of-two scale).
    const std::uint32_t sub =
        std::bit_cast<std::uint32_t>(static_cast<float>(static_cast<int>(em)) * 0x1p-24f);
    std::uint32_t bits = em >= 0x7c00u ? special : normal;
    const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(em < 0x400u);
    bits = (sub & is_sub) | (bits & ~is_sub);
    return std::bit_cast<float>(bits | (static_cast<std::uint32_t>(h & 0x8000u) << 16));
}

/// The bfloat16 bits nearest to `f` (round to nearest, ties to even): the top 16 bits of the
/// float, rounded. Overflow gives an infinity, float subnormals round like any other value, a
/// NaN gives a quiet NaN with the top bits of its payload. Branch-free, integer only.
constexpr std::uint16_t float_to_bfloat16_bits(float f) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const std::uint32_t nan = (x >> 16) | 0x40u;
    return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/// The float equal to the bfloat16 `b` (exact: its top 16 bits). A signalling NaN comes back
/// quiet, as for float16.
constexpr float bfloat16_bits_to_float(std::uint16_t b) noexcept {
    const std::uint32_t quiet = (b & 0x7fffu) > 0x7f80u ? 0x400000u : 0u;
    return std::bit_cast<float>((static_cast<std::uint32_t>(b) << 16) | quiet);
}

}  // namespace detail

/// IEEE 754 binary16 (torch.float16): 1 sign bit, 5 exponent bits, 10 mantissa bits; largest
/// finite value 65504, smallest subnormal 2^-24. A trivially copyable 2-byte value with the
/// layout of the wire and of torch tensors. Arithmetic is done by converting to float.
///
/// Build one from its bits with `from_bits` (not `float16{0x3c00}`, which converts the number
/// 15360). Comparisons compare the numbers, as for float: `NaN != NaN`, `-0 == +0`; compare
/// `bits` to compare representations.
struct float16 {
    std::uint16_t bits;  ///< the binary16 representation

    /// Uninitialised, like a float; `float16{}` is +0.
    float16() noexcept = default;

    /// The float16 nearest to `f` (round to nearest, ties to even; NaN stays NaN (quiet);
    /// overflow gives ±infinity; tiny values become subnormals or ±0). A dozen instructions,
    /// no branch. A double argument is first converted to float: two roundings.
    constexpr explicit float16(float f) noexcept : bits(detail::float_to_half_bits(f)) {}

    /// The value with representation `b`.
    static constexpr float16 from_bits(std::uint16_t b) noexcept {
        float16 h;
        h.bits = b;
        return h;
    }

    /// The same number as a float: exact (a signalling NaN comes back quiet).
    constexpr explicit operator float() const noexcept { return detail::half_bits_to_float(bits); }

    /// Numeric equality, as for floats (NaN is unequal to everything, -0 equals +0).
    friend constexpr bool operator==(float16 a, float16 b) noexcept {
        return static_cast<float>(a) == static_cast<float>(b);
    }
    /// Numeric order, as for floats (unordered when either is NaN).
    friend constexpr std::partial_ordering operator<=>(float16 a, float16 b) noexcept {
        return static_cast<float>(a) <=> static_cast<float>(b);
    }
};

/// bfloat16 (torch.bfloat16): the top half of a float — 1 sign bit, 8 exponent bits, 7 mantissa
/// bits; the range of a float with about 3 significant digits. Trivially copyable, 2 bytes.
/// Same conventions as `float16`: `from_bits` for representations, numeric comparisons.
struct bfloat16 {
    std::uint16_t bits;  ///< the top 16 bits of the float it stands for

    /// Uninitialised, like a float; `bfloat16{}` is +0.
    bfloat16() noexcept = default;

    /// The bfloat16 nearest to `f` (round to nearest, ties to even; NaN stays NaN (quiet);
    /// overflow gives ±infinity). Four integer instructions and a select. A double argument is
    /// first converted to float: two roundings.
    constexpr explicit bfloat16(float f) noexcept : bits(detail::float_to_bfloat16_bits(f)) {}

    /// The value with representation `b`.
    static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
        bfloat16 h;
        h.bits = b;
        return h;
    }

    /// The same number as a float: exact (a signalling NaN comes back quiet).
    constexpr explicit operator float() const noexcept {
        return detail::bfloat16_bits_to_float(bits);
    }

    /// Numeric equality, as for floats (NaN is unequal to everything, -0 equals +0).
    friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept {
        return static_cast<float>(a) == static_cast<float>(b);
    }
    /// Numeric order, as for floats (unordered when either is NaN).
    friend constexpr std::partial_ordering operator<=>(bfloat16 a, bfloat16 b) noexcept {
        return static_cast<float>(a) <=> static_cast<float>(b);
    }
};

static_assert(sizeof(float16) == 2 && alignof(float16) == 2);
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2);
static_assert(std::is_trivially_copyable_v<float16> && std::is_trivial_v<float16>);
static_assert(std::is_trivially_copyable_v<bfloat16> && std::is_trivial_v<bfloat16>);

/// The element type of a collective's buffer, as it travels in frame headers (one byte; 0 is
/// never a valid dtype). Names and meanings follow torch (`torch.int8`, …, `torch.bfloat16`).
enum class dtype : std::uint8_t {
    int8 = 1,    ///< std::int8_t
    uint8,       ///< std::uint8_t
    int32,       ///< std::int32_t
    int64,       ///< std::int64_t
    float32,     ///< float
    float64,     ///< double
    float16,     ///< corocoll::float16 (IEEE binary16)
    bfloat16,    ///< corocoll::bfloat16
    int16,       ///< std::int16_t
    uint16,      ///< std::uint16_t
    uint32,      ///< std::uint32_t
    uint64,      ///< std::uint64_t
    bool_,       ///< bool (torch.bool)
    complex64,   ///< std::complex<float>
    complex128,  ///< std::complex<double>
};

/// Bytes per element of `t` (also its alignment); 0 for a value that is not a dtype, which
/// makes this the validity check for a dtype read off the wire. Constant time.
constexpr std::size_t dtype_size(dtype t) noexcept {
    switch (t) {
        case dtype::int8:
        case dtype::uint8:
        case dtype::bool_:
            return 1;
        case dtype::float16:
        case dtype::bfloat16:
        case dtype::int16:
        case dtype::uint16:
            return 2;
        case dtype::int32:
        case dtype::uint32:
        case dtype::float32:
            return 4;
        case dtype::int64:
        case dtype::uint64:
        case dtype::float64:
        case dtype::complex64:
            return 8;
        case dtype::complex128:
            return 16;
    }
    return 0;
}

/// torch's name of `t` ("int8", "uint8", "int32", "int64", "float32", "float64", "float16",
/// "bfloat16"); "unknown dtype" for a value that is not a dtype. Constant time.
constexpr const char* dtype_name(dtype t) noexcept {
    switch (t) {
        case dtype::int8:
            return "int8";
        case dtype::uint8:
            return "uint8";
        case dtype::int32:
            return "int32";
        case dtype::int64:
            return "int64";
        case dtype::float32:
            return "float32";
        case dtype::float64:
            return "float64";
        case dtype::float16:
            return "float16";
        case dtype::bfloat16:
            return "bfloat16";
        case dtype::int16:
            return "int16";
        case dtype::uint16:
            return "uint16";
        case dtype::uint32:
            return "uint32";
        case dtype::uint64:
            return "uint64";
        case dtype::bool_:
            return "bool";
        case dtype::complex64:
            return "complex64";
        case dtype::complex128:
            return "complex128";
    }
    return "unknown dtype";
}

/// Whether `t` is an integer type (int8, int16, int32, int64 and the unsigned ones); false for
/// bool, floating and complex types and for values that are not dtypes. Constant time.
constexpr bool is_integral(dtype t) noexcept {
    switch (t) {
        case dtype::int8:
        case dtype::uint8:
        case dtype::int16:
        case dtype::uint16:
        case dtype::int32:
        case dtype::uint32:
        case dtype::int64:
        case dtype::uint64:
            return true;
        default:
            return false;
    }
}

/// Whether `t` is complex64 or complex128. Constant time.
constexpr bool is_complex(dtype t) noexcept {
    return t == dtype::complex64 || t == dtype::complex128;
}

namespace detail {

// Element types are mapped by kind and size, not by exact type: every integer type of 1, 2, 4
// or 8 bytes is the intN/uintN of its size and signedness (`long long` and `long` are both
// int64 where both are 64-bit; `char` is int8 or uint8 as the platform's char is signed or
// not), bool is bool, and the floating and complex types are those of torch.
template <class T>
struct dtype_of_impl {};

template <class T>
constexpr dtype integer_dtype() noexcept {
    constexpr bool s = std::is_signed_v<T>;
    if constexpr (sizeof(T) == 1) return s ? dtype::int8 : dtype::uint8;
    if constexpr (sizeof(T) == 2) return s ? dtype::int16 : dtype::uint16;
    if constexpr (sizeof(T) == 4) return s ? dtype::int32 : dtype::uint32;
    if constexpr (sizeof(T) == 8) return s ? dtype::int64 : dtype::uint64;
    return dtype{};
}

template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool> && integer_dtype<T>() != dtype{})
struct dtype_of_impl<T> : std::integral_constant<dtype, integer_dtype<T>()> {};
template <>
struct dtype_of_impl<bool> : std::integral_constant<dtype, dtype::bool_> {};
template <>
struct dtype_of_impl<float> : std::integral_constant<dtype, dtype::float32> {};
template <>
struct dtype_of_impl<double> : std::integral_constant<dtype, dtype::float64> {};
template <>
struct dtype_of_impl<float16> : std::integral_constant<dtype, dtype::float16> {};
template <>
struct dtype_of_impl<bfloat16> : std::integral_constant<dtype, dtype::bfloat16> {};
template <>
struct dtype_of_impl<std::complex<float>> : std::integral_constant<dtype, dtype::complex64> {};
template <>
struct dtype_of_impl<std::complex<double>> : std::integral_constant<dtype, dtype::complex128> {};

}  // namespace detail

/// A type that collectives can carry (cv-qualified or not): any integer type of 1, 2, 4 or 8
/// bytes (int8 ... uint64 by size and signedness: `long long` is int64), bool, float, double,
/// float16, bfloat16, std::complex<float> (complex64) and std::complex<double> (complex128).
/// Others (strings, your own types) go through the object collectives.
template <class T>
concept element = requires {
    detail::dtype_of_impl<std::remove_cv_t<T>>::value;
};

/// The dtype of the element type `T` (`dtype_of<float> == dtype::float32`).
template <element T>
inline constexpr dtype dtype_of = detail::dtype_of_impl<std::remove_cv_t<T>>::value;

COROCOLL_END_NAMESPACE
