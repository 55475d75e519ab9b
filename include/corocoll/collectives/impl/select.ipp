// The bodies of the non-template functions declared in <corocoll/collectives/select.hpp>:
// inline where corocoll is header-only, compiled once in separate compilation (version.hpp).
#pragma once

#include <corocoll/collectives/select.hpp>

#include <corocoll/collectives/rooted_shm.hpp>
#include <corocoll/transport/shm/arena.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

COROCOLL_DECL const char* kind_name(collective_kind k) noexcept {
    switch (k) {
        case collective_kind::barrier:
            return "barrier";
        case collective_kind::broadcast:
            return "broadcast";
        case collective_kind::reduce:
            return "reduce";
        case collective_kind::all_reduce:
            return "all_reduce";
        case collective_kind::all_gather:
            return "all_gather";
        case collective_kind::gather:
            return "gather";
        case collective_kind::scatter:
            return "scatter";
        case collective_kind::reduce_scatter:
            return "reduce_scatter";
        case collective_kind::all_to_all:
            return "all_to_all";
        case collective_kind::monitored_barrier:
            return "monitored_barrier";
        case collective_kind::broadcast_object:
            return "broadcast_object_list";
        case collective_kind::gather_object:
            return "gather_object";
        case collective_kind::all_gather_object:
            return "all_gather_object";
        case collective_kind::scatter_object:
            return "scatter_object_list";
    }
    return "unknown collective";
}

COROCOLL_DECL const char* algorithm_name(algorithm a) noexcept {
    switch (a) {
        case algorithm::automatic:
            return "auto";
        case algorithm::ring:
            return "ring";
        case algorithm::recursive_doubling:
            return "recursive_doubling";
        case algorithm::binomial:
            return "binomial";
        case algorithm::chain:
            return "chain";
        case algorithm::bruck:
            return "bruck";
        case algorithm::linear:
            return "linear";
        case algorithm::pairwise:
            return "pairwise";
        case algorithm::dissemination:
            return "dissemination";
        case algorithm::hierarchical:
            return "hierarchical";
        case algorithm::shm:
            return "shm";
    }
    return "unknown";
}

COROCOLL_DECL bool supports(collective_kind k, algorithm a) noexcept {
    switch (k) {
        case collective_kind::all_reduce:
            return a == algorithm::ring || a == algorithm::recursive_doubling ||
                   a == algorithm::hierarchical || a == algorithm::shm;
        case collective_kind::broadcast:
            return a == algorithm::binomial || a == algorithm::chain ||
                   a == algorithm::hierarchical || a == algorithm::shm;
        case collective_kind::reduce:
            return a == algorithm::binomial || a == algorithm::shm;
        case collective_kind::all_gather:
            return a == algorithm::ring || a == algorithm::bruck || a == algorithm::hierarchical ||
                   a == algorithm::shm;
        case collective_kind::gather:
        case collective_kind::scatter:
            return a == algorithm::binomial || a == algorithm::linear || a == algorithm::shm;
        case collective_kind::reduce_scatter:
            return a == algorithm::ring || a == algorithm::recursive_doubling ||
                   a == algorithm::shm;
        case collective_kind::all_to_all:
            return a == algorithm::pairwise || a == algorithm::linear || a == algorithm::shm;
        case collective_kind::barrier:
            return a == algorithm::dissemination;
        default:
            return false;
    }
}

COROCOLL_DECL void algorithm_choice::force(collective_kind k, algorithm a) {
    if (a != algorithm::automatic && !supports(k, a)) {
        throw std::invalid_argument(std::string("corocoll: ") + kind_name(k) +
                                    " has no algorithm '" + algorithm_name(a) + "'");
    }
    forced_[static_cast<std::size_t>(k)] = a;
}

COROCOLL_DECL algorithm_choice algorithm_choice::from_env() {
    const char* v = std::getenv("COROCOLL_ALGORITHM");
    return v == nullptr ? algorithm_choice{} : parse_spec(v);
}

