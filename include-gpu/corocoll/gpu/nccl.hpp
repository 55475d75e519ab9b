#pragma once

// NCCL's types for corocoll's: element types, reduce ops, errors.

#include <corocoll/collectives/dtype.hpp>
#include <corocoll/collectives/reduce_op.hpp>
#include <corocoll/version.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <nccl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

COROCOLL_BEGIN_NAMESPACE

namespace gpu {

/// An NCCL call that failed: `what()` names the operation, the rank, NCCL's name of the
/// result and, where the communicator has one, its last error text.
class nccl_error : public std::runtime_error {
public:
    nccl_error(ncclResult_t code, const std::string& what)
        : std::runtime_error(what), code_(code) {}
    ncclResult_t code() const noexcept { return code_; }

private:
    ncclResult_t code_;
};

/// NCCL's words for `rc`, with the communicator's last error text when it has one.
inline std::string describe_nccl(ncclResult_t rc, ncclComm_t comm = nullptr) {
    std::string out = ncclGetErrorString(rc);
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') out += std::string(" (") + last + ")";
    return out;
}

/// Element types NCCL reduces and moves, and what a C++ element maps to: the fixed-width
/// integers, float, double, CUDA's __half and __nv_bfloat16 (and corocoll::float16 and
/// corocoll::bfloat16, which have their layout), and the FP8 types __nv_fp8_e4m3 and
/// __nv_fp8_e5m2.
template <class T>
constexpr bool nccl_element = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                              std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16> ||
                              std::is_same_v<T, float16> || std::is_same_v<T, bfloat16> ||
                              std::is_same_v<T, __nv_fp8_e4m3> ||
                              std::is_same_v<T, __nv_fp8_e5m2> ||
                              (std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                               (sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8));

template <class T>
constexpr ncclDataType_t nccl_type_of() noexcept {
    static_assert(nccl_element<T>,
                  "corocoll: NCCL moves 8-, 32- and 64-bit integers, float16 (__half), bfloat16 "
                  "(__nv_bfloat16), float, double and FP8 (__nv_fp8_e4m3, __nv_fp8_e5m2)");
    if constexpr (std::is_same_v<T, float>) {
        return ncclFloat32;
    } else if constexpr (std::is_same_v<T, double>) {
        return ncclFloat64;
    } else if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, float16>) {
        return ncclFloat16;
    } else if constexpr (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, bfloat16>) {
        return ncclBfloat16;
    } else if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) {
        return ncclFloat8e4m3;
    } else if constexpr (std::is_same_v<T, __nv_fp8_e5m2>) {
        return ncclFloat8e5m2;
    } else if constexpr (sizeof(T) == 1) {
        return std::is_signed_v<T> ? ncclInt8 : ncclUint8;
    } else if constexpr (sizeof(T) == 4) {
        return std::is_signed_v<T> ? ncclInt32 : ncclUint32;
    } else {
        return std::is_signed_v<T> ? ncclInt64 : ncclUint64;
    }
}

/// NCCL's name of a data type ("float32", "bfloat16", ...), as the benchmarks print it.
inline const char* nccl_type_name(ncclDataType_t t) noexcept {
    switch (t) {
        case ncclInt8:
            return "int8";
        case ncclUint8:
            return "uint8";
        case ncclInt32:
            return "int32";
        case ncclUint32:
            return "uint32";
        case ncclInt64:
            return "int64";
        case ncclUint64:
            return "uint64";
        case ncclFloat16:
            return "float16";
        case ncclFloat32:
            return "float32";
        case ncclFloat64:
            return "float64";
        case ncclBfloat16:
            return "bfloat16";
        case ncclFloat8e4m3:
            return "fp8_e4m3";
        case ncclFloat8e5m2:
            return "fp8_e5m2";
        default:
            return "unknown";
    }
}

/// True where NCCL has `op`: sum, product, min, max, avg.
constexpr bool nccl_has(reduce_op op) noexcept {
    return op == reduce_op::sum || op == reduce_op::product || op == reduce_op::min ||
           op == reduce_op::max || op == reduce_op::avg;
}

/// NCCL's op for `op`; `std::invalid_argument` (prefixed with `where`) for the bitwise ops,
/// which NCCL does not have (c10d's NCCL backend rejects them too).
inline ncclRedOp_t nccl_op_of(reduce_op op, const std::string& where) {
    switch (op) {
        case reduce_op::sum:
            return ncclSum;
        case reduce_op::product:
            return ncclProd;
        case reduce_op::min:
            return ncclMin;
        case reduce_op::max:
            return ncclMax;
        case reduce_op::avg:
            return ncclAvg;
        default:
            break;
    }
    throw std::invalid_argument(where + "reduce_op " + op_name(op) +
                                " is not available with the NCCL backend (it has sum, product, "
                                "min, max and avg; bitwise ops need the tcp backend)");
}

}  // namespace gpu

COROCOLL_END_NAMESPACE
