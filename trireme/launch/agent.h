// The node agent: the supervision logic of `trireme run`, written against AgentChannel
// so tests can drive it with an in-memory channel. Protocol (keys in agent_channel.h):
//   1. join: node 0 sets the run id; every agent adds itself to `joined`; the last one
//      sets `ready`; everyone waits for `ready` (bounded by --join-timeout)
//   2. spawn the local workers with the torchrun environment
//   3. supervise: forward output; reap workers; every 200 ms look at `failure`. A worker
//      that fails, a signal, or another agent's failure stops all local workers (SIGTERM,
//      SIGKILL after the grace period); the first two also publish `failure`
//   4. finish: add to `done`; node 0 keeps the store up until `all_done` (bounded)
// With --max-restarts R, a worker that fails in step 3 (or a member lost, leaving, or a
// node asking to join) makes its agent set restart/G and stop its workers; the other
// agents see the key and stop theirs; each checks in, and the first to check in leads:
// it waits until every member of generation G-1 has checked in, left (agents/left/N) or
// gone silent for --node-timeout (agents/alive/N, a heartbeat every 200 ms), adds nodes
// that asked to join (up to --nnodes MAX), and publishes restart/G/members; a leader
// silent for --node-timeout is replaced by one waiting member (restart/G/lead/A). Ranks are
// numbered by position among the members. Survivors let the SnapshotKeeper rebuild what
// lost machines held; all meet at restart/G/recovered and go back to step 2 with
// TORCHELASTIC_RESTART_COUNT = G, up to R times. Fewer than --nnodes MIN ends the job.
// SIGTERM to an agent of an elastic job is a preemption notice: it announces its leave,
// gives its workers --grace-seconds, and exits 0. The agent also owns the node's snapshot
// area (TRIREME_SNAPSHOT_DIR, a directory in /dev/shm, or under TRIREME_SNAPSHOT_ROOT,
// that survives the workers), made after step 1 and removed in 4.
#pragma once

#include "trireme/launch/agent_channel.h"
#include "trireme/launch/launcher.h"
#include "trireme/launch/snapshot_keeper.h"

namespace trireme::launch {

// Where forwarded worker output goes (tests pass pipes).
struct AgentIo {
  int stdout_fd = 1;
  int stderr_fd = 2;
};

// Where the store is, as workers should see it (MASTER_ADDR / MASTER_PORT).
struct StoreAddress {
  std::string host;
  int port = 0;
};

// Runs steps 1–4 for this node. options must be valid (validate_launch_options).
// Installs a SignalPipe for its duration. `keeper` (may be null) protects the node's
// snapshots across machines while each generation runs and rebuilds lost ones.
LaunchResult run_agent(const LaunchOptions& options, AgentChannel& channel,
                       const StoreAddress& store, const AgentIo& io = {}, SnapshotKeeper* keeper = nullptr);

}  // namespace trireme::launch
