// The bodies of the non-template functions declared in <corocoll/collectives/topology.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/topology.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL topology::topology(std::span<const int> host_of_rank) {
    std::size_t n = host_of_rank.size();
    host_of_.assign(n, -1);
    // Renumber by lowest rank: the first rank seen with a given number opens a host.
    std::vector<int> seen;  // given number of each host, in host order
    for (std::size_t r = 0; r < n; ++r) {
        int h = 0;
        while (h < static_cast<int>(seen.size()) &&
               seen[static_cast<std::size_t>(h)] != host_of_rank[r])
            ++h;
        if (h == static_cast<int>(seen.size())) {
            seen.push_back(host_of_rank[r]);
            first_.push_back(static_cast<int>(r));
        }
        host_of_[r] = h;
    }
    offset_.assign(first_.size() + 1, 0);
    for (int h : host_of_) ++offset_[static_cast<std::size_t>(h) + 1];
    for (std::size_t h = 1; h < offset_.size(); ++h) offset_[h] += offset_[h - 1];
    members_.assign(n, 0);
    std::vector<int> fill(offset_.begin(), offset_.end() - 1);
    for (std::size_t r = 0; r < n; ++r) {
        members_[static_cast<std::size_t>(fill[static_cast<std::size_t>(host_of_[r])]++)] =
            static_cast<int>(r);
    }
    hierarchical_ = first_.size() > 1 && first_.size() < n;  // some host holds several ranks
}

COROCOLL_DECL topology topology::from_keys(std::span<const std::string> keys) {
    std::vector<int> number(keys.size());
    for (std::size_t r = 0; r < keys.size(); ++r) {
        std::size_t same = 0;
        while (keys[same] != keys[r]) ++same;
        number[r] = static_cast<int>(same);
    }
    return topology(number);
}

COROCOLL_DECL std::span<const int> topology::ranks_on(int h) const noexcept {
    if (members_.empty()) return {};
    auto from = static_cast<std::size_t>(offset_[static_cast<std::size_t>(h)]);
    auto to = static_cast<std::size_t>(offset_[static_cast<std::size_t>(h) + 1]);
    return std::span<const int>(members_).subspan(from, to - from);
}

COROCOLL_DECL std::string topology::describe() const {
    if (host_of_.empty()) return "1 host";
    std::string s = std::to_string(hosts());
    s += hosts() == 1 ? " host: ranks " : " hosts: ranks ";
    for (int h = 0; h < hosts(); ++h) {
        if (h > 0) s += " | ";
        bool first = true;
        for (int r : ranks_on(h)) {
            // Appended piece by piece: g++ 12 at -O3 reports a false -Wrestrict on
            // `const char* + std::string&&`.
            if (!first) s += ',';
            s += std::to_string(r);
            first = false;
        }
    }
    return s;
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
