// The launcher: one agent per machine that starts the machine's workers with the
// environment torchrun would give them, forwards their output prefixed by rank, and stops
// the whole job when a worker fails or the agent is told to stop.
//
// Terms:
//   agent   one `trireme run` process per node (machine); it owns the node's workers
//   node    agents are numbered 0..nnodes-1 (--node-rank); node 0 hosts the rendezvous
//           store (a c10d TCPStore) that the other agents and all workers connect to,
//           unless the store runs on its own (`trireme store`, --rdzv-external)
//   worker  one process of the user's program; global RANK = node_rank*nproc + local rank
//
// This header includes no libtorch header; the TCPStore lives in tcp_store_channel.cpp.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace trireme::launch {

struct LaunchOptions {
  int nproc_per_node = 1;                 // workers started by this agent
  int nnodes = 1;                         // agents in the job (with nnodes_min: at most)
  // Elastic membership (--nnodes MIN:MAX): the job goes on while at least nnodes_min
  // agents remain; 0 means nnodes (a fixed size: losing an agent ends the job).
  int nnodes_min = 0;
  int node_rank = 0;                      // this agent's index; 0 hosts the store
  std::string rdzv_host = "127.0.0.1";    // where node 0's store listens (MASTER_ADDR)
  // The store runs apart from the agents (`trireme store`, on a host that does not come
  // and go): no agent hosts it, so node 0 is a machine like the others and may be lost.
  bool external_store = false;
  int rdzv_port = 0;                      // 0: an ephemeral port (single node only)
  int max_restarts = 0;                   // worker failures survived by restarting all workers
  int join_timeout_s = 120;               // how long agents wait for each other to join
  double heartbeat_timeout_s = 0;         // a worker whose heartbeat stalls this long is
                                          // killed as hung (0: not watched)
  double stop_grace_s = 5;                // SIGTERM → SIGKILL delay when stopping workers
  // An agent whose store heartbeat stalls this long is taken as lost with its machine.
  double node_timeout_s = 5;
  // SIGTERM to an agent of an elastic job is a spot preemption notice: its workers get
  // this long to finish or abandon their step before the agent leaves the job.
  double preemption_grace_s = 30;
  // Erasure-coded snapshot redundancy across machines ("K+M", e.g. "2+1"; "" none):
  // given to the SnapshotKeeper (snapshot_keeper.h) that launch() builds.
  std::string redundancy;
  // The share of one core each machine's keeper may use on average: it spaces its rounds
  // so that its CPU time per round over the time since the last one stays within it (0:
  // a round whenever a newer snapshot step exists).
  double redundancy_cpu = 0.01;
  // How long node 0 keeps the store up after its own workers finished, waiting for the
  // other agents to finish theirs (torchelastic's exit barrier uses the same 300 s).
  double exit_barrier_timeout_s = 300;
  // Start each next generation's workers ahead of time (launch/standby.h); the program
  // must call trireme::launch::await_activation() first in main.
  bool standby = false;
  std::vector<std::string> command;       // program and its arguments
  // Added to (and overriding) every worker's environment, after the torchrun variables.
  std::vector<std::pair<std::string, std::string>> extra_env;
  // Called once by an agent that founds the job, before it counts itself in; not by one
  // that joins a job already running (a replacement for a lost machine), whose state is
  // that job's. An exception it throws gives back this agent's --node-rank and leaves
  // run_agent/launch, e.g. `trireme train` refusing to start a fresh run among an earlier
  // run's checkpoints.
  std::function<void()> before_founding;
};

// A worker that exits with this code (EX_CONFIG in sysexits.h) failed in a way a restart
// would repeat: the agent ends the job instead of spending --max-restarts on it. Trireme's
// own workers exit with it on trireme::Unrecoverable.
inline constexpr int kExitNoRestart = 78;

// exit_code is what the launcher process should exit with: 0 when every worker of the
// job exited 0, 128+signal when the agent was stopped by a signal, non-zero otherwise.
// failure is one line (no trailing newline, no "trireme run:" prefix) saying what went
// wrong and naming the failed rank; empty on success. The caller prints it.
struct LaunchResult {
  int exit_code = 0;
  std::string failure;
};

// Throws InvalidArgument (one line naming the flag and the fix) when options are unusable.
void validate_launch_options(const LaunchOptions& options);

// The fewest agents the job runs with (nnodes_min, or nnodes when that is 0).
inline int min_nodes(const LaunchOptions& o) { return o.nnodes_min > 0 ? o.nnodes_min : o.nnodes; }
inline bool elastic(const LaunchOptions& o) { return min_nodes(o) < o.nnodes; }

// Runs this node's agent to completion: rendezvous with the other agents, start the
// workers, forward their output to this process's stdout/stderr, supervise them.
// Throws InvalidArgument on bad options (including a program that cannot be found and a
// --rdzv port already in use) and CommError when the store cannot be reached.
// While it runs it handles SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGCHLD (previous handlers
// are restored): the first four stop the job, as SIGTERM to the workers.
LaunchResult launch(const LaunchOptions& options);

}  // namespace trireme::launch
