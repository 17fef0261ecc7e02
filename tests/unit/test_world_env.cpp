// Reading the worker's place in the job from torchrun, Slurm and Open MPI variables.
#include <gtest/gtest.h>

#include <map>

#include "trireme/common/error.h"
#include "trireme/dist/world_env.h"

using trireme::dist::world_info_from_env;

namespace {
auto env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}
}  // namespace

TEST(WorldEnv, Torchrun) {
  auto info = world_info_from_env(env({{"RANK", "3"},
                                       {"WORLD_SIZE", "4"},
                                       {"LOCAL_RANK", "1"},
                                       {"LOCAL_WORLD_SIZE", "2"},
                                       {"GROUP_RANK", "1"},
                                       {"MASTER_ADDR", "10.1.2.3"},
                                       {"MASTER_PORT", "29500"},
                                       {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                       {"TORCHELASTIC_RESTART_COUNT", "2"}}));
  EXPECT_EQ(info.source, "torchrun");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.master_addr, "10.1.2.3");
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_TRUE(info.agent_hosts_store);
  EXPECT_EQ(info.restart_count, 2);
}

TEST(WorldEnv, Slurm) {
  auto info = world_info_from_env(env({{"SLURM_PROCID", "5"},
                                       {"SLURM_NTASKS", "8"},
                                       {"SLURM_LOCALID", "1"},
                                       {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                       {"SLURM_NODEID", "1"},
                                       {"MASTER_ADDR", "node7"},
                                       {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_FALSE(info.agent_hosts_store);
}

TEST(WorldEnv, OpenMpi) {
  auto info = world_info_from_env(env({{"OMPI_COMM_WORLD_RANK", "0"},
                                       {"OMPI_COMM_WORLD_SIZE", "2"},
                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                       {"MASTER_ADDR", "10.0.0.5"},
                                       {"MASTER_PORT", "4321"}}));
  EXPECT_EQ(info.source, "openmpi");
  EXPECT_EQ(info.world_size, 2);
  EXPECT_FALSE(info.spans_machines());
  EXPECT_EQ(info.master_addr, "10.0.0.5");
  EXPECT_EQ(info.master_port, 4321);
}

TEST(WorldEnv, SingleProcessDefault) {
  auto info = world_info_from_env(env({}));
  EXPECT_EQ(info.source, "single");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.master_port, 0);
}

TEST(WorldEnv, RejectsInconsistentOrMissing) {
  EXPECT_THROW(world_info_from_env(env({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "1"}})),
               trireme::InvalidArgument);
  // Multi-rank without MASTER_PORT cannot rendezvous.
  EXPECT_THROW(world_info_from_env(env({{"RANK", "0"}, {"WORLD_SIZE", "2"}})),
               trireme::InvalidArgument);
}

// The message of the InvalidArgument that reading `vars` throws ("" if none).
static std::string env_error(std::map<std::string, std::string> vars) {
  try {
    world_info_from_env(env(std::move(vars)));
  } catch (const trireme::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(WorldEnv, HalfOfTorchrunsPairIsAMistakeNotASingleProcess) {
  EXPECT_NE(env_error({{"RANK", "3"}, {"MASTER_PORT", "29500"}}).find("RANK is set but WORLD_SIZE is not; export both"),
            std::string::npos);
  EXPECT_NE(env_error({{"WORLD_SIZE", "4"}}).find("WORLD_SIZE is set but RANK is not"), std::string::npos);
}

TEST(WorldEnv, PortZeroOrWorldSizeZeroAreRefusedWithTheVariable) {
  EXPECT_NE(env_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}}).find("MASTER_PORT=0 with 2 ranks"),
            std::string::npos);
  EXPECT_EQ(env_error({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "0"}}), "");  // alone: no store needed
  EXPECT_NE(env_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}, {"MASTER_PORT", "1"}}).find("WORLD_SIZE"),
            std::string::npos);
}

TEST(WorldEnv, AMalformedRankIsRefusedNamingRank) {
  // Every other variable is fine, so the refusal can only be RANK's.
  for (const char* rank : {"x", "4abc", "-1", "99999999999", " 4", "+1", ""}) {
    const std::string error =
        env_error({{"RANK", rank}, {"WORLD_SIZE", "8"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}});
    if (*rank == '\0') {  // empty: unset, RANK is required
      EXPECT_NE(error.find("RANK is not set"), std::string::npos) << error;
      continue;
    }
    EXPECT_NE(error.find(std::string("RANK='") + rank + "' is not an integer in 0..1073741824"), std::string::npos)
        << "RANK='" << rank << "': " << error;
  }
  EXPECT_EQ(env_error({{"RANK", "4"}, {"WORLD_SIZE", "8"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}}),
            "");
}

