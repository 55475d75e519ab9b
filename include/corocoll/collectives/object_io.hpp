#pragma once

// The byte-level half of the object collectives' serialization: `object_writer` and
// `object_reader` (bounds-checked), which the built-in and user serializers of object.hpp
// write and read through. The wire format is described in object.hpp.

#include <corocoll/core/error.hpp>
#include <corocoll/version.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

class object_writer;
class object_reader;

namespace detail {

struct serialize_fn;
struct deserialize_fn;

/// "1 byte", "12 bytes", "2 entries": a count with its noun, for messages.
COROCOLL_DECL std::string count_of(std::uint64_t n, std::string_view noun);

/// `name` with "a" or "an" in front of it, for messages.
COROCOLL_DECL std::string with_article(std::string_view name);

template <class T>
const char* pretty_function() noexcept {
#if defined(__GNUC__) || defined(__clang__)
    return __PRETTY_FUNCTION__;
#else
    return "";
#endif
}

/// The compiler's name for `T` ("int", "ns::point"), taken from `__PRETTY_FUNCTION__`
/// ("... [with T = int]" on GCC, "... [T = int]" on Clang); "object" elsewhere. Only built
/// for error messages.
template <class T>
std::string compiler_type_name() {
    std::string_view text = pretty_function<T>();
    std::size_t start = text.find("T = ");
    std::size_t end = text.rfind(']');
    if (start == text.npos || end == text.npos || end < start + 4) return "object";
    return std::string(text.substr(start + 4, end - start - 4));
}

/// What `object_reader::read_value` can return.
template <class T>
concept readable_value = std::is_trivially_copyable_v<T> && std::default_initializable<T>;

[[noreturn]] inline void throw_protocol_error(const std::string& what) {
    throw_error(make_error_code(errc::protocol_error), "corocoll: object: " + what);
}

}  // namespace detail

/// Appends the serialized form of values to a `std::string` the caller owns. A
/// customization (`corocoll_serialize`) receives one and writes its members with `write`, or
/// raw bytes with `write_bytes` / `write_value`. Costs: amortized O(bytes appended); the string
/// grows geometrically.
class object_writer {
public:
    /// Appends to `out`, which must outlive the writer; what `out` holds already is kept.
    explicit object_writer(std::string& out) noexcept : out_(&out) {}

    /// Appends `size` raw bytes from `data` (which may be null when `size` is 0).
    void write_bytes(const void* data, std::size_t size) {
        if (size != 0) out_->append(static_cast<const char*>(data), size);
    }

    /// Appends the `sizeof(T)` bytes of `value`'s object representation (padding included).
    template <class T>
        requires std::is_trivially_copyable_v<T>
    void write_value(const T& value) { write_bytes(std::addressof(value), sizeof(T)); }

    /// Appends a length or count as the 8 bytes of a `std::uint64_t`.
    void write_length(std::uint64_t n) { write_value(n); }

    /// Appends `value` serialized with `corocoll::serialize` (user customization or
    /// built-in). Cost: that of `serialize`.
    template <class T>
    void write(const T& value);

    /// Bytes in the output string (including what it held before this writer).
    std::size_t size() const noexcept { return out_->size(); }

    /// The output string.
    std::string& bytes() const noexcept { return *out_; }

private:
    std::string* out_;
};

/// Reads serialized values from bytes it does not own (they must outlive the reader), with
/// every read bounds-checked: reading past the end throws `std::system_error` with
/// `corocoll::errc::protocol_error` and a message naming what was being read and how many
/// bytes were left. A customization (`corocoll_deserialize`) receives one and reads its
/// members with `read`, or raw bytes with `read_bytes` / `read_value` / `read_view`.
class object_reader {
public:
    /// Reads from `bytes`. Free.
    explicit object_reader(std::string_view bytes) noexcept
        : data_(bytes.data()), size_(bytes.size()) {}

    /// Reads from `bytes`. Free.
    explicit object_reader(std::span<const std::byte> bytes) noexcept
        : data_(reinterpret_cast<const char*>(bytes.data())), size_(bytes.size()) {}

    /// Not from a temporary std::string: it would be gone before the first read.
    template <class A>
    explicit object_reader(std::basic_string<char, std::char_traits<char>, A>&&) = delete;

    /// Bytes not read yet.
    std::size_t remaining() const noexcept { return size_ - pos_; }

    /// Bytes read so far.
    std::size_t position() const noexcept { return pos_; }

    /// Whether every byte has been read.
    bool at_end() const noexcept { return pos_ == size_; }

    /// The next `size` bytes, without copying them (the view points into the input). `what`
    /// names them in the error when fewer remain ("a checksum of 4 bytes"); empty: "N bytes".
    std::string_view read_view(std::size_t size, std::string_view what = {});

    /// Copies the next `size` bytes to `data`; `what` as for `read_view`. Cost: one memcpy.
    void read_bytes(void* data, std::size_t size, std::string_view what = {});

    /// The next `sizeof(T)` bytes as a `T` (the inverse of `object_writer::write_value`).
    template <detail::readable_value T>
    T read_value() {
        T value;
        if (sizeof(T) > remaining()) {
            throw_truncated(detail::with_article(detail::compiler_type_name<T>()) + " of " +
                            detail::count_of(sizeof(T), "byte"));
        }
        read_bytes(std::addressof(value), sizeof(T));
        return value;
    }

    /// The next 8 bytes as a length (the inverse of `object_writer::write_length`). The
    /// caller must check the length against `remaining()` before allocating for it.
    std::uint64_t read_length();

    /// Reads into `value` with `corocoll::deserialize` (user customization or built-in).
    template <class T>
    void read(T& value);

    /// Reads a default-constructed `T` with `corocoll::deserialize` and returns it.
    template <class T>
    T read();

    /// Throws the error for data that ends too early: `std::system_error` with
    /// `errc::protocol_error` and "corocoll: object: truncated data reading <what> (<N> left)".
    [[noreturn]] void throw_truncated(std::string_view what) const;

    /// Throws the error for data that cannot be a serialized value (a bool of 7, say):
    /// `std::system_error` with `errc::protocol_error` and "corocoll: object: <what> (at byte
    /// <position>)".
    [[noreturn]] void throw_invalid(std::string_view what) const {
        detail::throw_protocol_error(std::string(what) + " (at byte " + std::to_string(pos_) + ")");
    }

private:
    friend struct detail::deserialize_fn;

    const char* data_;
    std::size_t size_;
    std::size_t pos_ = 0;
};

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/object_io.ipp>
#endif
