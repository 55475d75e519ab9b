// The bodies of the non-template functions declared in <corocoll/rendezvous/launch_env.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/rendezvous/launch_env.hpp>

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {
namespace detail {

COROCOLL_DECL std::optional<long long> env_int(const env_lookup& env, const char* name) {
    const char* v = env(name);
    if (v == nullptr) return std::nullopt;
    std::string_view s(v);
    long long value = 0;
    bool negative = !s.empty() && s.front() == '-';
    if (negative) s.remove_prefix(1);
    if (s.empty() || s.size() > 12) {
        throw std::invalid_argument("corocoll: environment variable " + std::string(name) + "='" +
                                    v + "' is not an integer");
    }
    for (char c : s) {
        if (c < '0' || c > '9') {
            throw std::invalid_argument("corocoll: environment variable " + std::string(name) +
                                        "='" + v + "' is not an integer");
        }
        value = value * 10 + (c - '0');
    }
    return negative ? -value : value;
}

}  // namespace detail
}  // namespace rendezvous

namespace rendezvous {

COROCOLL_DECL std::vector<std::string> expand_hostlist(std::string_view list) {
    auto bad = [&](const std::string& why) {
        return std::invalid_argument("corocoll: Slurm hostlist '" + std::string(list) +
                                     "': " + why);
    };
    constexpr std::size_t max_hosts = 100000;
    std::vector<std::string> out;
    // Split at the commas outside brackets; each piece is a name with bracket groups.
    std::size_t start = 0;
    int depth = 0;
    std::vector<std::string_view> pieces;
    for (std::size_t i = 0; i <= list.size(); ++i) {
        char c = i < list.size() ? list[i] : ',';
        if (c == '[') {
            if (++depth > 1) throw bad("nested '['");
        } else if (c == ']') {
            if (--depth < 0) throw bad("']' without '['");
        } else if (c == ',' && depth == 0) {
            if (i > start) pieces.push_back(list.substr(start, i - start));
            start = i + 1;
        }
    }
    if (depth != 0) throw bad("'[' without ']'");
    for (std::string_view piece : pieces) {
        std::vector<std::string> names{std::string()};
        std::size_t i = 0;
        while (i < piece.size()) {
            std::size_t open = piece.find('[', i);
            std::string_view literal =
                piece.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i);
            for (auto& n : names) n.append(literal);
            if (open == std::string_view::npos) break;
            std::size_t close = piece.find(']', open);
            std::string_view group = piece.substr(open + 1, close - open - 1);
            std::vector<std::string> suffixes;
            std::size_t g = 0;
            while (g <= group.size()) {
                std::size_t comma = group.find(',', g);
                std::string_view item = group.substr(
                    g, comma == std::string_view::npos ? std::string_view::npos : comma - g);
                std::size_t dash = item.find('-');
                std::string_view lo = item.substr(0, dash);
                std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
                auto number = [&](std::string_view d) {
                    if (d.empty() || d.size() > 9 ||
                        d.find_first_not_of("0123456789") != std::string_view::npos) {
                        throw bad("'" + std::string(item) + "' is not a number or a range");
                    }
                    return std::stoul(std::string(d));
                };
                unsigned long a = number(lo), b = number(hi);
                if (b < a) throw bad("range '" + std::string(item) + "' runs backwards");
                if ((b - a + 1) * names.size() + out.size() > max_hosts) {
                    throw bad("more than 100000 hosts");
                }
                for (unsigned long v = a; v <= b; ++v) {
                    std::string digits = std::to_string(v);
                    if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
                    suffixes.push_back(std::move(digits));
                }
                if (comma == std::string_view::npos) break;
                g = comma + 1;
            }
            std::vector<std::string> grown;
            grown.reserve(names.size() * suffixes.size());
            for (const auto& n : names) {
                for (const auto& sfx : suffixes) grown.push_back(n + sfx);
            }
            names = std::move(grown);
            i = close + 1;
        }
        if (names.size() + out.size() > max_hosts) throw bad("more than 100000 hosts");
        for (auto& n : names) out.push_back(std::move(n));
    }
    return out;
}

