#pragma once

// Reduction operators (torch's ReduceOp: SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR, AVG) and
// the kernels that apply one to two buffers of one element type.

#include <corocoll/collectives/dtype.hpp>
#include <corocoll/version.hpp>

#include <cassert>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

COROCOLL_BEGIN_NAMESPACE

/// How a reducing collective combines the ranks' elements, as it travels in frame headers (one
/// byte; 0 is never a valid op). Names follow torch's `ReduceOp` (`BAND` is `band`, …).
enum class reduce_op : std::uint8_t {
    sum = 1,  ///< a + b; integers wrap around on overflow
    product,  ///< a * b; integers wrap around on overflow
    min,      ///< the smaller; a NaN wins (torch's NaN-propagating min)
    max,      ///< the larger; a NaN wins
    band,     ///< bitwise and (integer dtypes only)
    bor,      ///< bitwise or (integer dtypes only)
    bxor,     ///< bitwise exclusive or (integer dtypes only)
    avg,      ///< the mean: a sum, then `finish_avg` divides by the world size
};

/// The op's name ("sum", "product", "min", "max", "band", "bor", "bxor", "avg");
/// "unknown reduce_op" for a value that is not an op. Constant time.
constexpr const char* op_name(reduce_op op) noexcept {
    switch (op) {
        case reduce_op::sum:
            return "sum";
        case reduce_op::product:
            return "product";
        case reduce_op::min:
            return "min";
        case reduce_op::max:
            return "max";
        case reduce_op::band:
            return "band";
        case reduce_op::bor:
            return "bor";
        case reduce_op::bxor:
            return "bxor";
        case reduce_op::avg:
            return "avg";
    }
    return "unknown reduce_op";
}

/// Whether `reduce_into` can combine elements of type `t` with `op`, as torch can: the
/// bitwise ops need an integer or bool dtype; min and max need an order (not complex); avg
/// needs a number (not bool); sum, product, min and max on bool are logical (sum and max:
/// or; product and min: and). False when `op` or `t` is not a valid value (as read off the
/// wire). Constant time.
constexpr bool op_supported(reduce_op op, dtype t) noexcept {
    if (dtype_size(t) == 0) return false;
    switch (op) {
        case reduce_op::sum:
        case reduce_op::product:
            return true;
        case reduce_op::min:
        case reduce_op::max:
            return !is_complex(t);
        case reduce_op::avg:
            return t != dtype::bool_;
        case reduce_op::band:
        case reduce_op::bor:
        case reduce_op::bxor:
            return is_integral(t) || t == dtype::bool_;
    }
    return false;
}

/// Why `op` cannot reduce `t`, naming both ("reduce_op band is not defined for float32 (bitwise
/// ops need an integer type)"); empty when `op_supported(op, t)`. Allocates: for error paths.
COROCOLL_DECL std::string unsupported_reason(reduce_op op, dtype t);

