#pragma once

/// Serialization behind the object collectives (`broadcast_object_list`, `gather_object`,
/// `all_gather_object`, `scatter_object_list`): a C++ value becomes a byte string that another
/// rank turns back into the same value.
///
/// Wire format. Bytes are in the sender's byte order (all ranks of a job run on one
/// architecture, as for frame headers), with no alignment, padding or type tags: both sides
/// must name the same type. Lengths and counts are `std::uint64_t`.
///
///   type                                  bytes
///   user type (ADL customization)         whatever `corocoll_serialize` writes
///   bool                                  1 byte, 0 or 1
///   other trivially copyable T            the `sizeof(T)` bytes of its object representation
///   std::string                           length, then the characters
///   std::vector<T>                        count, then the elements (one block when T is
///                                         trivially copyable)
///   std::vector<bool>                     count, then one byte (0 or 1) per element
///   std::pair, std::tuple                 the members in order
///   std::optional<T>                      1 byte (0: empty, 1: engaged), then the value
///   std::array<T, N>                      the N elements (no count)
///   std::map, std::unordered_map          count, then key and value of each entry in
///                                         iteration order
///
/// Reading untrusted bytes is safe: every read is bounds-checked, bools and optional flags
/// must be 0 or 1, map keys must be unique, and a count is checked against the bytes left
/// before anything is allocated for it, so a forged length fails at once with
/// `corocoll::errc::protocol_error` instead of allocating. What is allocated before elements
/// are decoded is at most about the input's size plus 1 MiB. The bytes of trivially copyable
/// types are taken as they come: a struct whose members have invalid values for some bit
/// patterns (a bool member, an enum) is trusted to come from a corocoll writer.

#include <corocoll/collectives/object_io.hpp>
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

