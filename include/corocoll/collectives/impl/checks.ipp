// The bodies of the non-template functions declared in <corocoll/collectives/checks.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/checks.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL void check_root(int rank, int size, const char* what, int root) {
    if (root < 0 || root >= size) {
        throw std::invalid_argument(error_prefix(rank, what) + "root " + std::to_string(root) +
                                    " is outside [0, " + std::to_string(size) + ")");
    }
}

COROCOLL_DECL void check_op(int rank, const char* what, reduce_op op, dtype type) {
    if (!op_supported(op, type)) {
        throw std::invalid_argument(error_prefix(rank, what) + unsupported_reason(op, type));
    }
}

COROCOLL_DECL void check_size(int rank, const char* what, const char* name, std::size_t got,
                              std::size_t expected) {
    if (got != expected) {
        throw std::invalid_argument(error_prefix(rank, what) + name + " has " +
                                    std::to_string(got) + " elements, " + std::to_string(expected) +
                                    " expected");
    }
}

COROCOLL_DECL void check_even_split(int rank, int size, const char* name, std::size_t total) {
    auto n = static_cast<std::size_t>(size);
    if (total % n != 0) {
        throw std::invalid_argument(
            error_prefix(rank, "all_to_all") + name + " of " + std::to_string(total) +
            " elements does not split evenly over " + std::to_string(n) + " ranks");
    }
}

COROCOLL_DECL std::vector<std::size_t> all_to_all_offsets(int rank, int size, const char* name,
                                                          std::vector<std::size_t>& splits,
                                                          std::size_t total, std::size_t elem) {
    auto n = static_cast<std::size_t>(size);
    if (splits.empty()) {
        check_even_split(rank, size, name, total);
        splits.assign(n, total / n);
    }
    check_size(rank, "all_to_all", (std::string(name) + " splits").c_str(), splits.size(), n);
    std::vector<std::size_t> off(n + 1, 0);
    for (std::size_t p = 0; p < n; ++p) off[p + 1] = off[p] + splits[p] * elem;
    check_size(rank, "all_to_all", name, total, off[n] / elem);
    return off;
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