COROCOLL_DECL algorithm_choice algorithm_choice::parse_spec(std::string_view spec) {
    algorithm_choice c;
    const std::string whole(spec);
    auto fail = [&](const std::string& why) {
        throw std::invalid_argument("corocoll: COROCOLL_ALGORITHM='" + whole + "': " + why);
    };
    while (!spec.empty()) {
        auto comma = spec.find(',');
        std::string_view item = spec.substr(0, comma);
        spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
        auto eq = item.find('=');
        std::string_view name = eq == std::string_view::npos ? item : item.substr(eq + 1);
        auto a = find_algorithm(name);
        if (!a) fail("unknown algorithm '" + std::string(name) + "' (" + names_of({}) + ")");
        if (eq == std::string_view::npos) {
            for (std::size_t k = 1; k < collective_kinds; ++k) {
                if (supports(static_cast<collective_kind>(k), *a)) c.forced_[k] = *a;
            }
            continue;
        }
        auto k = find_kind(item.substr(0, eq));
        if (!k) {
            std::string kinds;
            for (std::size_t i = 1; i < collective_kinds; ++i) {
                kinds +=
                    std::string(i == 1 ? "" : ", ") + kind_name(static_cast<collective_kind>(i));
            }
            fail("unknown collective '" + std::string(item.substr(0, eq)) + "' (known: " + kinds +
                 ")");
        }
        if (*a != algorithm::automatic && !supports(*k, *a)) {
            fail(std::string(kind_name(*k)) + " has no algorithm '" + algorithm_name(*a) + "' (" +
                 names_of(k) + ")");
        }
        c.forced_[static_cast<std::size_t>(*k)] = *a;
    }
    return c;
}

COROCOLL_DECL std::optional<algorithm> algorithm_choice::find_algorithm(std::string_view name) {
    for (int i = 0; i <= static_cast<int>(last_algorithm); ++i) {
        if (name == algorithm_name(static_cast<algorithm>(i))) return static_cast<algorithm>(i);
    }
    return std::nullopt;
}

COROCOLL_DECL std::optional<collective_kind> algorithm_choice::find_kind(std::string_view name) {
    for (std::size_t k = 1; k < collective_kinds; ++k) {
        if (name == kind_name(static_cast<collective_kind>(k)))
            return static_cast<collective_kind>(k);
    }
    return std::nullopt;
}

COROCOLL_DECL std::string algorithm_choice::names_of(std::optional<collective_kind> k) {
    std::string out = k ? "it has: auto" : "known: auto";
    for (int i = 1; i <= static_cast<int>(last_algorithm); ++i) {
        auto a = static_cast<algorithm>(i);
        if (!k || supports(*k, a)) out += std::string(", ") + algorithm_name(a);
    }
    return out;
}

COROCOLL_DECL thresholds thresholds::for_l2(std::size_t l2) noexcept {
    thresholds t;
    if (l2 == 0) return t;
    // The power of two nearest to l2 / measured_l2, as a shift between -2 and 2.
    const double ratio = static_cast<double>(l2) / static_cast<double>(measured_l2);
    const long shift = std::clamp(std::lround(std::log2(ratio)), -2L, 2L);
    auto scaled = [shift](std::size_t v) {
        return shift >= 0 ? v << static_cast<unsigned>(shift) : v >> static_cast<unsigned>(-shift);
    };
    t.shm_pair_ring_from = scaled(t.shm_pair_ring_from);
    t.shm_pair_ring_below = scaled(t.shm_pair_ring_below);
    t.shm_pair_single_copy_tree_from = scaled(t.shm_pair_single_copy_tree_from);
    t.shm_pair_rooted_below = scaled(t.shm_pair_rooted_below);
    t.shm_rooted_below = scaled(t.shm_rooted_below);
    return t;
}