namespace detail {

// Class templates the built-ins recognize. Allocators, comparators and hashes may be any.
template <class T>
inline constexpr bool is_string_v = false;
template <class A>
inline constexpr bool is_string_v<std::basic_string<char, std::char_traits<char>, A>> = true;

template <class T>
inline constexpr bool is_vector_v = false;
template <class E, class A>
inline constexpr bool is_vector_v<std::vector<E, A>> = true;

template <class T>
inline constexpr bool is_vector_bool_v = false;
template <class A>
inline constexpr bool is_vector_bool_v<std::vector<bool, A>> = true;

template <class T>
inline constexpr bool is_pair_v = false;
template <class A, class B>
inline constexpr bool is_pair_v<std::pair<A, B>> = true;

template <class T>
inline constexpr bool is_tuple_v = false;
template <class... Ts>
inline constexpr bool is_tuple_v<std::tuple<Ts...>> = true;

template <class T>
inline constexpr bool is_optional_v = false;
template <class E>
inline constexpr bool is_optional_v<std::optional<E>> = true;

template <class T>
inline constexpr bool is_array_v = false;
template <class E, std::size_t N>
inline constexpr bool is_array_v<std::array<E, N>> = true;

template <class T>
inline constexpr bool is_map_v = false;
template <class K, class V, class C, class A>
inline constexpr bool is_map_v<std::map<K, V, C, A>> = true;

template <class T>
inline constexpr bool is_unordered_map_v = false;
template <class K, class V, class H, class E, class A>
inline constexpr bool is_unordered_map_v<std::unordered_map<K, V, H, E, A>> = true;

// Trivially copyable, yet pointing into the sender's memory.
template <class T>
inline constexpr bool is_view_v = false;
template <class C, class Tr>
inline constexpr bool is_view_v<std::basic_string_view<C, Tr>> = true;
template <class E, std::size_t N>
inline constexpr bool is_view_v<std::span<E, N>> = true;

template <class T>
concept adl_serializable = requires(object_writer& w, const T& value) {
    corocoll_serialize(w, value);
};

template <class T>
concept adl_deserializable = requires(object_reader& r, T& value) {
    corocoll_deserialize(r, value);
};

/// How a type is encoded; the first that applies, in this order.
enum class shape {
    custom,       ///< user's ADL pair
    half_custom,  ///< only one of the ADL pair: an error
    boolean,
    string,
    vector_bool,
    vector,
    pair,
    tuple,
    optional,
    array,
    map,
    unordered_map,
    view,     ///< std::string_view, std::span: an error
    pointer,  ///< pointers (and arrays of them): an error
    bitwise,  ///< other trivially copyable types
    unsupported,
};

template <class T>
consteval shape shape_of() {
    using U = std::remove_cv_t<T>;
    if constexpr (adl_serializable<U> && adl_deserializable<U>) {
        return shape::custom;
    } else if constexpr (adl_serializable<U> || adl_deserializable<U>) {
        return shape::half_custom;
    } else if constexpr (std::is_same_v<U, bool>) {
        return shape::boolean;
    } else if constexpr (is_string_v<U>) {
        return shape::string;
    } else if constexpr (is_vector_bool_v<U>) {
        return shape::vector_bool;
    } else if constexpr (is_vector_v<U>) {
        return shape::vector;
    } else if constexpr (is_pair_v<U>) {
        return shape::pair;
    } else if constexpr (is_tuple_v<U>) {
        return shape::tuple;
    } else if constexpr (is_optional_v<U>) {
        return shape::optional;
    } else if constexpr (is_array_v<U>) {
        return shape::array;
    } else if constexpr (is_map_v<U>) {
        return shape::map;
    } else if constexpr (is_unordered_map_v<U>) {
        return shape::unordered_map;
    } else if constexpr (is_view_v<U>) {
        return shape::view;
    } else if constexpr (std::is_pointer_v<std::remove_all_extents_t<U>> ||
                         std::is_member_pointer_v<std::remove_all_extents_t<U>>) {
        return shape::pointer;
    } else if constexpr (std::is_trivially_copyable_v<U>) {
        return shape::bitwise;
    } else {
        return shape::unsupported;
    }
}

/// Elements copied as one block: the bytes of a vector or array of them are the elements'
/// object representations back to back.
template <class T>
inline constexpr bool is_bitwise_v = shape_of<T>() == shape::bitwise;

template <class T>
consteval bool is_serializable();

template <class... Ts>
consteval bool all_serializable(std::tuple<Ts...>*) {
    return (is_serializable<Ts>() && ...);
}

/// Whether `T` can be written and read back: a recursive version of the static_asserts in
/// `serialize` and `deserialize`, plus default-constructible elements where the reader
/// constructs them.
template <class T>
consteval bool is_serializable() {
    using U = std::remove_cv_t<T>;
    constexpr shape s = shape_of<U>();
    if constexpr (s == shape::custom || s == shape::boolean || s == shape::bitwise ||
                  s == shape::string || s == shape::vector_bool) {
        return true;
    } else if constexpr (s == shape::vector || s == shape::optional) {
        using E = typename U::value_type;
        return std::default_initializable<E> && is_serializable<E>();
    } else if constexpr (s == shape::array) {
        return is_serializable<typename U::value_type>();
    } else if constexpr (s == shape::pair) {
        return is_serializable<typename U::first_type>() &&
               is_serializable<typename U::second_type>();
    } else if constexpr (s == shape::tuple) {
        return all_serializable(static_cast<U*>(nullptr));
    } else if constexpr (s == shape::map || s == shape::unordered_map) {
        using K = typename U::key_type;
        using V = typename U::mapped_type;
        return std::default_initializable<K> && std::default_initializable<V> &&
               is_serializable<K>() && is_serializable<V>();
    } else {
        return false;
    }
}

template <class T>
consteval std::size_t min_size();

template <class... Ts>
consteval std::size_t min_size_sum(std::tuple<Ts...>*) {
    return (std::size_t{0} + ... + min_size<Ts>());
}

/// The fewest bytes a `T` can be encoded in; 0 for user types, whose encoding is unknown.
template <class T>
consteval std::size_t min_size() {
    using U = std::remove_cv_t<T>;
    constexpr shape s = shape_of<U>();
    if constexpr (s == shape::boolean || s == shape::optional) {
        return 1;
    } else if constexpr (s == shape::bitwise) {
        return sizeof(U);
    } else if constexpr (s == shape::string || s == shape::vector || s == shape::vector_bool ||
                         s == shape::map || s == shape::unordered_map) {
        return sizeof(std::uint64_t);
    } else if constexpr (s == shape::pair) {
        return min_size<typename U::first_type>() + min_size<typename U::second_type>();
    } else if constexpr (s == shape::tuple) {
        return min_size_sum(static_cast<U*>(nullptr));
    } else if constexpr (s == shape::array) {
        return std::tuple_size_v<U> * min_size<typename U::value_type>();
    } else {
        return 0;
    }
}

template <class T>
std::string describe();

template <class... Ts>
std::string describe_list(std::tuple<Ts...>*) {
    std::string text;
    ((text += (text.empty() ? "" : ", ") + describe<Ts>()), ...);
    return text;
}

/// A readable name of `T` for messages ("std::vector<std::string>", "ns::point"). Only built
/// on error paths.
template <class T>
std::string describe() {
    using U = std::remove_cv_t<T>;
    constexpr shape s = shape_of<U>();
    if constexpr (s == shape::boolean) {
        return "bool";
    } else if constexpr (s == shape::string) {
        return "std::string";
    } else if constexpr (s == shape::vector_bool) {
        return "std::vector<bool>";
    } else if constexpr (s == shape::vector) {
        return "std::vector<" + describe<typename U::value_type>() + ">";
    } else if constexpr (s == shape::pair) {
        return "std::pair<" + describe<typename U::first_type>() + ", " +
               describe<typename U::second_type>() + ">";
    } else if constexpr (s == shape::tuple) {
        return "std::tuple<" + describe_list(static_cast<U*>(nullptr)) + ">";
    } else if constexpr (s == shape::optional) {
        return "std::optional<" + describe<typename U::value_type>() + ">";
    } else if constexpr (s == shape::array) {
        return "std::array<" + describe<typename U::value_type>() + ", " +
               std::to_string(std::tuple_size_v<U>) + ">";
    } else if constexpr (s == shape::map || s == shape::unordered_map) {
        return std::string(s == shape::map ? "std::map<" : "std::unordered_map<") +
               describe<typename U::key_type>() + ", " + describe<typename U::mapped_type>() + ">";
    } else {
        return compiler_type_name<U>();
    }
}

/// Upfront allocations for a container are limited to the bytes left plus this much; past
/// that it grows only as elements are actually decoded.
inline constexpr std::size_t reserve_slack = std::size_t{1} << 20;

/// Elements that may encode to no bytes at all (user types, `std::tuple<>`) cannot be
/// checked against the bytes left; a count of them beyond the bytes left is accepted while
/// the elements take at most this much memory.
inline constexpr std::size_t max_unbacked_bytes = std::size_t{16} << 20;

template <class T>
void static_check_shape() {
    constexpr shape s = shape_of<T>();
    static_assert(s != shape::half_custom,
                  "corocoll: this type has only one of corocoll_serialize(object_writer&, const "
                  "T&) and corocoll_deserialize(object_reader&, T&); define both, findable by "
                  "ADL (in the type's namespace or as hidden friends)");
    static_assert(s != shape::view,
                  "corocoll: std::string_view and std::span point into this process's memory and "
                  "cannot be serialized; serialize a std::string or std::vector instead");
    static_assert(s != shape::pointer,
                  "corocoll: a pointer means nothing in another process and cannot be "
                  "serialized; serialize what it points to");
    static_assert(s != shape::unsupported,
                  "corocoll: no serialization for this type; define "
                  "corocoll_serialize(object_writer&, const T&) and "
                  "corocoll_deserialize(object_reader&, T&) for this type, findable by ADL (in "
                  "the type's namespace or as hidden friends)");
}

/// The function object behind `corocoll::serialize`.
struct serialize_fn {
    template <class T>
    void operator()(object_writer& w, const T& value) const {
        constexpr shape s = shape_of<T>();
        static_check_shape<T>();
        if constexpr (s == shape::custom) {
            corocoll_serialize(w, value);
        } else if constexpr (s == shape::boolean) {
            w.write_value(static_cast<std::uint8_t>(value ? 1 : 0));
        } else if constexpr (s == shape::bitwise) {
            w.write_value(value);
        } else if constexpr (s == shape::string) {
            w.write_length(value.size());
            w.write_bytes(value.data(), value.size());
        } else if constexpr (s == shape::vector_bool) {
            w.write_length(value.size());
            for (bool b : value) w.write_value(static_cast<std::uint8_t>(b ? 1 : 0));
        } else if constexpr (s == shape::vector || s == shape::array) {
            using E = typename T::value_type;
            if constexpr (s == shape::vector) w.write_length(value.size());
            if constexpr (is_bitwise_v<E>) {
                w.write_bytes(value.data(), value.size() * sizeof(E));
            } else {
                for (const E& e : value) (*this)(w, e);
            }
        } else if constexpr (s == shape::pair) {
            (*this)(w, value.first);
            (*this)(w, value.second);
        } else if constexpr (s == shape::tuple) {
            std::apply([&](const auto&... e) { ((*this)(w, e), ...); }, value);
        } else if constexpr (s == shape::optional) {
            w.write_value(static_cast<std::uint8_t>(value.has_value() ? 1 : 0));
            if (value.has_value()) (*this)(w, *value);
        } else if constexpr (s == shape::map || s == shape::unordered_map) {
            w.write_length(value.size());
            for (const auto& [k, v] : value) {
                (*this)(w, k);
                (*this)(w, v);
            }
        }
    }
};

/// The function object behind `corocoll::deserialize`.
struct deserialize_fn {
    template <class T>
    void operator()(object_reader& r, T& value) const {
        static_assert(!std::is_const_v<T>, "corocoll: cannot deserialize into a const object");
        constexpr shape s = shape_of<T>();
        static_check_shape<T>();
        if constexpr (s == shape::custom) {
            corocoll_deserialize(r, value);
        } else if constexpr (s == shape::boolean) {
            value = read_flag<T>(r, "value");
        } else if constexpr (s == shape::bitwise) {
            if (sizeof(T) > r.remaining()) {
                r.throw_truncated(with_article(describe<T>()) + " of " +
                                  count_of(sizeof(T), "byte"));
            }
            r.read_bytes(std::addressof(value), sizeof(T));
        } else if constexpr (s == shape::string) {
            std::uint64_t n = read_length<T>(r);
            if (n > r.remaining()) {
                r.throw_truncated(with_article(describe<T>()) + " of " + count_of(n, "byte"));
            }
            std::string_view bytes = r.read_view(static_cast<std::size_t>(n));
            value.assign(bytes.data(), bytes.size());
        } else if constexpr (s == shape::vector_bool) {
            std::size_t n = read_count<T, bool>(r, 1, "element", true);
            value.assign(n, false);
            for (std::size_t i = 0; i < n; ++i) value[i] = read_flag<T>(r, "element");
        } else if constexpr (s == shape::vector) {
            using E = typename T::value_type;
            static_assert(std::default_initializable<E>,
                          "corocoll: deserializing a std::vector needs default-constructible "
                          "elements");
            if constexpr (is_bitwise_v<E>) {
                std::size_t n = read_count<T, E>(r, sizeof(E), "element", true);
                value.resize(n);
                r.read_bytes(value.data(), n * sizeof(E));
            } else {
                std::size_t n = read_count<T, E>(r, min_size<E>(), "element", false);
                value.clear();
                value.reserve(reserve_limit(r, n, sizeof(E)));
                for (std::size_t i = 0; i < n; ++i) {
                    value.emplace_back();
                    (*this)(r, value.back());
                }
            }
        } else if constexpr (s == shape::array) {
            using E = typename T::value_type;
            if constexpr (is_bitwise_v<E>) {
                if (value.size() * sizeof(E) > r.remaining()) {
                    r.throw_truncated(with_article(describe<T>()) + " of " +
                                      count_of(value.size() * sizeof(E), "byte"));
                }
                r.read_bytes(value.data(), value.size() * sizeof(E));
            } else {
                for (E& e : value) (*this)(r, e);
            }
        } else if constexpr (s == shape::pair) {
            (*this)(r, value.first);
            (*this)(r, value.second);
        } else if constexpr (s == shape::tuple) {
            std::apply([&](auto&... e) { ((*this)(r, e), ...); }, value);
        } else if constexpr (s == shape::optional) {
            static_assert(std::default_initializable<typename T::value_type>,
                          "corocoll: deserializing a std::optional needs a default-constructible "
                          "value type");
            if (read_flag<T>(r, "flag")) {
                // A fresh value, as for container elements: a customization need not clear.
                value.emplace();
                (*this)(r, *value);
            } else {
                value.reset();
            }
        } else if constexpr (s == shape::map || s == shape::unordered_map) {
            using K = typename T::key_type;
            using V = typename T::mapped_type;
            static_assert(std::default_initializable<K> && std::default_initializable<V>,
                          "corocoll: deserializing a map needs default-constructible keys and "
                          "values");
            constexpr std::size_t min_entry = min_size<K>() + min_size<V>();
            std::size_t n = read_count<T, typename T::value_type>(r, min_entry, "entry", false);
            value.clear();
            if constexpr (s == shape::unordered_map) {
                // The buckets: about a pointer per entry.
                constexpr std::size_t each =
                    std::max(sizeof(typename T::value_type), sizeof(void*));
                value.reserve(reserve_limit(r, n, each));
            }
            for (std::size_t i = 0; i < n; ++i) {
                K k{};
                V v{};
                (*this)(r, k);
                (*this)(r, v);
                bool inserted;
                if constexpr (s == shape::map) {
                    // A writer emits a std::map in key order, so the end is the right hint and
                    // the whole map is built in linear time.
                    std::size_t before = value.size();
                    value.emplace_hint(value.end(), std::move(k), std::move(v));
                    inserted = value.size() != before;
                } else {
                    inserted = value.emplace(std::move(k), std::move(v)).second;
                }
                if (!inserted) {
                    r.throw_invalid("duplicate key in entry " + std::to_string(i) + " of " +
                                    with_article(describe<T>()));
                }
            }
        }
    }

private:
    /// Reads the count of the container `C` and checks it against the bytes left: each
    /// element takes at least `min_each` bytes (exactly, when `exact`).
    template <class C, class E>
    static std::size_t read_count(object_reader& r, std::size_t min_each, std::string_view noun,
                                  bool exact) {
        std::uint64_t n = read_length<C>(r);
        std::size_t left = r.remaining();
        bool fits =
            min_each != 0 ? n <= left / min_each : n <= left || n <= max_unbacked_bytes / sizeof(E);
        if (!fits) {
            std::string what = with_article(describe<C>()) + " of " + count_of(n, noun);
            if (min_each != 0) {
                what += std::string(exact ? " of " : " of at least ") + count_of(min_each, "byte") +
                        " each";
            }
            r.throw_truncated(what);
        }
        return static_cast<std::size_t>(n);
    }