namespace detail {

// Integer arithmetic goes through unsigned types (at least `unsigned int`, so that uint8
// operands are not promoted to a signed int), which wrap around instead of overflowing; the
// conversion back to a signed type is modular since C++20.
template <class T>
using wrap_t = decltype(std::make_unsigned_t<T>{} + 0u);

template <class T>
inline constexpr bool is_complex_v = false;
template <class V>
inline constexpr bool is_complex_v<std::complex<V>> = true;

struct op_sum {
    template <class T>
    static T apply(T a, T b) noexcept {
        if constexpr (std::is_integral_v<T>) {
            return static_cast<T>(static_cast<wrap_t<T>>(a) + static_cast<wrap_t<T>>(b));
        } else {
            return a + b;
        }
    }
};

struct op_product {
    template <class T>
    static T apply(T a, T b) noexcept {
        if constexpr (std::is_integral_v<T>) {
            return static_cast<T>(static_cast<wrap_t<T>>(a) * static_cast<wrap_t<T>>(b));
        } else {
            return a * b;
        }
    }
};

// min and max propagate NaN as torch does: when `a` is NaN `a != a` picks `a`; when `b` is
// NaN the comparison is false and picks `b`. Both stay plain selects, which vectorize (minps
// alone would not do: it returns its second operand when either is NaN). Of -0 and +0, min
// and max return `b`, the incoming value.
struct op_min {
    template <class T>
    static T apply(T a, T b) noexcept {
        if constexpr (std::is_floating_point_v<T>) {
            return (a < b || a != a) ? a : b;
        } else {
            return a < b ? a : b;
        }
    }
};

struct op_max {
    template <class T>
    static T apply(T a, T b) noexcept {
        if constexpr (std::is_floating_point_v<T>) {
            return (b < a || a != a) ? a : b;
        } else {
            return b < a ? a : b;
        }
    }
};

struct op_band {
    template <class T>
    static T apply(T a, T b) noexcept {
        return static_cast<T>(a & b);
    }
};

struct op_bor {
    template <class T>
    static T apply(T a, T b) noexcept {
        return static_cast<T>(a | b);
    }
};

struct op_bxor {
    template <class T>
    static T apply(T a, T b) noexcept {
        return static_cast<T>(a ^ b);
    }
};

// g++ 12 at -O2 vectorizes with its "very cheap" cost model: only loops whose trip count is a
// known multiple of the vector width, with no scalar epilogue. So the kernels work in blocks
// of a constant number of elements (this helper called with a std::integral_constant) and
// finish with one call for the remainder, which stays scalar.
template <class T, class Op, class Count>
inline void reduce_block(T* __restrict inout, const T* __restrict in, Count n) noexcept {
    for (std::size_t i = 0; i < n; ++i) inout[i] = Op::apply(inout[i], in[i]);
}

/// Elements per vectorized block: 64 covers a 64-byte vector of int8.
inline constexpr std::size_t vector_block = 64;

/// Elements per float16/bfloat16 block, widened to float on the stack (2 x 1 KiB).
inline constexpr std::size_t half_block = 256;

template <class H, class Op, class Count>
inline void reduce_half_block(H* __restrict inout, const H* __restrict in, Count n) noexcept {
    float a[half_block];
    float b[half_block];
    for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<float>(inout[i]);
    for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<float>(in[i]);
    reduce_block<float, Op>(a, b, n);
    for (std::size_t i = 0; i < n; ++i) inout[i] = H(a[i]);
}

/// `inout[i] = Op::apply(inout[i], in[i])` for `n` elements of type `T` (`Op` one of the
/// `op_*` above); the ranges must not overlap. What `reduce_into` runs once it knows the types.
template <class T, class Op>
inline void reduce_loop(T* __restrict inout, const T* __restrict in, std::size_t n) noexcept {
    if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
        // Widen to float, reduce, round back to nearest even. For sum, product and avg's
        // division this equals the correctly rounded 16-bit result: float has at least
        // 2p + 2 bits for both formats' precision p (11 and 8), so the double rounding is
        // innocuous (Figueroa, 1995).
        constexpr auto block = std::integral_constant<std::size_t, half_block>{};
        std::size_t i = 0;
        for (; n - i >= block; i += block) {
            reduce_half_block<T, Op>(inout + i, in + i, block);
        }
        if (i < n) reduce_half_block<T, Op>(inout + i, in + i, n - i);
    } else {
        constexpr auto block = std::integral_constant<std::size_t, vector_block>{};
        std::size_t i = 0;
        for (; n - i >= block; i += block) reduce_block<T, Op>(inout + i, in + i, block);
        reduce_block<T, Op>(inout + i, in + i, n - i);
    }
}

