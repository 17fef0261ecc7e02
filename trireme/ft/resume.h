// Saving and restoring one rank's training state: checkpoints on disk (ft/checkpoint.h),
// snapshots in the node agent's memory (ft/snapshot.h), and Resumable, which gives a
// data-parallel program both in a few lines.
//
// Saved, by whole-model name: every parameter ("param/NAME"), AdamW's exp_avg and
// exp_avg_sq ("exp_avg/NAME", "exp_avg_sq/NAME") and step ("step/NAME"), each rank's
// module buffers ("buffer/rank<R>/NAME": running statistics and the like, which
// data-parallel replicas need not share, since DataParallel broadcasts them only at the
// start) and each rank's generator states: the CPU's ("rng/cpu/rank<R>") and, when its
// parameters are on a GPU, that GPU's ("rng/cuda/rank<R>"), and the layout of its
// gradient buckets ("buckets/rank<R>", DataParallel::bucket_state: with 3 or more
// replicas it decides the order of the all-reduce's sums). A sampler that is a function
// of the step (data/sampler.h) and a learning-rate schedule of the step need nothing more.
//
// In a checkpoint each tensor-parallel rank writes the boxes of its shards (replicated
// tensors: rank 0 only) and the replicas of a data-parallel group share the work, each
// writing a share of the tensors about equal in bytes; under ZeRO the pieces' state is first gathered per
// parameter. A snapshot holds all of a rank's own state, so that every rank can restore
// itself from its own node's memory; under ZeRO that is its own pieces' state
// (boxes of each flattened parameter, "zero/exp_avg/NAME"), 1/d of the whole, taken
// without communication. With TrainingState::share_snapshots (no ZeRO, dp > 1) the
// replicas of a data-parallel group share a snapshot as REFT does: each holds the state of
// its share of the tensors, about 1/dp of the bytes (and its own generators and a
// "share/dp" marker); load_snapshot() then has each replica read its share and the
// others' from its node's memory, and broadcast a share some replica's node lacks.
//
// Loading reads, for each of this rank's parameters, the boxes its shard covers under the
// current layout, whatever layout wrote them, and the same for the optimizer state
// (handed to the ZeRO pieces when there are some). Generator states are restored when the
// mesh is the one that wrote them; buffers are this rank's own under that mesh, and else
// the lowest rank's that the checkpoint holds (any replica's statistics serve, as
// DataParallel's initial broadcast of rank 0's does).
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trireme/dist/world.h"
#include "trireme/ft/checkpoint.h"
#include "trireme/ft/snapshot.h"
#include "trireme/parallel/data/zero.h"
#include "trireme/parallel/tensor/tensor_parallel.h"

