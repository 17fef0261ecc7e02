// In-memory snapshots: each rank copies its whole training state, every K steps, into the
// snapshot area its node agent owns in shared memory (TRIREME_SNAPSHOT_DIR, on /dev/shm),
// which outlives the worker processes. After a worker dies, the restarted workers resume
// from there in a fraction of the time a disk checkpoint takes.
//
// A snapshot is a one-rank checkpoint (ft/checkpoint.h): DIR/<step>/data.bin, then
// DIR/<step>/manifest.json by rename, so one that a crash interrupted has no manifest and
// the previous complete one is used. Three slots rotate, so two complete snapshots exist
// while the third is written; each has the magic line, format version, step, layout and a
// CRC-32 per tensor.
//
// The data files are slots that live as long as the Snapshotter: created, sized
// (fallocate, so a full /dev/shm is an error here, not a SIGBUS later) and mapped once,
// then reused. take() waits for the previous snapshot's commit, picks the slot holding the
// oldest snapshot, removes that snapshot's manifest, renames its directory to the new step
// and hands the copy of every tensor straight into the mapping to a thread at SCHED_IDLE
// priority: one pass over the state, no page allocation (a write() into a fresh tmpfs file
// costs ~3x the copy, nearly all of it page allocation). That thread runs in the step's
// idle moments (waits on communication) rather than taking the core from training. A
// parameter must not change before it has been copied: take() runs between the optimizer
// step and the next forward, and before_update(), before the next optimizer step, copies
// whatever the thread has not begun (at the training thread's priority, so a busy machine
// that starves the idle thread costs the step the copy, plus at most the one tensor the
// thread has begun). On the reference
// GPT under DP=2 the thread finishes first: the stall fell from 6-7 ms to 0.5 ms
// (docs/benchmarks.md). Each piece is checksummed as it is copied, a chunk at a time
// while it is in cache (ft/checksum.h). The manifest follows on the same thread; until it
// is written a snapshot is incomplete and the previous one serves.
//
// Lent slots. The node agent's keeper (ft/parity_keeper.h) protects a snapshot by holding
// its data file, not by copying it: it takes a shared flock(2) on DIR/<step>/data.bin and
// links the file into its own directory. Before it reuses a slot, take() takes an
// exclusive flock on the slot's file, without waiting, and holds it until the old
// snapshot's manifest is gone and its directory renamed; a slot it cannot lock is lent,
// and the oldest free one, or a new one, serves instead (at most kMaxSlots). So a held
// snapshot is never written, and the keeper, which checks the manifest once it holds the
// lock, never takes a slot that is being rewritten. Slots made stay (each keeps a complete
// snapshot): making one costs page allocation on the training thread, and the keeper
// holds one step nearly always and two while a round commits, so up to five per rank is
// the steady state, as much as three plus the two copies a round used to make at its
// peak. When there is no room for an extra slot (or all five are taken) the slot of the
// snapshot before the newest serves (the newest complete one stays); when the keeper
// holds that one too, take() skips the snapshot, with one line on stderr, rather than
// failing the job. (Until 2026-12-07 it skipped at once, and a rank that skipped every
// snapshot from then on held its node keeper's step, never let go.)
// State on a CUDA device is copied on a side stream (ft/host_copy.h) into slots that are
// page-locked once: take() queues the copies and returns without waiting for them, the
// writer thread waits for them before its checksums, and the training loop calls
// before_update() before its next optimizer step, which waits only if the copies are
// still running (a parameter must not change before its copy has read it).
//
// BackgroundWriter alone is for disk checkpoints: copy on the caller's thread (CUDA: into
// one page-locked buffer, on the side stream), write (and fsync) on its own thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "trireme/ft/checkpoint.h"
#include "trireme/ft/host_copy.h"

namespace trireme::ft {

// Writes on a thread of its own, one job in flight: the caller prepares a job's buffers,
// submits it, and the next take() first waits for it.
class BackgroundWriter {
 public:
  using WriteFn = std::function<void(int64_t step, const std::vector<SavedPiece>& pieces)>;
  // idle_priority: the thread runs under SCHED_IDLE, only when its core has nothing else
  // to run (a snapshot's checksums fill the waits of a step instead of delaying it).
  explicit BackgroundWriter(WriteFn write, bool idle_priority = false);
  virtual ~BackgroundWriter();
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // Copies `pieces` into host buffers kept from the last take and queues write(step,
  // copies). Returns the microseconds the caller was held (waiting for the previous
  // write plus the copy; CUDA state: plus queueing its copies).
  virtual double take(int64_t step, const std::vector<SavedPiece>& pieces);
  // Call before anything changes the state last taken (the next optimizer step): waits
  // for its copies if they are still running (a GPU's on the side stream; a Snapshotter's
  // host state on the writer thread), and returns the microseconds that took (part of the
  // snapshot's stall).
  double before_update();
  // Waits for the write in flight; throws the first write failure, if any.
  void wait();
  // CPU time the writer thread spent on the last write it finished (its share of the
  // copy, the checksums, the commit), in microseconds: what a snapshot costs the machine
  // beyond the caller's stall.
  double last_write_cpu_us() const { return last_write_cpu_us_.load(); }

