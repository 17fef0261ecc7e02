// In-memory snapshots: each rank copies its whole training state, every K steps, into the
// snapshot area its node agent owns in shared memory (TRIREME_SNAPSHOT_DIR, on /dev/shm),
// which outlives the worker processes. After a worker dies, the restarted workers resume
// from there in a fraction of the time a disk checkpoint takes.
//
// A snapshot is a checkpoint of one rank (ft/checkpoint.h, write_local_checkpoint): data
// file, then manifest by rename, so one that a crash interrupted has no manifest and the
// previous complete one is used; two are kept (double buffering), each with the magic
// line, format version, step, layout and a CRC-32 per tensor.
//
// take() copies the tensors synchronously (a parameter must not change before it has been
// copied: the next optimizer step would) into host buffers kept from the last snapshot, then hands them to a
// writer thread, so the training step waits only for the copy. A take() first waits for
// the previous write (at most one in flight). Write failures are reported by the next
// take() or by wait().
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

class Snapshotter : public BackgroundWriter {
 public:
  // dir: this rank's snapshot directory. `before_commit(step)` runs on the writer thread
  // between a snapshot's data and its manifest (a fault-injection seam for tests).
  Snapshotter(const std::string& dir, const CheckpointLayout& layout,
              std::function<void(int64_t)> before_commit = {});

  // The steps of this rank's complete snapshots under `dir`, newest first (each one's
  // manifest, magic line and lengths verified; slices' CRCs are checked when read).
  static std::vector<int64_t> complete_steps(const std::string& dir);
};

}  // namespace trireme::ft
