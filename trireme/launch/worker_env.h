// The environment of a worker: the launcher's own environment plus the variables torchrun
// sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
// ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*), so
// programs written for torchrun run unchanged; OMP_NUM_THREADS=1 unless already set (as
// torchrun does when it starts several workers per node); TRIREME_TTY=1 when the
// launcher's stderr is a terminal; TRIREME_ELASTIC=1 in an elastic job (--nnodes MIN:MAX,
// whose world size changes between generations); TRIREME_NODE_RANK, the agent's
// --node-rank (which restart_clock.h's readings are keyed by); TRIREME_SNAPSHOT_DIR, the directory in shared memory
// (/dev/shm) that the agent owns for the workers' snapshots: it outlives the workers and
// is removed when the job ends; glibc malloc's MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_
// and MALLOC_TOP_PAD_ (host_allocator_variables) unless the launcher's environment sets any
// of them, GLIBC_TUNABLES or LD_PRELOAD; last LaunchOptions::extra_env, which overrides all.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "trireme/launch/launcher.h"

namespace trireme::launch {

using EnvVars = std::vector<std::pair<std::string, std::string>>;

// What all the job's workers share, decided at rendezvous.
struct JobInfo {
  std::string master_addr;  // the store's host
  int master_port = 0;      // the store's port
  std::string run_id;       // TORCHELASTIC_RUN_ID
  int restart_count = 0;    // TORCHELASTIC_RESTART_COUNT
  bool tty = false;         // the launcher's stderr is a terminal
  std::string snapshot_dir; // TRIREME_SNAPSHOT_DIR: the agent's in-memory snapshot area
  // This generation's membership (elastic jobs re-number the agents present): this
  // node's position among the members and their number; -1: --node-rank and --nnodes.
  int node_position = -1;
  int nodes = -1;
};

// glibc malloc settings that keep freed tensor memory for reuse instead of returning it
// to the kernel (a step reallocates the same sizes; each page returned comes back as a
// zeroed page fault): allocations under 32 MiB from the heap, which is trimmed only above
// 1 GiB free. Resident memory stays at the step's peak, which training reaches anyway.
EnvVars host_allocator_variables();

// The torchrun variables of local worker `local_rank` (0..nproc_per_node-1).
EnvVars torchrun_variables(const LaunchOptions& options, int local_rank, const JobInfo& job);

// base ("KEY=VALUE" entries, as in environ) with vars applied in order: a variable that
// is already in base is replaced in place, a new one is appended.
std::vector<std::string> merge_environment(const std::vector<std::string>& base,
                                           const EnvVars& vars);

// The complete environment of local worker `local_rank`, given the launcher's own.
std::vector<std::string> worker_environment(const std::vector<std::string>& base,
                                            const LaunchOptions& options, int local_rank,
                                            const JobInfo& job);

}  // namespace trireme::launch