namespace detail {

// ceil(log2 n), at least 1.
inline double log2_up(int n) noexcept {
    return n <= 2 ? 1.0 : static_cast<double>(std::bit_width(static_cast<unsigned>(n - 1)));
}

// Where, in units of alpha / beta, the ring's all_reduce (2 (n - 1) steps of s / n) overtakes
// recursive doubling (log2 n steps of s, two more where n is no power of two): 0 where it
// never does in the model (n = 2).
inline double all_reduce_crossover(int n) noexcept {
    const double steps = log2_up(n) + ((n & (n - 1)) == 0 ? 0.0 : 2.0);
    const double ring_share = 2.0 * (n - 1) / n;
    return steps > ring_share ? (2.0 * (n - 1) - steps) / (steps - ring_share) : 0.0;
}

// Where, in units of alpha / beta, the ring's reduce_scatter (n - 1 steps of s / n) overtakes a
// whole all_reduce by recursive doubling (log2 n steps of s, two more where n is no power of
// two): 0 where doubling never wins in the model (n < 4, 5 and 6: as many steps or more).
inline double reduce_scatter_crossover(int n) noexcept {
    const double steps = log2_up(n) + ((n & (n - 1)) == 0 ? 0.0 : 2.0);
    const double ring_steps = n - 1.0;
    return steps < ring_steps ? (ring_steps - steps) / (steps - ring_steps / n) : 0.0;
}

// The chain's n - 2 filling steps against the tree's log2(n) - 1 extra copies of the message.
inline double broadcast_crossover(int n) noexcept {
    const double l = log2_up(n);
    return l > 1.0 ? (n - 2) / (l - 1.0) : 0.0;
}

// The ring's n - 1 - log2(n) latencies over Bruck's, against the (n - 1) / n of the message
// both move.
inline double all_gather_crossover(int n) noexcept {
    return (n - 1 - log2_up(n)) * n / static_cast<double>(n - 1);
}

// `bytes` times `growth`, saturating.
inline std::size_t grown(std::size_t bytes, double growth) noexcept {
    const double v = static_cast<double>(bytes) * growth;
    constexpr auto most = static_cast<double>(std::size_t{1} << 62);
    return v >= most ? std::size_t{1} << 62 : static_cast<std::size_t>(v);
}

}  // namespace detail

COROCOLL_DECL double rank_growth(collective_kind k, int n) noexcept {
    constexpr int measured = 8;
    if (n <= measured) return 1.0;
    double ratio = 1.0;
    switch (k) {
        case collective_kind::all_reduce:
            ratio = detail::all_reduce_crossover(n) / detail::all_reduce_crossover(measured);
            break;
        case collective_kind::all_gather:
            ratio = detail::all_gather_crossover(n) / detail::all_gather_crossover(measured);
            break;
        default:
            break;
    }
    return ratio > 1.0 ? ratio : 1.0;
}

COROCOLL_DECL std::size_t chain_pieces_needed(int n) noexcept {
    if (n <= 2) return 0;
    return static_cast<std::size_t>(std::floor(detail::broadcast_crossover(n))) + 1;
}

COROCOLL_DECL std::size_t reduce_scatter_doubling_below(const thresholds& t, int n) noexcept {
    constexpr int measured = 4;
    return detail::grown(
        t.reduce_scatter_doubling_bytes,
        detail::reduce_scatter_crossover(n) / detail::reduce_scatter_crossover(measured));
}

// A 2-rank gather leaves the arena for one message where its block leaves the step lines.
static_assert(thresholds{}.shm_pair_gather_message_from == transport::shm_arena::line_bytes + 1);

