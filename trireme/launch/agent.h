// The node agent: the supervision logic of `trireme run`, written against AgentChannel
// so tests can drive it with an in-memory channel. Protocol (keys in agent_channel.h):
//   1. join: node 0 sets the run id; every agent adds itself to `joined`; the last one
//      sets `ready`; everyone waits for `ready` (bounded by --join-timeout)
//   2. spawn the local workers with the torchrun environment
//   3. supervise: forward output; reap workers; every 200 ms look at `failure`. A worker
//      that fails, a signal, or another agent's failure stops all local workers (SIGTERM,
//      SIGKILL after the grace period); the first two also publish `failure`
//   4. finish: add to `done`; node 0 keeps the store up until `all_done` (bounded)
// With --max-restarts R, a worker that fails in step 3 makes its agent set restart/G and
// stop its workers; the other agents see the key and stop theirs; all meet at a counter
// (restart/G/stopped, the last sets restart/G/go) and go back to step 2 with
// TORCHELASTIC_RESTART_COUNT = G, up to R times. The agent also owns the node's snapshot
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
