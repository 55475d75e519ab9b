// The bodies of the non-template functions declared in <corocoll/collectives/object_io.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/object_io.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace detail {

COROCOLL_DECL std::string count_of(std::uint64_t n, std::string_view noun) {
    std::string text = std::to_string(n);
    text += ' ';
    if (n != 1 && noun.ends_with('y')) {
        text += noun.substr(0, noun.size() - 1);
        text += "ies";
    } else {
        text += noun;
        if (n != 1) text += 's';
    }
    return text;
}

COROCOLL_DECL std::string with_article(std::string_view name) {
    bool vowel = !name.empty() && std::string_view("aeiouAEIOU").find(name[0]) != name.npos;
    std::string text = vowel ? "an " : "a ";
    text += name;
    return text;
}

}  // namespace detail

COROCOLL_DECL std::string_view object_reader::read_view(std::size_t size, std::string_view what) {
    if (size > remaining()) {
        throw_truncated(what.empty() ? detail::count_of(size, "byte") : std::string(what));
    }
    std::string_view view(data_ + pos_, size);
    pos_ += size;
    return view;
}

COROCOLL_DECL void object_reader::read_bytes(void* data, std::size_t size, std::string_view what) {
    std::string_view view = read_view(size, what);
    if (size != 0) std::memcpy(data, view.data(), size);
}

COROCOLL_DECL std::uint64_t object_reader::read_length() {
    if (sizeof(std::uint64_t) > remaining()) throw_truncated("an 8-byte length");
    return read_value<std::uint64_t>();
}

COROCOLL_DECL void object_reader::throw_truncated(std::string_view what) const {
    detail::throw_protocol_error("truncated data reading " + std::string(what) + " (" +
                                 std::to_string(remaining()) + " left)");
}

COROCOLL_END_NAMESPACE