namespace trireme::ft {

// One rank's training state as checkpoints see it.
struct TrainingState {
  dist::World* world = nullptr;
  // This rank's parameters by whole-model name, and how each is split across the
  // tensor-parallel group (a name missing from specs is replicated).
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  std::map<std::string, tensor::ShardSpec> specs;
  // This rank's module buffers by whole-model name, whole on every rank (not split by
  // tensor parallelism), saved and restored per rank (see above).
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  int tp = 1, tp_rank = 0, dp = 1, dp_rank = 0;
  // The data-parallel group (its ranks hold the same state); null: the world's group,
  // which it must then be (dp == world size).
  dist::Group dp_group;
  // The tensor-parallel dropout stream (null: none), saved beside the default generators.
  std::shared_ptr<tensor::RngTracker> split_rng;
  // The data-parallel wrapper whose bucket layout is saved beside the generators (null:
  // none; see DataParallel::bucket_state) and restored with them on the same mesh.
  parallel::DataParallel* data_parallel = nullptr;
  torch::optim::AdamW* adamw = nullptr;     // AdamW over the parameters, or
  parallel::ZeroOptimizer* zero = nullptr;  // ZeRO's, over its DataParallel's parameters
  CheckpointLayout layout;
  // Snapshots shared by the data-parallel group (see above; ignored under ZeRO, whose
  // snapshots are shares already, and when dp is 1). Not for elastic jobs:
  // load_from_memory() needs a node to hold whole replicas.
  bool share_snapshots = false;
};

// Writes the checkpoint of `steps_done` steps under `root`, keeping the newest `keep`.
// A collective over the world.
void save_checkpoint(const TrainingState& state, const std::string& root, int64_t steps_done, int keep);
// The same, written by `writer` in the background (write_checkpoint_through_store): the
// caller is held only for the copy (and, under ZeRO, the optimizer-state gather). Returns
// the microseconds it was held.
double save_checkpoint_async(const TrainingState& state, BackgroundWriter& writer, int64_t steps_done);
// A BackgroundWriter that writes the checkpoints of `state` under `root`, keeping `keep`.
// `before_write(step)`, if given, runs on its thread before this rank writes `step` (the
// checkpoint commits only once every rank has written).
std::unique_ptr<BackgroundWriter> checkpoint_writer(const TrainingState& state, const std::string& root, int keep,
                                                    std::function<void(int64_t)> before_write = {});
// Starts the copy of this rank's state into its snapshot (written in the background);
// returns the microseconds the caller was held. No communication (under ZeRO too). The
// copy of CPU tensors may still run after it returns: the caller must call
// snapshotter.before_update() before it next changes the parameters or optimizer state
// (the next optimizer step), or the snapshot is torn while its checksums still pass. The
// module buffers, which a forward pass may change, are copied before it returns.
double take_snapshot(const TrainingState& state, Snapshotter& snapshotter, int64_t steps_done);
// Loads the newest checkpoint under `root` that verifies (rank 0 chooses; damaged newer
// ones are named on stderr) and returns its step, or 0 when there is none. A collective.
// Throws InvalidArgument when the checkpoint is of another model; says on stderr (rank 0)
// when it was trained on other data (CheckpointLayout::data).
int64_t load_checkpoint(const TrainingState& state, const std::string& root);
// After a restart, before the in-memory snapshots are read: the newest step they could
// restore (an upper bound; load_snapshot() and load_from_memory() may settle for an older
// one), 0 when they hold none. `elastic`: any rank's snapshot in this node's `area` serves
// (load_from_memory); else each rank's own, AREA/rank-<R> (load_snapshot). A collective.
int64_t memory_step_bound(const TrainingState& state, const std::string& area, bool elastic);
// After a restart whose snapshots hold at most step `in_memory` (memory_step_bound): loads
// the newest checkpoint under `root` above that step which verifies, and returns its step;
// else loads nothing, returns 0 and sets *floor to the newest step at or below it whose
// checkpoint's manifest opens (the snapshots must not resume before it; on a tie they
// serve, being faster to read). Rank 0 decides, as in load_checkpoint(). A collective.
// Without it a restart resumed from an older snapshot, redid the checkpoint's steps and
// rewrote it in place (its manifest removed first), with no good checkpoint meanwhile.
int64_t load_newer_checkpoint(const TrainingState& state, const std::string& root, int64_t in_memory, int64_t* floor);
// After a restart: loads the newest step of which every rank has a complete snapshot
// (`dir`: this rank's) and returns it, or 0 when there is none. A collective. Snapshots
// shared by the data-parallel group are restored together (a broadcast per replica);
// `shared`, when given, says whether they were.
// `at_least`: a step below it is not loaded (0 is returned): a newer checkpoint serves.
int64_t load_snapshot(const TrainingState& state, const std::string& dir, bool* shared = nullptr,
                      int64_t at_least = 0);
// After a restart that changed the job's membership (an elastic job lost or gained
// machines, so the layout may be another): loads the newest step whose state this
// rank's data-parallel group can find in its nodes' memory, and returns it (0: none, a
// disk checkpoint must serve). Sources are every complete snapshot in this node's area
// (`area`, TRIREME_SNAPSHOT_DIR): each rank directory's, whatever rank wrote it, and the
// copies the agents protected across machines (AREA/protected/<step>/rank-*/, including
// those rebuilt from parity after a machine was lost; launch/snapshot_keeper.h). Each
// rank reads the boxes its shards need from the sources that hold them, its own rank's
// first; a rank whose node holds none gets its state from a replica in its data-parallel
// group that found all of it (a broadcast). Under ZeRO (any layout that keeps tp and pp)
// every old rank's pieces of the optimizer state must be in some node's memory (its own,
// or rebuilt from parity): each old rank's pieces are read by one rank and broadcast, the
// ranks of the same stage and tensor-parallel rank assemble their parameters' whole state
// from them, and the new layout's pieces then take theirs. The generator state is restored when
// every rank finds its own snapshot of the same mesh (on all ranks or none: tensor-parallel
// peers must draw equal replicated dropout masks). When every rank finds its own
// snapshots of the same mesh (the membership did not change), the newest step they all
// hold is chosen before any newer one, and the bucket layout is restored too: the run then
// goes on bit for bit, as load_snapshot's does.
// A collective. `from` names what served, for the log. `at_least` as in load_snapshot().
int64_t load_from_memory(const TrainingState& state, const std::string& area, std::string* from,
                         int64_t at_least = 0);
// This rank's snapshot directory in the area the agent gives its workers
// (TRIREME_SNAPSHOT_DIR), or "" when not launched by `trireme run`.
std::string snapshot_dir_from_env(int rank);
// The snapshot area itself (TRIREME_SNAPSHOT_DIR), or "".
std::string snapshot_area_from_env();
// The snapshot area where every node of the job has one, else "" on every rank (one
// all-reduce over s.world): a node whose agent could make none (its shared memory not
// writable) would otherwise skip the resume collectives the others call, and not snapshot
// when they do. Rank 0 says so on stderr when some nodes have one and others not.
std::string snapshot_area_on_every_node(const TrainingState& s);
// Whether the launcher runs an elastic job (TRIREME_ELASTIC=1: --nnodes MIN:MAX), whose
// world size may change between generations.
bool elastic_from_env();
// The snapshot interval for a request of `requested` steps (-1: every step when the
// launcher allows restarts, TORCHELASTIC_MAX_RESTARTS > 0, and gives a snapshot area;
// else none). Throws InvalidArgument when snapshots are asked for without an area.
int64_t snapshot_interval(int64_t requested, const std::string& snapshot_dir);

struct ResumableOptions {
  std::string checkpoint_dir;     // empty: no disk checkpoints
  int64_t checkpoint_every = 0;   // steps between checkpoints (0: never)
  int keep_checkpoints = 3;
  // Steps between in-memory snapshots; -1: every step when the launcher allows restarts
  // (TORCHELASTIC_MAX_RESTARTS > 0) and gives a snapshot area, else none.
  int64_t snapshot_every = -1;
  // The ranks share each snapshot, each copying 1/world size of the state (not in an
  // elastic job, where they stay whole; see TrainingState::share_snapshots).
  bool share_snapshots = true;
  // The DataParallel wrapping the model, if any: its bucket layout is then saved too, which
  // a bit-for-bit resume with 3 or more ranks needs (TrainingState::data_parallel).
  parallel::DataParallel* data_parallel = nullptr;
};

// Fault tolerance for a data-parallel program (every rank holds the whole model):
//
//   trireme::ft::Resumable resumable(world, *model, optimizer, {"ckpt", 100});
//   for (int64_t step = resumable.resume(); step < steps; ++step) {
//     ... forward, backward, optimizer.step() ...
//     resumable.step_done(step + 1);
//   }
//   resumable.wait();  // the last checkpoint is written, or its failure thrown
//
// Saved: the model's parameters and buffers (each rank its own: running statistics need
// not agree across replicas), AdamW's state and the generators. A write that fails in the
// background is thrown by the next step_done() or by wait(); the destructor waits for the
// writes in flight but cannot report their failure, so call wait() after the last step.
//
// Under `trireme run --max-restarts R`, a killed worker makes the agent restart all of
// them, and resume() then returns the step of the newest in-memory snapshot, bit for bit.
// In an elastic job (`--nnodes MIN:MAX`) the world size may change between generations:
// resume() then reads the state from whatever snapshots the node's memory holds
// (load_from_memory); the program must split its global batch over world.size().
class Resumable {
 public:
  // Throws InvalidArgument, before anything is written, for what it cannot save (a
  // parameter that is not float32 or float64, a buffer of a dtype checkpoints do not
  // hold, AMSGrad: its max_exp_avg_sq is not saved) and for options that make no sense
  // (keep_checkpoints < 1, checkpoint_every < 0 or > 0 without a checkpoint_dir,
  // snapshot_every < -1).
  Resumable(dist::World& world, torch::nn::Module& model, torch::optim::AdamW& optimizer,
            ResumableOptions options = {});
  // Waits for the writes in flight; their failures are lost (call wait() to see them).
  ~Resumable();
  Resumable(Resumable&&) = default;
  Resumable& operator=(Resumable&&) = default;
  // The step to continue from: after a restart the newest snapshot all ranks hold, unless
  // checkpoint_dir holds a newer good checkpoint; else (or if none) the newest good
  // checkpoint in checkpoint_dir, else 0. A collective.
  int64_t resume();
  // Snapshots and checkpoints the state after `steps_done` steps, when due. A collective.
  // Throws InvalidArgument unless steps_done is above the last step done or resumed at
  // (a step taken again would rewrite the snapshot holding it); throws the failure of an
  // earlier background write.
  void step_done(int64_t steps_done);
  // Waits for the snapshot and checkpoint being written; throws the first failure of a
  // background write.
  void wait();

 private:
  TrainingState state_;
  ResumableOptions options_;
  std::string area_;          // snapshot_area_on_every_node
  std::string snapshot_dir_;  // this rank's in area_, or ""
  int64_t snapshot_every_ = 0;
  int64_t last_step_ = 0;  // the last step done or resumed at
  std::unique_ptr<Snapshotter> snapshotter_;
  std::unique_ptr<BackgroundWriter> checkpointer_;
};

}  // namespace trireme::ft