COROCOLL_DECL void read_master_env(launch_info& info, const env_lookup& env) {
    if (const char* a = env("MASTER_ADDR")) info.master_addr = a;
    if (auto p = detail::env_int(env, "MASTER_PORT")) {
        if (*p < 0 || *p > 65535) {
            throw std::invalid_argument("corocoll: MASTER_PORT=" + std::to_string(*p) +
                                        " is not a port number");
        }
        info.master_port = static_cast<std::uint16_t>(*p);
    }
    if (const char* s = env("TORCHELASTIC_USE_AGENT_STORE")) {
        info.agent_store = std::string_view(s) == "True" || std::string_view(s) == "true" ||
                           std::string_view(s) == "1";
    }
    if (auto c = detail::env_int(env, "TORCHELASTIC_RESTART_COUNT")) {
        info.restart_count = static_cast<int>(*c);
    }
    if (info.launcher != "slurm") return;
    if (!info.master_addr) {
        for (const char* v : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}) {
            const char* list = env(v);
            if (list == nullptr || *list == '\0') continue;
            try {
                auto hosts = expand_hostlist(list);
                if (!hosts.empty()) info.master_addr = std::move(hosts.front());
            } catch (const std::invalid_argument& e) {
                throw std::invalid_argument(std::string(e.what()) + " (from " + v + ")");
            }
            break;
        }
    }
    if (!info.master_port) {
        if (auto id = detail::env_int(env, "SLURM_JOB_ID"); id && *id >= 0) {
            info.master_port = slurm_port(static_cast<unsigned long long>(*id));
        }
    }
}

COROCOLL_DECL launch_info read_launch_env(const env_lookup& env) {
    launch_info info;
    const detail::launcher_vars* chosen = nullptr;
    for (const auto& l : detail::launchers) {
        auto rank = detail::env_int(env, l.rank);
        auto size = detail::env_int(env, l.size);
        if (!rank && !size) continue;
        if (!rank || !size) {
            throw std::invalid_argument(std::string("corocoll: ") + (rank ? l.size : l.rank) +
                                        " is not set but " + (rank ? l.rank : l.size) + " is (" +
                                        l.launcher + " convention)");
        }
        if (*size <= 0) {
            throw std::invalid_argument(std::string("corocoll: ") + l.size + "=" +
                                        std::to_string(*size) + " must be positive");
        }
        if (*rank < 0 || *rank >= *size) {
            throw std::invalid_argument(std::string("corocoll: ") + l.rank + "=" +
                                        std::to_string(*rank) + " is outside [0, " + l.size + "=" +
                                        std::to_string(*size) + ")");
        }
        if (chosen == nullptr) {
            chosen = &l;
            info.rank = static_cast<int>(*rank);
            info.world_size = static_cast<int>(*size);
            info.launcher = l.launcher;
            if (auto lr = detail::env_int(env, l.local_rank))
                info.local_rank = static_cast<int>(*lr);
            if (l.local_size != nullptr) {
                if (auto ls = detail::env_int(env, l.local_size)) {
                    info.local_world_size = static_cast<int>(*ls);
                }
            }
        } else if (*rank != info.rank || *size != info.world_size) {
            throw std::invalid_argument(std::string("corocoll: launcher variables disagree: ") +
                                        chosen->rank + "=" + std::to_string(info.rank) + ", " +
                                        chosen->size + "=" + std::to_string(info.world_size) +
                                        " but " + l.rank + "=" + std::to_string(*rank) + ", " +
                                        l.size + "=" + std::to_string(*size));
        }
    }
    if (chosen == nullptr) {
        throw std::invalid_argument(
            "corocoll: cannot tell rank and world size: none of RANK/WORLD_SIZE, "
            "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, PMI_RANK/PMI_SIZE, "
            "SLURM_PROCID/SLURM_NTASKS is set (start the program with corocollrun, torchrun, "
            "mpirun or srun, or pass rank and world_size)");
    }
    read_master_env(info, env);
    return info;
}

}  // namespace rendezvous

COROCOLL_END_NAMESPACE
