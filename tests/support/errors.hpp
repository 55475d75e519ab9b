#pragma once

// The message of a caught exception, for tests that keep errors to look at later. Test code
// only; not installed.

#include <exception>
#include <string>

namespace corocoll_test {

/// The message of `e`: "" for null, "unknown exception" for something not a std::exception.
inline std::string what(const std::exception_ptr& e) {
    if (!e) return "";
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        return x.what();
    } catch (...) {
    }
    return "unknown exception";
}

}  // namespace corocoll_test
