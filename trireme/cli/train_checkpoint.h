// Checkpoints of `trireme train gpt` (ft/checkpoint.h): what a rank saves and how it loads
// a checkpoint written under any layout.
//
// Saved, by whole-model name: every parameter ("param/NAME"), AdamW's exp_avg and
// exp_avg_sq ("exp_avg/NAME", "exp_avg_sq/NAME") and step ("step/NAME"), and each rank's
// CPU generator state ("rng/cpu/rank<R>"). The data position and the learning rate are
// functions of the step (data/sampler.h, optim/lr_schedule.h), so the step is all they
// need. Each tensor-parallel rank writes the boxes of its shards (replicated tensors: rank
// 0 only); the replicas of a data-parallel group share the work, replica (i mod dp)
// writing the i-th tensor; under ZeRO the pieces' state is first gathered per parameter.
//
// Snapshots (ft/snapshot.h) hold the same tensors, all of a rank's own in its own
// snapshot, so that every rank restores itself from its node's memory after a restart.
//
// Loading reads, for each of this rank's parameters, the boxes its shard covers under the
// current layout, whatever layout wrote them, and the same for the optimizer state
// (handed to the ZeRO pieces when --zero is on). Generator states are restored when the
// world size is the one that wrote them.
#pragma once

#include <torch/optim/adamw.h>

#include <cstdint>

#include "trireme/cli/train_engine.h"
#include "trireme/cli/train_options.h"
#include "trireme/dist/world.h"
#include "trireme/ft/snapshot.h"
#include "trireme/parallel/data/zero.h"

namespace trireme::cli {

struct TrainState {
  const TrainOptions& options;
  dist::World& world;
  dist::MeshGroups& groups;
  TrainEngine& engine;
  torch::optim::AdamW* adamw = nullptr;      // without --zero
  parallel::ZeroOptimizer* zero = nullptr;   // with --zero
};

// Writes the checkpoint of `steps_done` completed steps. A collective over the world.
void save_checkpoint(const TrainState& state, int64_t steps_done);

// Copies this rank's whole state into its in-memory snapshot (written in the background by
// `snapshotter`); returns the microseconds the step was held. Under ZeRO a collective over
// the data-parallel group (the pieces' state is gathered per parameter).
double take_snapshot(const TrainState& state, ft::Snapshotter& snapshotter, int64_t steps_done);

// After a restart: the newest step of which every rank has a complete snapshot in `dir`
// (this rank's snapshot directory), loaded; 0 when there is none. A collective.
int64_t load_snapshot(const TrainState& state, const std::string& dir);

// Loads the newest checkpoint under --checkpoint-dir that verifies (rank 0 chooses; any
// damaged newer one is reported on stderr and skipped) and returns its step, or 0 when
// there is none. A collective over the world. Throws InvalidArgument when the checkpoint
// is of a different model (a tensor missing or of another shape).
int64_t load_checkpoint(const TrainState& state);

}  // namespace trireme::cli