    template <class C>
    static std::uint64_t read_length(object_reader& r) {
        if (sizeof(std::uint64_t) > r.remaining()) {
            r.throw_truncated("the 8-byte length of " + with_article(describe<C>()));
        }
        return r.read_value<std::uint64_t>();
    }

    /// How many of `n` elements of `bytes_each` bytes to reserve: all, unless that is more
    /// memory than the bytes left plus `reserve_slack` (elements much larger than their
    /// encoding).
    static std::size_t reserve_limit(const object_reader& r, std::size_t n,
                                     std::size_t bytes_each) {
        return std::min(n, (r.remaining() + reserve_slack) / bytes_each);
    }

    /// A byte that must be 0 or 1: the `noun` ("value", "flag") of a `C`.
    template <class C>
    static bool read_flag(object_reader& r, std::string_view noun) {
        auto what = [&] {
            return "the 1-byte " + std::string(noun) + " of " + with_article(describe<C>());
        };
        if (r.remaining() == 0) r.throw_truncated(what());
        auto byte = static_cast<unsigned char>(r.data_[r.pos_]);
        if (byte > 1) r.throw_invalid(what() + " is " + std::to_string(byte) + ", not 0 or 1");
        ++r.pos_;
        return byte == 1;
    }
};

}  // namespace detail

