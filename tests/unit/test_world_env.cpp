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
                                       {"SLURM_NTASKS_PER_NODE", "4(x2)"},
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
                                       {"MASTER_PORT", "4321"}}));
  EXPECT_EQ(info.source, "openmpi");
  EXPECT_EQ(info.world_size, 2);
  EXPECT_EQ(info.master_addr, "127.0.0.1");
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
  EXPECT_THROW(world_info_from_env(env({{"RANK", "x"}, {"WORLD_SIZE", "4"}})),
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
