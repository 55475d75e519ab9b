#include <corocoll/rendezvous/launch_env.hpp>

#include <doctest/doctest.h>

#include <map>
#include <stdexcept>
#include <string>

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
