#pragma once

// What a launcher tells its workers (torchrun's, corocollrun's, mpirun's environment
// variables), read into one struct.

#include <corocoll/version.hpp>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

COROCOLL_BEGIN_NAMESPACE

namespace rendezvous {

/// Reads one environment variable: null when unset. Tests pass their own.
using env_lookup = std::function<const char*(const char*)>;

/// The process environment.
inline env_lookup process_env() {
    return [](const char* name) -> const char* { return std::getenv(name); };
}

/// What the launcher that started this process says about it.
struct launch_info {
    /// This process's rank in the job.
    int rank = -1;
    /// Ranks in the job.
    int world_size = -1;
    int local_rank = -1;        ///< -1 when the launcher does not say
    int local_world_size = -1;  ///< -1 when the launcher does not say
    /// Which convention the numbers came from: "torchrun" (RANK/WORLD_SIZE, also corocollrun's),
    /// "openmpi", "mpich" (Hydra's PMI_*), "slurm".
    std::string launcher;
    /// Host of the rendezvous store (MASTER_ADDR, or derived under srun).
    std::optional<std::string> master_addr;
    /// Port of the rendezvous store (MASTER_PORT, or derived under srun).
    std::optional<std::uint16_t> master_port;
    /// torchrun's agent already serves the store on MASTER_ADDR:MASTER_PORT.
    bool agent_store = false;
    /// TORCHELASTIC_RESTART_COUNT: how many times torchrun restarted the workers.
    int restart_count = 0;

    /// The key prefix workers use in an agent's store (torch 1.13's env:// rendezvous).
    std::string agent_store_prefix() const {
        return "/worker/attempt_" + std::to_string(restart_count);
    }
};

namespace detail {

COROCOLL_DECL std::optional<long long> env_int(const env_lookup& env, const char* name);

// One launcher's names for rank, size, local rank and local size.
struct launcher_vars {
    const char* launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;  // may be null
};

inline constexpr launcher_vars launchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

}  // namespace detail

/// Expands a Slurm hostlist such as `node[01-04,07],login1` into its host names, in order
/// (`node01 node02 node03 node04 node07 login1`), as `scontrol show hostnames` does. Ranges keep
/// the zero padding of their lower bound; several bracket groups in one name multiply
/// (`r[1-2]n[1-2]` gives four names). Throws `std::invalid_argument` naming the list on an
/// unbalanced bracket, a range that runs backwards or a list of more than 100,000 names. Costs
/// one string per host.
COROCOLL_DECL std::vector<std::string> expand_hostlist(std::string_view list);

/// The store port a Slurm job's ranks agree on without talking: 15000 plus the last four
/// digits of SLURM_JOB_ID (15000-24999), as PyTorch Lightning derives it. Two jobs whose ids
/// end alike on one node clash: export MASTER_PORT then.
inline std::uint16_t slurm_port(unsigned long long job_id) {
    return static_cast<std::uint16_t>(15000 + job_id % 10000);
}

/// Fills in where the rendezvous store is: MASTER_ADDR, MASTER_PORT, and whether torchrun's
/// agent serves it (TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT). Needs no rank
/// variables: `env://` with an explicit rank and world size reads only these. When the ranks
/// came from Slurm (`info.launcher == "slurm"`, as srun sets them) and MASTER_ADDR or
/// MASTER_PORT is not exported, they are derived: the address is the first host of
/// SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), where srun's default block distribution puts
/// task 0, and the port is `slurm_port(SLURM_JOB_ID)`.
COROCOLL_DECL void read_master_env(launch_info& info, const env_lookup& env = process_env());

/// Reads rank and world size from whichever launcher started the process. Precedence, first
/// match wins: RANK/WORLD_SIZE (corocollrun, torchrun, or set by hand), Open MPI's
/// OMPI_COMM_WORLD_*, MPICH/Hydra's PMI_RANK/PMI_SIZE, Slurm's SLURM_PROCID/SLURM_NTASKS.
/// A launcher whose rank is set but whose size is not (or the reverse), a value that is not an
/// integer, a rank outside [0, size), or two launchers' variables that disagree on the rank or
/// the size are errors that name the variables. MASTER_ADDR and MASTER_PORT are read for every
/// launcher; mpirun does not set them (export them), and under srun they are derived from
/// Slurm's variables when not exported (see `read_master_env`). Throws `std::invalid_argument`;
/// when no launcher's variables are there at all, the message says which were looked for.
COROCOLL_DECL launch_info read_launch_env(const env_lookup& env = process_env());

}  // namespace rendezvous

COROCOLL_END_NAMESPACE

#if COROCOLL_DEFINE_BODIES
#include <corocoll/rendezvous/impl/launch_env.ipp>
#endif
