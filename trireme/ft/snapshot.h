// In-memory snapshots: each rank copies its whole training state, every K steps, into the
// snapshot area its node agent owns in shared memory (TRIREME_SNAPSHOT_DIR, on /dev/shm),
// which outlives the worker processes. After a worker dies, the restarted workers resume
// from there in a fraction of the time a disk checkpoint takes.
//
// A snapshot is a one-rank checkpoint (ft/checkpoint.h): DIR/<step>/data.bin, then
// DIR/<step>/manifest.json by rename, so one that a crash interrupted has no manifest and
// the previous complete one is used. Two are kept (double buffering), each with the magic
// line, format version, step, layout and a CRC-32 per tensor.
//
// The two data files are slots that live as long as the Snapshotter: created, sized
// (fallocate, so a full /dev/shm is an error here, not a SIGBUS later) and mapped once,
// then reused. take() picks the slot holding the older snapshot, removes that snapshot's
// manifest, renames its directory to the new step, copies every tensor straight into the
// mapping (checksumming each block while it is in cache, ft/checksum.h) and commits the
// manifest. That is one pass over the state and no page allocation per snapshot: a write()
// into a fresh tmpfs file costs ~3x the copy, almost all of it page allocation, and a
// writer thread doing it competes with training for the cores (docs/design-notes.md).
// A parameter must not change before it has been copied, so take() runs between the
// optimizer step and the next forward and returns when the snapshot is committed.
//
// BackgroundWriter is for disk checkpoints: copy on the caller's thread, write (and fsync)
// on its own thread, one write in flight.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "trireme/ft/checkpoint.h"

namespace trireme::ft {

// Copies tensors on the caller's thread and writes them on its own, one write in flight.
class BackgroundWriter {
 public:
  using WriteFn = std::function<void(int64_t step, const std::vector<SavedPiece>& pieces)>;
  explicit BackgroundWriter(WriteFn write);
  virtual ~BackgroundWriter();
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // Copies `pieces` and queues write(step, copies). Returns the microseconds the caller
  // was held (waiting for the previous write plus the copy).
  double take(int64_t step, const std::vector<SavedPiece>& pieces);
  // Waits for the write in flight; throws the first write failure, if any.
  void wait();

 private:
  void run();

  WriteFn write_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::optional<std::pair<int64_t, std::vector<SavedPiece>>> pending_;
  bool busy_ = false, stop_ = false;
  std::string failure_;
  std::vector<at::Tensor> staging_;  // host copies, reused from take to take
  std::thread thread_;
};

class Snapshotter {
 public:
  // dir: this rank's snapshot directory. `before_commit(step)` runs between a snapshot's
  // data and its manifest (a fault-injection seam for tests).
  Snapshotter(std::string dir, CheckpointLayout layout, std::function<void(int64_t)> before_commit = {});
  ~Snapshotter();
  Snapshotter(const Snapshotter&) = delete;
  Snapshotter& operator=(const Snapshotter&) = delete;

  // Copies `pieces` into the older slot and commits it as step `step`. Returns the
  // microseconds it took. Throws Error (e.g. no space in the snapshot area).
  double take(int64_t step, const std::vector<SavedPiece>& pieces);

  // The steps of this rank's complete snapshots under `dir`, newest first (each one's
  // manifest, magic line and lengths verified; slices' CRCs are checked when read).
  static std::vector<int64_t> complete_steps(const std::string& dir);

 private:
  struct Slot {
    std::string dir;  // DIR/<step> it holds now
    unsigned char* base = nullptr;
    size_t bytes = 0;
  };
  Slot& claim(int64_t step, size_t bytes);
  static void release(Slot& slot);

  std::string dir_;
  CheckpointLayout layout_;
  std::function<void(int64_t)> before_commit_;
  Slot slots_[2];
  int next_ = 0;
};

}  // namespace trireme::ft