/// `serialize(writer, value)` appends `value`'s bytes to `writer`. Found in this order: the
/// user's `corocoll_serialize(object_writer&, const T&)` (with its
/// `corocoll_deserialize(object_reader&, T&)`) found by ADL; the built-ins for bool, std::string,
/// std::vector, std::pair, std::tuple, std::optional, std::array, std::map,
/// std::unordered_map; a memcpy of any other trivially copyable type (pointers, std::span and
/// std::string_view excepted). Anything else fails to compile with a static_assert that says
/// to define the ADL pair. Cost: O(bytes written), plus a loop per element for containers of
/// non-trivially-copyable elements; containers of trivially copyable ones are one memcpy.
inline constexpr detail::serialize_fn serialize{};

/// `deserialize(reader, value)` reads into `value` what `serialize` wrote for a value of the
/// same type. Strings, vectors and maps are replaced; the elements of vectors, maps and
/// optionals are read into freshly default-constructed objects; anything else (`value`
/// itself, members of pairs, tuples and arrays) is read in place, so a `corocoll_deserialize`
/// must set every member. On error (`std::system_error`, `errc::protocol_error`) `value` is
/// valid but unspecified. Cost: O(bytes read); std::string and containers of trivially copyable
/// elements are one allocation and one memcpy (vectors also zero their elements first); other
/// containers allocate per element as the elements themselves do.
inline constexpr detail::deserialize_fn deserialize{};