COROCOLL_DECL algorithm select(collective_kind k, std::size_t bytes, int n,
                               const algorithm_choice& choice, const thresholds& t,
                               const topology* hosts, bool arena, std::size_t single_copy_from,
                               std::size_t single_copy_below) {
    if (algorithm forced = choice.forced(k); forced != algorithm::automatic) return forced;
    if (arena) {
        // Whether a 2-rank call of this size falls in [from, below).
        auto pair_window = [&](std::size_t from, std::size_t below) {
            return n == 2 && bytes >= from && bytes < below;
        };
        // Whether the arena's call copies straight from the ranks' buffers (the buffer one
        // rank offers: a broadcast's, one block of the others; `single_copy_from` and
        // `single_copy_below` are this kind's).
        auto single = [&](std::size_t offered) {
            return transport::in_single_copy_sizes(offered, single_copy_from, single_copy_below);
        };
        if (k == collective_kind::all_reduce) {
            if (single(bytes)) return algorithm::shm;
            return pair_window(t.shm_pair_all_reduce_ring_from, t.shm_pair_all_reduce_ring_below)
                       ? algorithm::ring
                       : algorithm::shm;
        }
        if (k == collective_kind::all_gather) {
            if (single(bytes / static_cast<std::size_t>(n))) return algorithm::shm;
            // Where the arena makes no single copies of this call, the ring's window has no
            // upper end: the data sets trailed it up to 16 MiB and tied from 32 (docs/
            // performance.md, "all_gather of 2 ranks by the ring at every size where no
            // single copies are made").
            const std::size_t below = single_copy_from == 0
                                          ? std::numeric_limits<std::size_t>::max()
                                          : t.shm_pair_ring_below;
            return pair_window(t.shm_pair_ring_from, below) ? algorithm::ring : algorithm::shm;
        }
        // One message between the two, in a window of sizes (thresholds::shm_pair_message_below).
        const std::size_t message_from =
            k == collective_kind::gather ? t.shm_pair_gather_message_from : t.shm_pair_message_from;
        if (pair_window(message_from, t.shm_pair_message_below)) {
            if (k == collective_kind::broadcast) return algorithm::binomial;
            if (k == collective_kind::gather || k == collective_kind::scatter) {
                return algorithm::linear;
            }
        }
        if (k == collective_kind::broadcast) {
            // Where the arena keeps 32 step places or more (up to 8 ranks), its queue of small
            // broadcasts beats the tree; with 8 (more ranks) the tree leads below a size.
            bool tree = n > 2 ? bytes < t.shm_broadcast_tree_below &&
                                    !transport::detail::arena_queue_is_deep(n)
                        : single(bytes) ? bytes >= t.shm_pair_single_copy_tree_from
                                        : bytes >= t.shm_pair_ring_from;
            return tree ? algorithm::binomial : algorithm::shm;
        }
        // In the step lines (reduce's buffer, gather's block, scatter's n blocks); gather of
        // 2 ranks by the data sets or single copies too, below a size, and scatter of 2 ranks
        // that way at every size outside the message window above (docs/performance.md,
        // "Scatter of 2 ranks through the arena at every size").
        const std::size_t whole = bytes * static_cast<std::size_t>(n);
        const bool pair_gather = n == 2 && whole < t.shm_pair_rooted_below;
        // On 3 to 8 ranks, gather and scatter by the data sets or single copies below a size;
        // scatter by single copies at every size from their block (docs/performance.md,
        // "Single copies of scatter and all_to_all on 3 to 8 ranks").
        const bool group_rooted = n > 2 && n <= 8 && whole < t.shm_rooted_below;
        if (k == collective_kind::reduce &&
            (rooted_shm_fits(bytes) || (n > 2 && n <= 8 && bytes >= t.shm_reduce_sliced_from))) {
            return algorithm::shm;
        }
        if (k == collective_kind::gather &&
            (rooted_shm_fits(bytes) || pair_gather || group_rooted)) {
            return algorithm::shm;
        }
        if (k == collective_kind::scatter &&
            (rooted_shm_fits(whole) || n == 2 || group_rooted || single(bytes))) {
            return algorithm::shm;
        }
        if (k == collective_kind::all_to_all && single(bytes / static_cast<std::size_t>(n))) {
            return algorithm::shm;  // one copy of each block, at every size
        }
        if (k == collective_kind::reduce_scatter || k == collective_kind::all_to_all) {
            if (bytes < (n == 2 ? t.shm_pair_exchange_below : t.shm_exchange_below)) {
                return algorithm::shm;
            }
        }
        if (k == collective_kind::all_to_all && n > 2 && n <= 8) {
            return bytes / static_cast<std::size_t>(n) < t.shm_all_to_all_linear_block_below
                       ? algorithm::linear
                       : algorithm::pairwise;
        }
    }
    if (hosts != nullptr && hosts->hierarchical() && supports(k, algorithm::hierarchical)) {
        return algorithm::hierarchical;
    }
    switch (k) {
        case collective_kind::all_reduce:
            return bytes >= detail::grown(t.all_reduce_ring_bytes, rank_growth(k, n))
                       ? algorithm::ring
                       : algorithm::recursive_doubling;
        case collective_kind::broadcast: {
            const std::size_t piece = std::max<std::size_t>(t.chain_piece_bytes, 1);
            const std::size_t pieces = bytes / piece + (bytes % piece != 0 ? 1 : 0);
            return n > 2 && bytes >= t.broadcast_chain_bytes && pieces >= chain_pieces_needed(n)
                       ? algorithm::chain
                       : algorithm::binomial;
        }
        case collective_kind::reduce:
            return algorithm::binomial;
        case collective_kind::all_gather:
            return bytes >= detail::grown(t.all_gather_ring_bytes, rank_growth(k, n))
                       ? algorithm::ring
                       : algorithm::bruck;
        case collective_kind::gather:
        case collective_kind::scatter:
            return bytes >= t.linear_block_bytes ? algorithm::linear : algorithm::binomial;
        case collective_kind::reduce_scatter:
            return bytes < reduce_scatter_doubling_below(t, n) ? algorithm::recursive_doubling
                                                               : algorithm::ring;
        case collective_kind::all_to_all:
            // On 2 ranks both are one exchange; the pairwise one makes it without a list.
            return n > 2 && bytes / static_cast<std::size_t>(n) < t.all_to_all_linear_block_below
                       ? algorithm::linear
                       : algorithm::pairwise;
        case collective_kind::barrier:
            return algorithm::dissemination;
        default:
            return algorithm::automatic;
    }
}