/// Divides `n` elements by `world_size` in place; see `finish_avg`.
template <class T, class Count>
inline void avg_block(T* __restrict data, Count n, int world_size) noexcept {
    if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
        const float w = static_cast<float>(world_size);
        for (std::size_t i = 0; i < n; ++i) data[i] = T(static_cast<float>(data[i]) / w);
    } else if constexpr (std::is_floating_point_v<T>) {
        const T w = static_cast<T>(world_size);
        for (std::size_t i = 0; i < n; ++i) data[i] = data[i] / w;
    } else if constexpr (is_complex_v<T>) {
        // Each part divided, exactly rounded.
        const typename T::value_type w = static_cast<typename T::value_type>(world_size);
        for (std::size_t i = 0; i < n; ++i) data[i] = data[i] / w;
    } else if constexpr (std::is_same_v<T, bool>) {
        (void)data;  // avg is refused for bool
        (void)n;
        (void)world_size;
    } else {
        // In int (int64 for int64): an int8 or uint8 world size could not hold the divisor.
        for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<T>(data[i] / world_size);
    }
}

/// Calls `f(T{})` with the element type of `t` (a value-initialised T, just for its type).
template <class F>
inline void visit_dtype(dtype t, F&& f) {
    switch (t) {
        case dtype::int8:
            return f(std::int8_t{});
        case dtype::uint8:
            return f(std::uint8_t{});
        case dtype::int32:
            return f(std::int32_t{});
        case dtype::int64:
            return f(std::int64_t{});
        case dtype::float32:
            return f(float{});
        case dtype::float64:
            return f(double{});
        case dtype::float16:
            return f(float16{});
        case dtype::bfloat16:
            return f(bfloat16{});
        case dtype::int16:
            return f(std::int16_t{});
        case dtype::uint16:
            return f(std::uint16_t{});
        case dtype::uint32:
            return f(std::uint32_t{});
        case dtype::uint64:
            return f(std::uint64_t{});
        case dtype::bool_:
            return f(bool{});
        case dtype::complex64:
            return f(std::complex<float>{});
        case dtype::complex128:
            return f(std::complex<double>{});
    }
}

[[noreturn]] inline void throw_unsupported(reduce_op op, dtype t) {
    throw std::invalid_argument("corocoll: " + unsupported_reason(op, t));
}

}  // namespace detail

/// `inout[i] = inout[i] OP in[i]` for `count` elements of type `t` (avg sums; `finish_avg`
/// divides at the end). One dispatch on (op, t), then a typed loop: one pass over both buffers,
/// no allocation; float16 and bfloat16 are widened to float in 256-element blocks on the stack.
///
/// With g++ 12 -O2 on x86-64 (SSE2 baseline) every (op, dtype) loop is vectorized except int64
/// product, min and max (SSE2 has no 64-bit multiply or compare; -march=x86-64-v3 vectorizes
/// them too); clang 14 -O2 vectorizes all but int64 min and max.
///
/// Integers wrap around on overflow. min and max propagate NaN (either operand NaN gives a
/// NaN), like torch. Preconditions: both pointers aligned to `dtype_size(t)`, the two ranges
/// not overlapping (checked by assert). Throws `std::invalid_argument` (message from
/// `unsupported_reason`) when `op_supported(op, t)` is false; nothing is written then.
COROCOLL_DECL void reduce_into(reduce_op op, dtype t, std::byte* inout, const std::byte* in,
                               std::size_t count);

/// Turns avg's sums into means: `data[i] /= world_size` for `count` elements of type `t`.
/// Floating types divide exactly-rounded per element (`x / n`, not `x * (1 / n)`); float16 and
/// bfloat16 divide in float and round back to nearest even. Integers divide truncating toward
/// zero (C++'s `/`: -7 / 2 == -3), as torch's integer division of a sum would with
/// `rounding_mode="trunc"`; a sum that wrapped around gives a meaningless mean. One pass, no
/// allocation. Precondition: `world_size >= 1`, `data` aligned to `dtype_size(t)`. Throws
/// `std::invalid_argument` for a value of `t` that is not a dtype.
COROCOLL_DECL void finish_avg(dtype t, std::byte* data, std::size_t count, int world_size);

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/reduce_op.ipp>
#endif
