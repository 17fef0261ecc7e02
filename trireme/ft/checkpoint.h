// Layout-independent, verified on-disk checkpoints.
//
// A checkpoint of step s is one directory, ROOT/<s>/:
//   rank-<r>.bin     what rank r wrote: a magic line ("TRIREME-CKPT-SHARD 1\n"), then the
//                    raw bytes of its slices, back to back (written by every rank at once)
//   manifest.json    written last, by rank 0, through a rename: the checkpoint exists only
//                    once it does. It holds the format name and version, the step, the
//                    layout that wrote it (mesh, dp, tp, pp, zero) and, for every tensor by
//                    its whole-model name, its dtype and whole shape and its slices: which
//                    file, byte offset and length, CRC-32, and which box (ft/box.h) of the
//                    whole tensor the bytes are (row-major).
// Slices are boxes of whole-model tensors, so a reader under any layout asks for the
// boxes it needs and reads only the slices that intersect them.
//
// Opening verifies the manifest (format, version, fields; its step is the directory's
// name, when that is a number; each slice's box lies inside its tensor, has as many bytes
// as elements times the element size, and overlaps no other slice of the tensor), that
// every file exists, starts with the magic line and is long enough (a truncated file), and
// optionally every slice's CRC (a flipped byte); any failure is a CheckpointCorrupt naming
// the file and the check. (The manifest has no checksum of its own: these checks are what
// keeps a damaged one from being read.)
// find_latest() walks the steps newest first and returns the first that verifies, so a
// damaged checkpoint falls back to the one before.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trireme/dist/world.h"
#include "trireme/ft/box.h"

namespace trireme::ft {

// Format of manifest.json; bumped on any incompatible change.
constexpr int kCheckpointVersion = 1;

// The layout that wrote a checkpoint (informational: any layout can read it).
struct CheckpointLayout {
  std::string mesh;
  int dp = 1, tp = 1, pp = 1, zero = 0;
  int rank = -1;  // the one rank whose own state this is (a snapshot); -1: the whole job
  // What was trained, as the flags that shape it (e.g. "--vocab 256 --seq 128 ..."): a
  // resume under other flags is refused. "" when not recorded (library use, older files).
  std::string model;
  // What it was trained on, e.g. "corpus of 4332554 bytes, CRC-32 9a3c0f12; --seed 1
  // --batch 16": a resume that reads other data is told that the batches from there on
  // are not those of the run it continues. "" when not recorded.
  std::string data;
};

// A box of a whole-model tensor that this rank writes. `data` has box.size's shape.
struct SavedPiece {
  std::string name;
  std::vector<int64_t> shape;  // of the whole tensor
  Box box;
  at::Tensor data;
};

// Whether checkpoints hold tensors of `dtype` (float32, float64, int64 and uint8).
bool checkpoint_dtype_supported(at::ScalarType dtype);
// Throws InvalidArgument unless the piece's data has as many elements as its box.
void check_piece(const SavedPiece& piece);
// A piece's bytes as written: its data contiguous on the host (a copy only where it is
// not already), checked against its box (check_piece).
at::Tensor host_data(const SavedPiece& piece);

// Writes step `step` under `root`: every rank its pieces, in parallel, then rank 0 the
// manifest (by rename) and removes all but the newest `keep` checkpoints. A collective
// over `world`. Throws CommError/Error on failure; a half-written checkpoint has no
// manifest and is never read.
void write_checkpoint(const std::string& root, int64_t step, const CheckpointLayout& layout,
                      const std::vector<SavedPiece>& pieces, dist::World& world, int keep);

// The same checkpoint, coordinated through the store alone (no process-group collective),
// so that it can run on a background thread while training goes on: each rank writes its
// file and publishes its slices under the store; rank 0 waits for every rank's and
// commits. `store` must be shared by the world's ranks (dist::World::store()).
void write_checkpoint_through_store(const std::string& root, int64_t step, const CheckpointLayout& layout,
                                    const std::vector<SavedPiece>& pieces, const dist::Store& store, int rank,
                                    int world_size, int keep);

// For writers that lay out a rank's file themselves (the reused shared-memory slots of
// ft/snapshot.h): the magic line a shard file starts with, and the commit of a one-rank
// checkpoint ROOT/<step> whose `file` already holds each piece's bytes at `offset`.
// Writes the manifest (by rename) and keeps the newest `keep` complete checkpoints.
struct PlacedPiece {
  const SavedPiece* piece = nullptr;
  uint64_t offset = 0, bytes = 0;
  uint32_t crc = 0;
};
std::string_view shard_magic();
void commit_local_checkpoint(const std::string& root, int64_t step, const CheckpointLayout& layout,
                             const std::string& file, const std::vector<PlacedPiece>& placed, int keep);

// The one writer of a checkpoint root: rank 0's checkpoint writer holds ROOT/.writer under
// an exclusive flock while it lives, so that two jobs (or two writers of one) given the
// same root do not commit over and prune each other's steps. The kernel releases it when
// the process dies: a killed job leaves no stale lock. Readers, retention and `checkpoint
// inspect` ignore the file (it is no step).
class WriterLock {
 public:
  // Creates `root` if needed and takes the lock, trying for up to `wait`. Throws
  // Unrecoverable naming the root when another writer holds it (a restart would meet it
  // again), Error when the file cannot be opened. `restarted`: this job's earlier
  // generation may be the holder (its rank 0 being killed, or on a lost machine whose lock
  // on a network file system lasts until its lease ends): then, past `wait`, one line says
  // so and the writer goes on without the lock rather than end a job that is recovering.
  explicit WriterLock(const std::string& root, std::chrono::milliseconds wait = std::chrono::milliseconds(0),
                      bool restarted = false);
  ~WriterLock();
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  int fd_ = -1;
};

// The steps under `root` that have a directory (complete or not), newest first.
std::vector<int64_t> checkpoint_steps(const std::string& root);

class Checkpoint {
 public:
  // Opens and verifies ROOT/<step> (the manifest and file lengths; with `verify_data`,
  // every slice's CRC too). Throws CheckpointCorrupt naming the file and the check.
  static Checkpoint open(const std::string& dir, bool verify_data);
  // The newest checkpoint under `root` that opens (with full verification); each one
  // skipped is described in *skipped ("DIR: reason"). nullopt when none.
  static std::optional<Checkpoint> find_latest(const std::string& root, std::vector<std::string>* skipped);

