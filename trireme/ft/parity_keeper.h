// ParityKeeper: the node agent's SnapshotKeeper (launch/snapshot_keeper.h), which keeps
// the newest snapshot step of every machine rebuildable from the other machines' memory
// (issue 6, --redundancy K+M).
//
// Terms. The area is the node's snapshot area (AREA/rank-<R>/<step>/, ft/snapshot.h). A
// machine's newest common step is the newest step that every one of its local ranks has a
// complete snapshot of. Its protected copy of step S is AREA/protected/<S>/rank-<R>/
// {manifest.json,data.bin} for each local rank R; its blob is that copy serialized into
// one byte string less the slices that every machine of its redundancy group holds
// (replicas: ft/protected_blob.h), which is what ft/parity_exchange.h codes across
// machines. Under pure data parallelism that is nearly all of it.
//
// A round, on a background thread at SCHED_IDLE priority (it runs in the machine's idle
// moments; Gloo's threads, created from it, inherit that priority), over a Gloo group of
// the agents (rank = machine index) made for the generation:
//   1. wait until the newest common step is newer than the last step tried
//   2. agree on the round's step S, the oldest of the machines' newest: once every
//      machine has come to the round (a barrier through the store: a newest step read
//      before a wait for the others could be gone by its end), each puts its own under
//      the store and waits for the others' (stop() ends either wait)
//   3. take each local rank's AREA/rank-<R>/<S>/ into AREA/protected/.tmp-<S>/rank-<R>/
//      without copying its data: a shared flock on its data file, which a worker's
//      Snapshotter must lock exclusively before it reuses that slot (ft/snapshot.h, "Lent
//      slots"), a hard link to the file and a copy of the manifest. The snapshot is whole
//      when, the lock held, its manifest is still there, unchanged, and its directory still
//      names the locked file (a worker removes the manifest and renames the directory under
//      its lock before it writes); and list the keys of its slices
//   4. agree, the same way, that every copy is whole, and post the keys; where a copy
//      is not, every machine drops its copy and waits for a step newer than S
//   5. leave out of the blob the slices whose keys every machine of the group posted,
//      and exchange parity of the blobs (RedundancyPlan::make(machines, K, M)); once
//      agreed, no machine stops before it is done
//   6. agree that every exchange is done; then rename the copy to AREA/protected/<S>/,
//      remove older protected steps and let go of their files, keep the parity and the
//      locks.
// The agreements go through the store, not Gloo all-reduces: how long they wait depends
// on training, and a recv posted on a pair whose peer has already closed it waits out
// the group's timeout instead of failing, so a stopping machine would hold its peers for
// that long. Only the exchange itself is Gloo (point to point).
// A failure in a round (a peer gone: a Gloo error) ends the thread; what the last
// committed round protected stays. The round prints nothing; stats() tells.
//
// recover() runs on the caller's thread over a Gloo group of the survivors alone (rank =
// index among them, ascending node id): they agree on the protected step S (a machine's
// is 0 unless its parity was made for `previous`'s members); the survivors of each
// redundancy group that lost machines re-serialize their blobs from AREA/protected/<S>/
// and send their blocks to the group's lowest survivor, the rebuilder, which rebuilds the
// lost machines' blobs and writes their files under its AREA/protected/<S>/, the
// replicated slices filled from its own copy, every CRC verified. Rounds of a later generation protect only steps newer than S, so the
// rebuilt directories stay while the next workers resume from them.
//
// Memory per machine: the protected copy is the workers' own files, so what it costs is
// the slots each worker takes instead of the held ones (ft/snapshot.h: a fourth, and a
// fifth once a round has held a newer step while the older was still held; made slots
// stay), up to two snapshots of the machine's ranks on /dev/shm, what the copies cost at
// a round's peak before; plus m parity blocks of 1/k' of its group's largest blob each (k' =
// the group's size - m) in this process, for the life of the protection. During a round,
// for a moment, the blob and the exchange's buffers, about (2 + m) blobs more. (Until
// 2026-12-05 a round copied the files: 26 ms of CPU for 38 MiB, most of a round under
// data parallelism, whose blob is nearly empty.)
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trireme/launch/snapshot_keeper.h"