COROCOLL_DECL std::string describe(const transport::collective_meta& m) {
    auto k = static_cast<collective_kind>(m.collective);
    std::string s = kind_name(k);
    s += "(";
    bool reduces = k == collective_kind::all_reduce || k == collective_kind::reduce ||
                   k == collective_kind::reduce_scatter;
    bool rooted = k == collective_kind::broadcast || k == collective_kind::reduce ||
                  k == collective_kind::gather || k == collective_kind::scatter ||
                  k == collective_kind::broadcast_object || k == collective_kind::gather_object ||
                  k == collective_kind::scatter_object;
    if (reduces) s += std::string(op_name(static_cast<reduce_op>(m.redop))) + ", ";
    if (rooted) s += "root " + std::to_string(m.root) + ", ";
    // A barrier carries no data: "barrier(dissemination)", not "barrier(unknown dtype x 0)".
    bool data =
        m.count != 0 || (k != collective_kind::barrier && k != collective_kind::monitored_barrier);
    if (data) {
        s += std::string(dtype_name(static_cast<dtype>(m.dtype))) + " x " + std::to_string(m.count);
    }
    if (m.algorithm != 0) {
        s += std::string(data ? ", " : "") + algorithm_name(static_cast<algorithm>(m.algorithm));
    }
    s += ")";
    return s;
}

}  // namespace collectives

COROCOLL_END_NAMESPACE
