#pragma once

// The reduction a collective applies (operator and element type), type-erased, so that the
// algorithms below the typed front ends are compiled once.

#include <corocoll/collectives/dtype.hpp>
#include <corocoll/collectives/reduce_op.hpp>
#include <corocoll/version.hpp>

#include <cstddef>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// The reduction a collective applies: op and element type, as the kernels take them.
struct reduction {
    /// The reduction applied element by element.
    reduce_op op;
    /// The element type both operands hold.
    dtype type;

    /// Bytes per element of `type`.
    std::size_t elem() const noexcept { return dtype_size(type); }
    /// inout[i] = inout[i] op in[i] for `count` elements (avg sums; see `finish`).
    void operator()(std::byte* inout, const std::byte* in, std::size_t count) const {
        reduce_into(op, type, inout, in, count);
    }
    /// What `avg` still owes once the sum is complete: division by the group's size.
    void finish(std::byte* data, std::size_t count, int size) const {
        if (op == reduce_op::avg) finish_avg(type, data, count, size);
    }
};

}  // namespace collectives

COROCOLL_END_NAMESPACE
