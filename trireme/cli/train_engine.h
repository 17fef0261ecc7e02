// How one rank of `trireme train gpt` computes a step's gradients. train_worker.cpp owns
// the loop (data, learning rate, clipping, AdamW, metrics, timelines); an engine owns the
// model's layout on this rank:
//   data-parallel engine   the whole model, wrapped in DataParallel; micro-batches are
//                          gradient accumulation (no_sync on all but the last)
//   pipeline engine        this rank's stage (its layers only, parallel/pipeline/stage.h),
//                          run by StageExecutor through the schedule; the stage's
//                          gradients are all-reduced across its data-parallel group by
//                          DataParallel in explicit mode, each bucket launched as soon as
//                          its gradients are complete, overlapping the remaining backward
//                          work of the schedule
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trireme/cli/train_options.h"
#include "trireme/data/batch.h"
#include "trireme/dist/world.h"
#include "trireme/obs/clock.h"
#include "trireme/obs/json.h"
#include "trireme/obs/timeline.h"
#include "trireme/optim/clip.h"
#include "trireme/parallel/data/data_parallel.h"
#include "trireme/parallel/tensor/tensor_parallel.h"

namespace trireme::models {
class GptImpl;
}

namespace trireme::cli {

struct StepTimes {
  double forward_us = 0, backward_us = 0, optimizer_us = 0, snapshot_us = 0, checkpoint_us = 0, step_us = 0;
  double snapshot_writer_us = 0;  // CPU of the writer thread on the last snapshot it finished
};

// Converts steady-clock stamps to wall-clock ones, so the ranks' timelines line up.
struct ClockMap {
  double offset = obs::wall_us() - obs::now_us();
  double wall(double steady_us) const { return steady_us + offset; }
};

// What one step's trace goes into (null when the step is not traced).
struct StepTrace {
  obs::Timeline* timeline = nullptr;
  const ClockMap* clock = nullptr;
  int64_t step = 0;  // 1-based
};

class TrainEngine {
 public:
  virtual ~TrainEngine() = default;

  // The parameters this rank's optimizer updates.
  virtual std::vector<at::Tensor> parameters() = 0;
  // How this rank's gradients make up the model's, for the global gradient norm: the
  // groups that split the model and which parameters are replicas counted elsewhere.
  virtual optim::NormSharing gradient_norm_sharing() = 0;
  // Forward and backward of one step over this rank's micro-batches; on return the
  // gradients are averaged across data-parallel replicas. Returns this rank's part of the
  // loss: summed over all ranks and divided by dp, it is the global batch's mean loss
  // (under tensor parallelism only tensor-parallel rank 0 reports it).
  virtual double run_step(const std::vector<data::Batch>& micro_batches, StepTimes* times,
                          const StepTrace& trace) = 0;
  virtual const parallel::StepCommStats& comm() const = 0;
  // The DataParallel that reduces this rank's gradients (ZeRO shards along its buckets).
  virtual parallel::DataParallel& data_parallel() = 0;
  // This rank's parameters by whole-model name, and how each is split across the
  // tensor-parallel group (a name missing from the specs is replicated): what checkpoints
  // save and load.
  virtual std::vector<std::pair<std::string, at::Tensor>> named_parameters() = 0;
  // Sets the parameters to their seeded initial values: for an engine built `restoring`
  // (which leaves them to the restore) when the restore found nothing.
  virtual void initialize_parameters() = 0;
  virtual const std::map<std::string, tensor::ShardSpec>& shard_specs() const = 0;
  // The tensor-parallel dropout stream of this rank (null without tensor parallelism):
  // training state, saved and restored with the default generators.
  virtual std::shared_ptr<tensor::RngTracker> split_rng() const = 0;
  // The parameters this rank contributes to --dump-params, named as in the whole model
  // (empty on ranks whose copy another rank writes).
  virtual std::vector<std::pair<std::string, at::Tensor>> dump_parameters() = 0;
  // The whole model when this rank holds it (for the sample at the end), else null.
  virtual models::GptImpl* whole_model() = 0;
  // Adds facts about this rank to its entry in run.json (layers held, peak memory, ...).
  virtual void summarize(obs::JsonObject& out) const = 0;
  // One line for the start-up banner (rank 0), e.g. the stages' layers.
  virtual std::string describe() const = 0;
};

// This rank's tensor-parallel group (the mesh's tp axis), with its dropout RNG tracker
// for `device`'s generator.
tensor::TensorParallel tensor_parallel(const dist::MeshGroups& groups, uint64_t seed, at::Device device);

// NormSharing for `params` whose whole-model names are in `named` (any order): summed
// across the tensor-parallel group (when split) and `split_groups`; a parameter that
// `specs` says is replicated counts on tensor-parallel rank 0 only.
optim::NormSharing norm_sharing(const std::vector<at::Tensor>& params,
                                const std::vector<std::pair<std::string, at::Tensor>>& named,
                                const std::map<std::string, tensor::ShardSpec>& specs,
                                const tensor::TensorParallel& tp, std::vector<dist::Group> split_groups);

// The whole-model values of `named` (a collective over the tensor-parallel group: every
// rank of it must call). Empty unless `keep` (the rank that writes them).
std::vector<std::pair<std::string, at::Tensor>> gather_parameters(
    const std::vector<std::pair<std::string, at::Tensor>>& named,
    const std::map<std::string, tensor::ShardSpec>& specs, const tensor::TensorParallel& tp, bool keep);

// --emulate-slowdown: a rank with factor f waits (f - 1) x the time each piece of its
// compute took, so it keeps pace with a device f times slower. The time is compute only:
// the data-parallel forward and backward and the optimizer phase are measured in the
// thread's CPU time (their waits for collectives, set by the other ranks, are not a
// device's speed), a pipeline's F, B and W by their wall time (they hold no waits). The
// data-parallel backward's share is slept before it, by the previous backward's measure,
// so its gradient all-reduce starts as late as on a slower device. Emulation of a
// heterogeneous cluster on this machine's CPU ranks (the waiting rank leaves its core to
// the others, as a slower accelerator would not load the host either).
class EmulatedSlowdown {
 public:
  EmulatedSlowdown(const TrainOptions& options, int rank);
  double factor() const { return factor_; }
  void after(double seconds) const;

 private:
  double factor_ = 1;
};

// DataParallel's options from --bucket-mb and --first-bucket-mb. `restoring`: the caller
// restores the training state into every replica next, so the replicas' initial broadcast
// is skipped (it calls DataParallel::broadcast_initial_state() if nothing is restored).
parallel::DataParallelOptions data_parallel_options(const TrainOptions& options, bool restoring);

std::unique_ptr<TrainEngine> make_data_parallel_engine(const TrainOptions& options, dist::MeshGroups& groups,
                                                       at::Device device, bool restoring);
std::unique_ptr<TrainEngine> make_pipeline_engine(const TrainOptions& options, dist::World& world,
                                                  dist::MeshGroups& groups, at::Device device, bool restoring);

}  // namespace trireme::cli
