#pragma once

// std::vector<bool> packs bits, so it is no buffer; tests that run bool through the
// collectives use this instead, and `vector_of<T>` picks it for bool. Test code only.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <type_traits>
#include <vector>

namespace corocoll_test {

/// A contiguous, growable array of bool: the few members of std::vector the tests use.
class bool_vector {
public:
    bool_vector() = default;
    explicit bool_vector(std::size_t n, bool value = false) { resize(n, value); }
    bool_vector(const bool_vector& o) { *this = o; }
    bool_vector& operator=(const bool_vector& o) {
        if (this != &o) {
            size_ = 0;
            resize(o.size_);
            std::copy(o.begin(), o.end(), begin());
        }
        return *this;
    }
    bool_vector(bool_vector&&) noexcept = default;
    bool_vector& operator=(bool_vector&&) noexcept = default;

    bool* data() noexcept { return data_.get(); }
    const bool* data() const noexcept { return data_.get(); }
    std::size_t size() const noexcept { return size_; }
    bool empty() const noexcept { return size_ == 0; }
    bool* begin() noexcept { return data(); }
    bool* end() noexcept { return data() + size_; }
    const bool* begin() const noexcept { return data(); }
    const bool* end() const noexcept { return data() + size_; }
    bool& operator[](std::size_t i) noexcept { return data_[i]; }
    const bool& operator[](std::size_t i) const noexcept { return data_[i]; }
    friend bool operator==(const bool_vector& a, const bool_vector& b) {
        return std::equal(a.begin(), a.end(), b.begin(), b.end());
    }

    void resize(std::size_t n, bool value = false) {
        if (n > capacity_) {
            std::size_t cap = std::max(n, capacity_ * 2);
            auto grown = std::make_unique<bool[]>(cap);
            std::copy(begin(), end(), grown.get());
            data_ = std::move(grown);
            capacity_ = cap;
        }
        for (std::size_t i = size_; i < n; ++i) data_[i] = value;
        size_ = n;
    }
    void push_back(bool v) {
        resize(size_ + 1);
        data_[size_ - 1] = v;
    }

private:
    std::unique_ptr<bool[]> data_;
    std::size_t size_ = 0;
    std::size_t capacity_ = 0;
};

/// std::vector<T>, or bool_vector for bool.
template <class T>
using vector_of = std::conditional_t<std::is_same_v<T, bool>, bool_vector, std::vector<T>>;

}  // namespace corocoll_test