namespace trireme::ft {

// What a keeper has done; byte counts are this machine's.
struct KeeperStats {
  int64_t protected_step = 0;  // the step of the last committed round (0: none)
  int rounds = 0;              // rounds committed
  int skipped = 0;             // rounds dropped because a copy did not verify on some machine
  int64_t held_back_step = 0;  // the newest step seen here while the CPU share held a round back
  // Every committed round's copy (the files held and linked, the manifests copied) and
  // verification, and its serialization, parity exchange and commit barrier, in order.
  std::vector<double> round_copy_ms, round_exchange_ms;
  std::vector<double> round_cpu_ms;  // the keeper thread's CPU time per committed round (copy to commit)
  uint64_t copy_bytes = 0;     // the protected copy (files under AREA/protected/<step>/, held)
  uint64_t replicated_bytes = 0;  // of it, slices every machine of the group holds: not coded
  uint64_t parity_bytes = 0;   // parity blocks held in memory
  std::string error;           // why protection stopped before stop() ("" when it did not)
};

class ParityKeeper final : public launch::SnapshotKeeper {
 public:
  // k data and m parity blocks per codeword (--redundancy K+M); m = 0 holds snapshots in
  // AREA/protected/ but keeps no parity, so nothing lost can be rebuilt. `after_copy(dir)`
  // runs after a rank's snapshot DIR is taken, before it is checked (a test seam).
  // cpu_share (--redundancy-cpu): a round after the first starts no sooner than T /
  // cpu_share after the keeper's thread set up, T being that thread's CPU time since (rounds and polling;
  // not Gloo's own I/O threads); 0: no wait. flush() lifts it for the generation, on every
  // machine.
  ParityKeeper(int k, int m, double cpu_share = 0, std::function<void(const std::string&)> after_copy = {});
  ~ParityKeeper() override;  // stops
  ParityKeeper(const ParityKeeper&) = delete;
  ParityKeeper& operator=(const ParityKeeper&) = delete;

  // Stops the rounds of an earlier generation first. With fewer than K+M members nothing
  // is protected (one line on stderr, and stats().error, say so).
  void start(const launch::KeeperGeneration& g) override;
  void stop() override;
  launch::KeeperRecovery recover(const launch::KeeperGeneration& previous,
                                 const launch::KeeperGeneration& next) override;

  int64_t protected_step() const;
  KeeperStats stats() const;
  // One line on what the keeper did (rounds, median copy and exchange times, memory held).
  std::string summary() const override;
  bool flush(double timeout_s) override;

 private:
  struct Committed;  // the protected state: step, parity, what the blob holds

  void run(const launch::KeeperGeneration& g);
  launch::KeeperRecovery recover_or_throw(const launch::KeeperGeneration& previous,
                                          const launch::KeeperGeneration& next);

  const int k_, m_;
  const double cpu_share_;
  const std::function<void(const std::string&)> after_copy_;
  mutable std::mutex mutex_;             // guards committed_ and stats_
  std::unique_ptr<Committed> committed_;
  KeeperStats stats_;
  bool warned_ = false;                  // the line about too few machines was printed
  std::atomic<bool> stop_{false};
  std::atomic<bool> hurry_{false};  // flush(): rounds no longer wait for the CPU share
  std::mutex wake_mutex_;            // with wake_: stop() and flush() end a held-back wait
  std::condition_variable wake_;
  std::thread thread_;
  launch::KeeperGeneration current_;  // the generation last started
  int64_t floor_ = 0;       // this generation protects only steps newer than this (start())
  bool recovered_ = false;  // recover() ran since the last start()
};

}  // namespace trireme::ft
