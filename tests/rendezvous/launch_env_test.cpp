#include <corocoll/rendezvous/launch_env.hpp>

#include <doctest/doctest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace rdv = corocoll::rendezvous;

namespace {

rdv::env_lookup env_of(std::map<std::string, std::string> vars) {
    return [vars = std::move(vars)](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
    };
}

std::string error_of(std::map<std::string, std::string> vars) {
    try {
        (void)rdv::read_launch_env(env_of(std::move(vars)));
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "no error";
}

}  // namespace

TEST_CASE("torchrun's and corocollrun's variables give rank, sizes, master and agent store") {
    auto info = rdv::read_launch_env(env_of({{"RANK", "3"},
                                             {"WORLD_SIZE", "4"},
                                             {"LOCAL_RANK", "1"},
                                             {"LOCAL_WORLD_SIZE", "2"},
                                             {"MASTER_ADDR", "127.0.0.1"},
                                             {"MASTER_PORT", "29500"},
                                             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                             {"TORCHELASTIC_RESTART_COUNT", "2"}}));
    CHECK(info.launcher == "torchrun");
    CHECK(info.rank == 3);
    CHECK(info.world_size == 4);
    CHECK(info.local_rank == 1);
    CHECK(info.local_world_size == 2);
    CHECK(info.master_addr == "127.0.0.1");
    CHECK(info.master_port == 29500);
    CHECK(info.agent_store);
    CHECK(info.agent_store_prefix() == "/worker/attempt_2");
}

TEST_CASE("Open MPI's, MPICH's and Slurm's variables are read the same way") {
    auto ompi = rdv::read_launch_env(env_of({{"OMPI_COMM_WORLD_RANK", "2"},
                                             {"OMPI_COMM_WORLD_SIZE", "5"},
                                             {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}}));
    CHECK(ompi.launcher == "openmpi");
    CHECK(ompi.rank == 2);
    CHECK(ompi.world_size == 5);
    CHECK(ompi.local_world_size == 3);
    CHECK_FALSE(ompi.agent_store);
    auto mpich = rdv::read_launch_env(
        env_of({{"PMI_RANK", "1"}, {"PMI_SIZE", "7"}, {"MPI_LOCALRANKID", "1"}}));
    CHECK(mpich.launcher == "mpich");
    CHECK(mpich.rank == 1);
    CHECK(mpich.world_size == 7);
    CHECK(mpich.local_rank == 1);
    CHECK(mpich.local_world_size == -1);
    auto slurm = rdv::read_launch_env(
        env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "0"}}));
    CHECK(slurm.launcher == "slurm");
    CHECK(slurm.world_size == 8);
}

TEST_CASE("RANK/WORLD_SIZE take precedence, and agreeing launchers are fine together") {
    auto info = rdv::read_launch_env(env_of({{"RANK", "1"},
                                             {"WORLD_SIZE", "2"},
                                             {"OMPI_COMM_WORLD_RANK", "1"},
                                             {"OMPI_COMM_WORLD_SIZE", "2"},
                                             {"SLURM_PROCID", "1"},
                                             {"SLURM_NTASKS", "2"}}));
    CHECK(info.launcher == "torchrun");
    CHECK(info.rank == 1);
}

TEST_CASE("missing, malformed, out-of-range and contradictory variables are named") {
    CHECK(error_of({}).find("RANK/WORLD_SIZE") != std::string::npos);
    CHECK(error_of({{"RANK", "0"}}).find("WORLD_SIZE is not set") != std::string::npos);
    CHECK(error_of({{"PMI_SIZE", "4"}}).find("PMI_RANK is not set") != std::string::npos);
    CHECK(error_of({{"RANK", "x1"}, {"WORLD_SIZE", "2"}}).find("RANK='x1'") != std::string::npos);
    CHECK(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("RANK=2 is outside") !=
          std::string::npos);
    CHECK(error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE=0") != std::string::npos);
    auto clash = error_of({{"RANK", "0"},
                           {"WORLD_SIZE", "2"},
                           {"OMPI_COMM_WORLD_RANK", "1"},
                           {"OMPI_COMM_WORLD_SIZE", "2"}});
    CHECK(clash.find("disagree") != std::string::npos);
    CHECK(clash.find("OMPI_COMM_WORLD_RANK=1") != std::string::npos);
    CHECK(error_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}})
              .find("MASTER_PORT=70000") != std::string::npos);
}