/// Types that `serialize` can write and `deserialize` can read back, recursively (container
/// elements must also be default constructible).
template <class T>
concept serializable = detail::is_serializable<T>();

template <class T>
void object_writer::write(const T& value) {
    corocoll::serialize(*this, value);
}

template <class T>
void object_reader::read(T& value) {
    corocoll::deserialize(*this, value);
}

template <class T>
T object_reader::read() {
    static_assert(std::default_initializable<T>,
                  "corocoll: object_reader::read<T>() needs a default-constructible T; read into "
                  "an existing object with read(T&)");
    T value{};
    corocoll::deserialize(*this, value);
    return value;
}

/// `value` serialized into a new string. Cost: that of `serialize`, plus the string's growth.
template <class T>
std::string to_bytes(const T& value) {
    std::string out;
    object_writer writer(out);
    corocoll::serialize(writer, value);
    return out;
}

/// The `T` that `bytes` holds, which must be exactly one serialized `T`: data that ends early
/// or has bytes left over ("... N bytes left over") throws `std::system_error` with
/// `errc::protocol_error`. Cost: that of `deserialize`.
template <class T>
T from_bytes(std::string_view bytes) {
    static_assert(std::default_initializable<T>,
                  "corocoll: from_bytes<T> needs a default-constructible T; read into an "
                  "existing object with object_reader and deserialize");
    object_reader reader(bytes);
    T value{};
    corocoll::deserialize(reader, value);
    if (!reader.at_end()) {
        detail::throw_protocol_error(detail::count_of(reader.remaining(), "byte") +
                                     " left over after reading " +
                                     detail::with_article(detail::describe<T>()) + " of " +
                                     detail::count_of(reader.position(), "byte"));
    }
    return value;
}

namespace detail {

// One `T` from each byte string, in order.
template <class T>
std::vector<T> decode_all(const std::vector<std::string>& all) {
    std::vector<T> out;
    out.reserve(all.size());
    for (const auto& bytes : all) out.push_back(from_bytes<T>(bytes));
    return out;
}

}  // namespace detail

COROCOLL_END_NAMESPACE