  const std::string& dir() const { return dir_; }
  int64_t step() const { return step_; }
  const CheckpointLayout& layout() const { return layout_; }
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  std::vector<int64_t> shape(const std::string& name) const;
  // The names of the tensors that start with `prefix`, in order.
  std::vector<std::string> names(const std::string& prefix) const;
  // The boxes of tensor `name` that the slices hold (empty when there is no such tensor).
  std::vector<Box> boxes(const std::string& name) const;
  // Whether the slices of tensor `name` cover box `want` (from the manifest; no data read).
  bool covers(const std::string& name, const Box& want) const;
  // Box `want` of tensor `name`, assembled from the slices that intersect it (each one's
  // CRC checked as it is read, unless open() verified every slice already: the files of a
  // committed checkpoint or snapshot do not change). Throws CheckpointCorrupt when the slices do not cover it,
  // InvalidArgument for an unknown tensor or a box outside it.
  at::Tensor read(const std::string& name, const Box& want) const;
  // The same, into `out` (of the box's shape; any dtype and device, converted). A slice
  // that is the whole box, read into a contiguous host tensor of its dtype, is copied and
  // checksummed in one pass (checksum.h): restoring a snapshot of the same layout is then
  // one copy of each tensor. On a CRC mismatch `out` may hold some of the damaged bytes.
  void read_into(const std::string& name, const Box& want, const at::Tensor& out) const;
  // Every slice the manifest lists, tensors in name order (for code that moves a
  // checkpoint's files whole, such as ft/parity_keeper.h).
  struct SliceRecord {
    std::string tensor, dtype, file;
    uint64_t offset = 0, bytes = 0;
    uint32_t crc = 0;
    Box box;
  };
  std::vector<SliceRecord> slices() const;
  // What `trireme checkpoint inspect` prints: step, layout, tensors with shapes, slice
  // counts and bytes.
  std::string describe() const;

 private:
  struct Slice {
    std::string file;
    uint64_t offset = 0, bytes = 0;
    uint32_t crc = 0;
    Box box;
  };
  struct Tensor {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<Slice> slices;
  };
  struct Mapping;  // a shard file mapped read-only, shared by the copies of this object
  // The slice's bytes in its file's mapping, after checking they are there (mapped_slice)
  // and, for read_slice, their CRC.
  const unsigned char* mapped_slice(const Slice& slice) const;
  const unsigned char* read_slice(const Slice& slice) const;
  [[noreturn]] void throw_crc_mismatch(const Slice& slice) const;

  std::string dir_;
  int64_t step_ = 0;
  CheckpointLayout layout_;
  std::map<std::string, Tensor> tensors_;
  mutable std::map<std::string, std::shared_ptr<const Mapping>> mapped_;  // by file name
  bool verified_ = false;  // every slice's CRC checked by open()
};

}  // namespace trireme::ft
