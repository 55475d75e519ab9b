#pragma once

// Which ranks of a group share a host. Every rank learns the same map at set-up: each rank
// publishes its host identity (boot id, network namespace, and the optional host tag of
// `engine_options::host_tag`) and every rank numbers the distinct identities in the order of
// their lowest rank. Ranks in different network namespaces of one kernel count as different
// hosts (they cannot reach each other's abstract unix sockets, so they cannot share memory;
// the multinode test's "hosts" are such namespaces).

#include <corocoll/version.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace collectives {

/// Hosts of a group's ranks: host `h` holds the ranks `ranks_on(h)` (ascending); its leader is
/// the lowest of them. Hosts are numbered by their lowest rank, so host 0 holds rank 0. A
/// default-made topology knows nothing and puts every rank on one host.
class topology {
public:
    /// One host, of any number of ranks.
    topology() = default;
    /// From the host number of every rank (any numbering; renumbered by lowest rank).
    explicit topology(std::span<const int> host_of_rank);

    /// The topology of ranks whose host identities are `keys` (equal strings: same host).
    static topology from_keys(std::span<const std::string> keys);

    /// Number of hosts; 1 when unknown.
    int hosts() const noexcept { return host_of_.empty() ? 1 : static_cast<int>(first_.size()); }
    /// The host of rank `r` (0 when unknown).
    int host_of(int r) const noexcept {
        return host_of_.empty() ? 0 : host_of_[static_cast<std::size_t>(r)];
    }
    /// The ranks on host `h`, ascending (empty when the topology is unknown).
    std::span<const int> ranks_on(int h) const noexcept;
    /// The lowest rank on host `h`.
    int leader_of(int h) const noexcept { return first_.empty() ? 0 : first_[h]; }
    /// The leader of every host, in host order (ascending ranks).
    std::span<const int> leaders() const noexcept { return first_; }
    /// True when the group spans several hosts and some host holds more than one rank: where
    /// the hierarchical algorithms (intra-host, then among leaders, then intra-host) save
    /// traffic between hosts.
    bool hierarchical() const noexcept { return hierarchical_; }
    /// "2 hosts: ranks 0,1 | 2,3" (for logs and errors).
    std::string describe() const;

private:
    std::vector<int> host_of_;   // per rank; empty: one host
    std::vector<int> first_;     // per host: its lowest rank
    std::vector<int> members_;   // ranks grouped by host, ascending within a host
    std::vector<int> offset_;    // per host + 1: where its ranks start in members_
    bool hierarchical_ = false;  // asked at every collective: found once
};

}  // namespace collectives

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/collectives/impl/topology.ipp>
#endif
