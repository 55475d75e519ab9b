// The bodies of the non-template functions declared in <corocoll/collectives/reduce_op.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/reduce_op.hpp>

COROCOLL_BEGIN_NAMESPACE

COROCOLL_DECL std::string unsupported_reason(reduce_op op, dtype t) {
    if (dtype_size(t) == 0) {
        return "dtype " + std::to_string(static_cast<unsigned>(t)) + " is not a known dtype";
    }
    if (op < reduce_op::sum || op > reduce_op::avg) {
        return "reduce_op " + std::to_string(static_cast<unsigned>(op)) +
               " is not a known reduce_op";
    }
    if (op_supported(op, t)) return {};
    const char* why = op == reduce_op::avg ? "avg needs numbers"
                      : is_complex(t)      ? "complex numbers have no order"
                                           : "bitwise ops need an integer type";
    return std::string("reduce_op ") + op_name(op) + " is not defined for " + dtype_name(t) + " (" +
           why + ")";
}

COROCOLL_DECL void reduce_into(reduce_op op, dtype t, std::byte* inout, const std::byte* in,
                               std::size_t count) {
    if (!op_supported(op, t)) detail::throw_unsupported(op, t);
    assert(reinterpret_cast<std::uintptr_t>(inout) % dtype_size(t) == 0);
    assert(reinterpret_cast<std::uintptr_t>(in) % dtype_size(t) == 0);
    assert(count == 0 ||
           reinterpret_cast<std::uintptr_t>(inout) + count * dtype_size(t) <=
               reinterpret_cast<std::uintptr_t>(in) ||
           reinterpret_cast<std::uintptr_t>(in) + count * dtype_size(t) <=
               reinterpret_cast<std::uintptr_t>(inout));
    detail::visit_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, bool>) {
            // Logical, as torch's: on the bytes (0 or 1), or for sum, max and bor, and for
            // product, min and band.
            auto* a = reinterpret_cast<std::uint8_t*>(inout);
            const auto* b = reinterpret_cast<const std::uint8_t*>(in);
            switch (op) {
                case reduce_op::sum:
                case reduce_op::max:
                case reduce_op::bor:
                    return detail::reduce_loop<std::uint8_t, detail::op_bor>(a, b, count);
                case reduce_op::product:
                case reduce_op::min:
                case reduce_op::band:
                    return detail::reduce_loop<std::uint8_t, detail::op_band>(a, b, count);
                case reduce_op::bxor:
                    return detail::reduce_loop<std::uint8_t, detail::op_bxor>(a, b, count);
                case reduce_op::avg:
                    return;  // unreachable: op_supported refused it
            }
        } else if constexpr (detail::is_complex_v<T>) {
            auto* a = reinterpret_cast<T*>(inout);
            const auto* b = reinterpret_cast<const T*>(in);
            if (op == reduce_op::product) {
                return detail::reduce_loop<T, detail::op_product>(a, b, count);
            }
            return detail::reduce_loop<T, detail::op_sum>(a, b, count);  // sum, avg
        } else {
            auto* a = reinterpret_cast<T*>(inout);
            const auto* b = reinterpret_cast<const T*>(in);
            switch (op) {
                case reduce_op::sum:
                case reduce_op::avg:
                    return detail::reduce_loop<T, detail::op_sum>(a, b, count);
                case reduce_op::product:
                    return detail::reduce_loop<T, detail::op_product>(a, b, count);
                case reduce_op::min:
                    return detail::reduce_loop<T, detail::op_min>(a, b, count);
                case reduce_op::max:
                    return detail::reduce_loop<T, detail::op_max>(a, b, count);
                case reduce_op::band:
                case reduce_op::bor:
                case reduce_op::bxor:
                    if constexpr (std::is_integral_v<T>) {
                        if (op == reduce_op::band)
                            return detail::reduce_loop<T, detail::op_band>(a, b, count);
                        if (op == reduce_op::bor)
                            return detail::reduce_loop<T, detail::op_bor>(a, b, count);
                        return detail::reduce_loop<T, detail::op_bxor>(a, b, count);
                    }
                    return;  // unreachable: op_supported refused bitwise ops on floating types
            }
        }
    });
}

COROCOLL_DECL void finish_avg(dtype t, std::byte* data, std::size_t count, int world_size) {
    if (dtype_size(t) == 0) detail::throw_unsupported(reduce_op::avg, t);
    assert(world_size >= 1);
    assert(reinterpret_cast<std::uintptr_t>(data) % dtype_size(t) == 0);
    detail::visit_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        auto* p = reinterpret_cast<T*>(data);
        constexpr auto block = std::integral_constant<std::size_t, detail::vector_block>{};
        std::size_t i = 0;
        for (; count - i >= block; i += block) detail::avg_block(p + i, block, world_size);
        detail::avg_block(p + i, count - i, world_size);
    });
}

COROCOLL_END_NAMESPACE