TEST_CASE("a Slurm hostlist expands as scontrol show hostnames does, keeping zero padding") {
    using v = std::vector<std::string>;
    CHECK(rdv::expand_hostlist("node[01-04,07]") ==
          v{"node01", "node02", "node03", "node04", "node07"});
    CHECK(rdv::expand_hostlist("n1") == v{"n1"});
    CHECK(rdv::expand_hostlist("a[8-10],login2,b[007]") == v{"a8", "a9", "a10", "login2", "b007"});
    CHECK(rdv::expand_hostlist("r[1-2]n[1,3]-ib") == v{"r1n1-ib", "r1n3-ib", "r2n1-ib", "r2n3-ib"});
    CHECK(rdv::expand_hostlist("").empty());
    auto error = [](const char* list) {
        try {
            (void)rdv::expand_hostlist(list);
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    CHECK(error("node[01-04").find("'node[01-04': '[' without ']'") != std::string::npos);
    CHECK(error("node[4-1]").find("range '4-1' runs backwards") != std::string::npos);
    CHECK(error("node[a-b]").find("'a-b' is not a number") != std::string::npos);
    CHECK(error("node[0-999999]").find("more than 100000 hosts") != std::string::npos);
}

TEST_CASE(
    "under srun, MASTER_ADDR is the step's first host and MASTER_PORT comes from the job id") {
    auto info = rdv::read_launch_env(env_of({{"SLURM_PROCID", "5"},
                                             {"SLURM_NTASKS", "8"},
                                             {"SLURM_LOCALID", "1"},
                                             {"SLURM_JOB_ID", "4242137"},
                                             {"SLURM_JOB_NODELIST", "gpu[01-09]"},
                                             {"SLURM_STEP_NODELIST", "gpu[03-04,07]"}}));
    CHECK(info.launcher == "slurm");
    CHECK(info.rank == 5);
    CHECK(info.world_size == 8);
    CHECK(info.local_rank == 1);
    CHECK(info.master_addr == "gpu03");
    CHECK(info.master_port == 15000 + 2137);
    CHECK(rdv::slurm_port(4242137) == 17137);

    // Without a step list (a batch script's own step), the job's list; exports win.
    auto batch = rdv::read_launch_env(env_of({{"SLURM_PROCID", "0"},
                                              {"SLURM_NTASKS", "2"},
                                              {"SLURM_JOB_ID", "7"},
                                              {"SLURM_JOB_NODELIST", "cn[12,14]"}}));
    CHECK(batch.master_addr == "cn12");
    CHECK(batch.master_port == 15007);
    auto exported = rdv::read_launch_env(env_of({{"SLURM_PROCID", "0"},
                                                 {"SLURM_NTASKS", "2"},
                                                 {"SLURM_JOB_ID", "7"},
                                                 {"SLURM_JOB_NODELIST", "cn[12,14]"},
                                                 {"MASTER_ADDR", "10.0.0.1"},
                                                 {"MASTER_PORT", "29500"}}));
    CHECK(exported.master_addr == "10.0.0.1");
    CHECK(exported.master_port == 29500);

    // Other launchers inside an allocation derive nothing: mpirun may place rank 0 anywhere.
    auto ompi = rdv::read_launch_env(env_of({{"OMPI_COMM_WORLD_RANK", "0"},
                                             {"OMPI_COMM_WORLD_SIZE", "2"},
                                             {"SLURM_JOB_ID", "7"},
                                             {"SLURM_JOB_NODELIST", "cn[12,14]"}}));
    CHECK_FALSE(ompi.master_addr);
    CHECK_FALSE(ompi.master_port);
    CHECK(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", "a[1"}})
              .find("(from SLURM_JOB_NODELIST)") != std::string::npos);
}
