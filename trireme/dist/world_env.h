// Where a worker learns its place in the job: the launcher's environment.
//
// Sources, tried in this order:
//   torchrun / trireme run   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
//                            MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
//                            TORCHELASTIC_USE_AGENT_STORE (the agent hosts the store)
//   Slurm (srun)             SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, and
//                            the tasks on this node from SLURM_NTASKS_PER_NODE, else
//                            SLURM_TASKS_PER_NODE ("2(x3),1"), else SLURM_NNODES;
//                            MASTER_ADDR/MASTER_PORT must be exported by the batch script
//                            (required with more than one rank)
//   Open MPI (mpirun)        OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//                            OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE,
//                            OMPI_COMM_WORLD_NODE_RANK; MASTER_ADDR/MASTER_PORT as above
//   none of them             a single process (rank 0 of 1) on 127.0.0.1, ephemeral port
//
// Pure: the environment is read through a lookup function so tests pass their own.
#pragma once

#include <functional>
#include <string>

namespace trireme::dist {

struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;           // 0: single process, pick an ephemeral port
  bool agent_hosts_store = false;  // true: connect as a client; false: rank 0 hosts it
  int restart_count = 0;
  std::string source = "single";  // "torchrun", "slurm", "openmpi" or "single"

  // Whether the job has ranks on other machines than this one.
  bool spans_machines() const { return world_size > local_world_size; }
};

using EnvLookup = std::function<const char*(const char*)>;

// Reads WorldInfo from the environment. Throws InvalidArgument naming the variable when a
// value is missing, non-numeric or inconsistent (e.g. RANK >= WORLD_SIZE).
WorldInfo world_info_from_env(const EnvLookup& lookup);
// Same, from the process environment.
WorldInfo world_info_from_env();

}  // namespace trireme::dist