 protected:
  HostCopy copies_;  // the last take's copies; the writer thread waits for them first

  // Queues write(step, pieces). `host_copy`, when given, runs first on the writer thread,
  // and before_update() runs it too: it must be safe to call from both at once, and return
  // only once all of its work is done, whoever did it.
  void submit(int64_t step, std::vector<SavedPiece> pieces, std::function<void()> host_copy = {});
  void drain() noexcept;  // waits for the write in flight, ignoring failures

 private:
  void run(bool idle_priority);
  void release_staging();  // unpins and drops the staging buffers

  WriteFn write_;
  std::mutex mutex_;
  std::condition_variable wake_;
  struct Job {
    int64_t step;
    std::vector<SavedPiece> pieces;
    std::function<void()> host_copy;
  };
  std::optional<Job> pending_;
  bool busy_ = false, stop_ = false;
  std::function<void()> copying_;  // the last job's host_copy, until the writer has run it
  std::string failure_;
  std::atomic<double> last_write_cpu_us_{0};
  std::vector<at::Tensor> staging_;  // host copies, reused from take to take
  at::Tensor device_staging_;        // one buffer holding the copies of device tensors
  bool staging_pinned_ = false;      // device_staging_ is page-locked
  std::thread thread_;
};

class Snapshotter : public BackgroundWriter {
 public:
  // dir: this rank's snapshot directory. `before_commit(step)` runs between a snapshot's
  // data and its manifest (a fault-injection seam for tests).
  Snapshotter(std::string dir, CheckpointLayout layout, std::function<void(int64_t)> before_commit = {});
  ~Snapshotter() override;

  // Waits for the previous snapshot's commit, copies `pieces` into the oldest slot and
  // queues its checksums and commit as step `step`. Returns the microseconds the caller
  // was held. Throws Error (no space in the snapshot area, a failed earlier commit).
  double take(int64_t step, const std::vector<SavedPiece>& pieces) override;

  // Whether the slots in use exist: a take() before that also creates (allocates) one,
  // and so does the first take() after the keeper holds a slot.
  bool slots_ready() const { return slots_.size() >= static_cast<size_t>(kSlots); }
  // Whether the last take() made a new slot (its page allocation is in that take's time:
  // a one-off, not what snapshots cost).
  bool made_slot() const { return made_slot_; }

  // Three slots in use: while one is being written (and, its copy done, checksummed), the
  // two before it are complete. Two complete ones are what recovery needs: ranks can be
  // one snapshot apart when a failure stops them (a rank's commit of S-1 still pending
  // while its peer, already past S-1, is copying S), and the ranks must share a complete
  // step. Up to two more while the keeper holds slots (its protected step, and the next
  // round's until that round commits).
  static constexpr int kSlots = 3;
  static constexpr int kMaxSlots = kSlots + 2;

  // The steps of this rank's complete snapshots under `dir`, newest first (each one's
  // manifest, magic line and lengths verified; slices' CRCs are checked when read).
  static std::vector<int64_t> complete_steps(const std::string& dir);

 private:
  struct Slot {
    std::string dir;  // DIR/<step> it holds now
    int64_t step = 0;
    unsigned char* base = nullptr;
    size_t bytes = 0;
    bool pinned = false;      // page-locked for device-to-host copies
    bool pin_tried = false;   // (tried once: a failure means pageable, synchronous copies)
  };
  // The slot for `step`; nullptr when it would be an extra one (ft: "Lent slots") that
  // cannot be had. Throws Error when one of the three cannot be made.
  Slot* claim(int64_t step, size_t bytes);
  static void release(Slot& slot);
  void commit(int64_t step, const std::vector<SavedPiece>& in_slot);

  std::string dir_;
  CheckpointLayout layout_;
  std::function<void(int64_t)> before_commit_;
  std::vector<Slot> slots_;  // reserved for kMaxSlots: a Slot& stays valid
  std::atomic<int> keep_{kSlots};  // snapshots the commit keeps: one per slot
  bool warned_full_ = false;       // the line about a skipped snapshot was printed
  bool made_slot_ = false;         // see made_slot()
  // The CRC of each piece of the snapshot in flight that take() copied and checksummed in
  // one pass (CPU, contiguous); the writer thread computes the others. Written by take()
  // only after the previous commit is done.
  std::vector<std::optional<uint32_t>> crcs_;
};

}  // namespace trireme::ft
