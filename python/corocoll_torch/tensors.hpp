#pragma once

// The torch backend, part 3 of 7: tensors.
// A private header of backend.cpp, the backend's one translation unit, which includes it after
// torch's and corocoll's headers and the parts before it.

namespace corocoll_torch {

/// Calls `f(T{})` with the corocoll element type of `t`; false when corocoll has none.
template <class F>
bool with_element(at::ScalarType t, F&& f) {
    switch (t) {
        case at::kChar:
            f(std::int8_t{});
            return true;
        case at::kByte:
            f(std::uint8_t{});
            return true;
        case at::kInt:
            f(std::int32_t{});
            return true;
        case at::kLong:
            f(std::int64_t{});
            return true;
        case at::kFloat:
            f(float{});
            return true;
        case at::kDouble:
            f(double{});
            return true;
        case at::kHalf:
            f(cc::float16{});
            return true;
        case at::kBFloat16:
            f(cc::bfloat16{});
            return true;
        default:
            return false;
    }
}

/// The elements of `t` as `T`: its dtype's type, or uint8 for the bytes of a dtype corocoll
/// has no type for.
template <class T>
std::span<T> span_of(const at::Tensor& t) {
    return {static_cast<T*>(t.data_ptr()), t.nbytes() / sizeof(T)};
}

/// Elements of `t` per element of the span the operation sees (1, or the element size of a
/// dtype that moves as bytes).
inline std::size_t raw_scale(const at::Tensor& t) {
    bool known = with_element(t.scalar_type(), [](auto) {});
    return known ? 1 : static_cast<std::size_t>(t.element_size());
}

/// A tensor an operation reads or writes, as corocoll sees it: `dense` is the tensor itself
/// when it is contiguous, else a contiguous copy whose contents go back into `user` when the
/// operation has succeeded (`write_back`, on the progress thread).
struct tensor_arg {
    at::Tensor user;
    at::Tensor dense;
    void write_back() {
        if (!dense.is_same(user)) user.copy_(dense);
    }
};

}  // namespace corocoll_torch