TEST(WorldEnv, InconsistentRanksNameTheLaunchersVariables) {
  EXPECT_NE(env_error({{"RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "5"}, {"LOCAL_WORLD_SIZE", "4"},
                       {"MASTER_PORT", "29500"}})
                .find("LOCAL_RANK=5 is not below LOCAL_WORLD_SIZE=4"),
            std::string::npos);
  // More ranks on the machine than in the job: the job would be taken to fit on one machine.
  EXPECT_NE(env_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "4"},
                       {"MASTER_PORT", "29500"}})
                .find("LOCAL_WORLD_SIZE=4 is above WORLD_SIZE=2 (torchrun environment)"),
            std::string::npos);
  EXPECT_NE(env_error({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"},
                       {"MASTER_PORT", "1"}})
                .find("OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2"),
            std::string::npos);
}

TEST(WorldEnv, SlurmAndOpenMpiNeedMasterAddrAcrossMachines) {
  // 127.0.0.1 would send each machine's ranks to a store on their own machine.
  EXPECT_NE(env_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "2"}, {"MASTER_PORT", "1234"}})
                .find("MASTER_ADDR is not set for a slurm job of 4 ranks on several machines; export MASTER_ADDR="),
            std::string::npos);
  EXPECT_NE(env_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}, {"MASTER_PORT", "1"}})
                .find("MASTER_ADDR is not set for a openmpi job of 2 ranks on several machines"),
            std::string::npos);
  // On one machine 127.0.0.1 is right; one rank needs no store to meet at.
  EXPECT_EQ(env_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "4"},
                       {"MASTER_PORT", "1234"}}),
            "");
  EXPECT_EQ(env_error({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}), "");
  EXPECT_EQ(env_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}), "");
}

TEST(WorldEnv, SlurmTasksOnThisNodeWithoutNtasksPerNode) {
  // srun sets SLURM_TASKS_PER_NODE ("2(x3),1": three nodes of 2, then one of 1) even
  // without --ntasks-per-node; this node's entry is its local world size.
  const auto slurm = [](const char* node, const char* localid, std::map<std::string, std::string> more) {
    more.insert({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "7"}, {"SLURM_NODEID", node}, {"SLURM_LOCALID", localid},
                 {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1234"}});
    return world_info_from_env(env(more));
  };
  EXPECT_EQ(slurm("0", "1", {{"SLURM_TASKS_PER_NODE", "2(x3),1"}}).local_world_size, 2);
  EXPECT_EQ(slurm("2", "0", {{"SLURM_TASKS_PER_NODE", "2(x3),1"}}).local_world_size, 2);
  EXPECT_EQ(slurm("3", "0", {{"SLURM_TASKS_PER_NODE", "2(x3),1"}}).local_world_size, 1);
  EXPECT_EQ(slurm("1", "0", {{"SLURM_TASKS_PER_NODE", "3,4"}}).local_world_size, 4);
  EXPECT_TRUE(slurm("3", "0", {{"SLURM_TASKS_PER_NODE", "2(x3),1"}}).spans_machines());
  // SLURM_TASKS_PER_NODE comes first: SLURM_NTASKS_PER_NODE is only a maximum when -n is
  // given too (srun -N2 -n4 --ntasks-per-node=4 places 2 and 2, on two machines).
  EXPECT_EQ(slurm("0", "0", {{"SLURM_NTASKS_PER_NODE", "4"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}}).local_world_size,
            2);
  EXPECT_TRUE(slurm("0", "0", {{"SLURM_NTASKS_PER_NODE", "4"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}}).spans_machines());
  EXPECT_EQ(slurm("0", "0", {{"SLURM_NTASKS_PER_NODE", "3"}}).local_world_size, 3);
  EXPECT_THROW(slurm("0", "0", {{"SLURM_NTASKS_PER_NODE", "3abc"}}), trireme::InvalidArgument);
  // Unreadable, or no entry for this node: an even split over SLURM_NNODES (rounded up).
  EXPECT_EQ(slurm("0", "0", {{"SLURM_TASKS_PER_NODE", "2(x"}, {"SLURM_NNODES", "4"}}).local_world_size, 2);
  EXPECT_EQ(slurm("5", "0", {{"SLURM_TASKS_PER_NODE", "2(x3),1"}, {"SLURM_NNODES", "2"}}).local_world_size, 4);
  EXPECT_TRUE(slurm("0", "0", {{"SLURM_NNODES", "2"}}).spans_machines());
  // Nothing said: one node.
  EXPECT_FALSE(slurm("0", "3", {}).spans_machines());
}
