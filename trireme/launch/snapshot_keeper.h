// SnapshotKeeper: what the node agent asks of the machine-level snapshot redundancy of
// issue 6 (erasure-coded snapshots across machines), as a pure interface, so that the
// agent (trireme_core, no libtorch) can drive it and tests can fake it. The real one is
// ft::ParityKeeper (ft/parity_keeper.h), given to the agent by launch().
//
// The node's snapshot area (TRIREME_SNAPSHOT_DIR) holds one directory per worker rank,
// rank-<R>/<step>/ (ft/snapshot.h). While a generation runs, the keeper protects, in the
// background, the newest step that every machine's workers have a complete snapshot of:
// it copies this machine's rank directories of that step to
//     AREA/protected/<step>/rank-<R>/{data.bin,manifest.json}
// and exchanges erasure-coded blocks with the other agents (ft/parity_exchange.h), keeping
// its parity blocks in its own memory. After machines are lost, recover() rebuilds their
// protected rank directories on a survivor from the others' copies and parity, so the next
// generation's workers find every old rank's state of that step in some machine's memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trireme::launch {

// One generation of the job as the keeper sees it.
struct KeeperGeneration {
  int generation = 0;
  std::vector<int> members;      // node ids (--node-rank) of this generation, ascending;
                                 // a member's index here is its machine index
  int position = 0;              // this node's index in members
  std::vector<int> local_ranks;  // global ranks of this node's workers in this generation
  std::string area;              // the node's snapshot area (TRIREME_SNAPSHOT_DIR)
  std::string store_host;        // the rendezvous store (for the agents' own Gloo group)
  int store_port = 0;
};

struct KeeperRecovery {
  int64_t step = 0;         // the protected step every machine of `next` can serve (0: none)
  bool rebuilt_all = true;  // every lost machine's protected state was rebuilt
  std::string message;      // one line for the log: what was rebuilt, or why not
};

class SnapshotKeeper {
 public:
  virtual ~SnapshotKeeper() = default;
  // Starts protecting snapshots for generation `g` (a background thread). Every member
  // calls it for the same generation.
  virtual void start(const KeeperGeneration& g) = 0;
  // Stops protecting: ends the round in flight (or abandons it when a peer is gone) and
  // joins the thread. What the last completed round protected stays. Idempotent.
  virtual void stop() = 0;
  // Called by every member of `next` that was a member of `previous` (the survivors),
  // after stop(): rebuilds the protected state of previous.members missing from
  // next.members on one survivor of each redundancy group, writing it as rank
  // directories under AREA/protected/<step>/. Members of `next` new to the job do not
  // call it. Never throws: a failure is reported in the result.
  virtual KeeperRecovery recover(const KeeperGeneration& previous, const KeeperGeneration& next) = 0;
  // Waits, with the rounds going on, until the newest step every local rank has a complete
  // snapshot of is protected (a machine leaving on a preemption notice, its workers done:
  // its last step must be rebuildable once it is gone). False after timeout_s, or when
  // protection has stopped.
  virtual bool flush(double timeout_s) = 0;
  // One line on what it did over the job (rounds, their cost, memory held), for the log
  // when the job ends; "" when it protected nothing.
  virtual std::string summary() const = 0;
};

}  // namespace trireme::launch
