// The cost model: predicted step time and memory per device of one training layout on one
// cluster, from a profile. Pure: no libtorch.
//
// A layout is what `trireme train` runs: dp x tp x pp ranks (mesh order tp-dp-pp, so
// rank = tp_rank + dp_rank*tp + stage*tp*dp), a pipeline schedule with m micro-batches of
// b sequences per replica (global batch = dp*m*b; or each replica its own b, the global
// batch m times their sum), v chunks per stage (interleaved), one
// contiguous layer split shared by every replica, a ZeRO stage, and the device each rank
// runs on (its cluster group and machine).
//
// Step time, as the runtime spends it:
//   1. pipeline makespan: every stage's F/B/W instructions, in the order the schedule
//      generator (parallel/pipeline/schedule.h) gives them, replayed as events: an
//      instruction starts when its stage is free and its input has arrived (the previous
//      virtual stage's F, or the next one's B, plus the point-to-point transfer of the
//      boundary activation). Compute times are the profile's per-layer times at b (scaled
//      by the profile's in-place factor: the whole model's forward and backward measured
//      as one step over the sum of its separately timed parts; and by its calibration
//      factor, see calibrate(), when it has one), divided
//      by the device's speed and, at tp > 1, the profile's times measured at that tp (its
//      collectives included) or else the tp=1 times divided by tp plus tp's all-reduces
//      (two (b,T,C) ones in each block's forward and two in its backward, one in the
//      embeddings' forward, the head's input gradient, the loss's two small ones; elements
//      as large as the embeddings' output's: 2 bytes in a 16-bit profile). Each
//      replica is replayed on its own devices at its own b (identical replicas once);
//      synchronous training waits for the slowest. pp 1 is the same replay with one
//      stage (m micro-batches of accumulation).
//   2. data-parallel gradient sync: the stage's gradients are cut into buckets (25 MiB,
//      the first 1 MiB, last layer first, as DataParallel does); a bucket is ready when the
//      last backward of the step has passed its layers, and buckets go out one after
//      another (a layer's gradient is ready once every replica's backward has passed it),
//      each an all-reduce (ZeRO 2: reduce-scatter) under the alpha-beta model:
//      ring 2(w-1) alpha + 2(w-1)/w n/B over the slowest link, or hierarchical (inside
//      machines, then across them) when that is faster. `overlap` is the fraction of
//      a bucket's time that runs beside compute (1: separate engines; less on CPU, where
//      Gloo's thread competes with the compute for the core); what does not overlap is
//      exposed.
//   3. optimizer phase over the stage's parameters (gradient norm, clipping, AdamW,
//      zeroing; 1/dp of them under ZeRO, then an all-gather of the updated parameters),
//      and the two scalar all-reduces every step ends with (gradient norm, loss).
// Step time = the slowest stage's (1) + exposed (2) + (3).
//
// Memory per device = parameters + gradients + optimizer state (ZeRO 1/2: /dp), all /tp,
// + the peak of live activation bytes in the same replay (a micro-batch's from its F
// to its B, or to its W under a split backward, whose W still needs the saved inputs).
// Gradients at the peak: a whole copy (they accumulate whole across micro-batches) and,
// with dp > 1, beside it DataParallel's gradient-sized bucket buffers (a second whole
// copy) or, under ZeRO 2, the 1/dp shards it keeps (its packed reduce-scatter buffer
// holds the whole copy until the end of backward): ZeRO 2 does not divide the peak by dp.
// Over the device's memory (less a reserve) the layout does not fit, and the estimate
// says why. Cross-machine traffic of the tp ranks' concurrent data-parallel groups shares
// the machines' network.
#pragma once

#include <string>
#include <vector>

#include "trireme/parallel/pipeline/partition.h"
#include "trireme/parallel/pipeline/schedule.h"
#include "trireme/plan/cluster.h"
#include "trireme/plan/profile.h"

namespace trireme::plan {

// Where a rank runs.
struct DeviceSlot {
  int group = 0;    // index into Cluster::groups
  int machine = 0;  // machine within the group
  int device = 0;   // device within the machine
};
inline bool same_machine(const DeviceSlot& a, const DeviceSlot& b) {
  return a.group == b.group && a.machine == b.machine;
}

// dp x tp x pp, multiplied in 64 bits: throws InvalidArgument when that is more ranks
// than an int holds (sizes read from files and flags are ints each, their product not).
int world_size(int dp, int tp, int pp);

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::kOneFOneB;  // pp > 1
  int chunks = 1;            // v
  int micro_batches = 1;     // m, per replica
  int micro_batch_size = 1;  // b, sequences
  // Per replica, when replicas take unequal shares of the batch (a replica on slower
  // devices takes fewer sequences): replica r's b. Empty: every replica's is
  // micro_batch_size.
  std::vector<int> replica_micro_batch_sizes;
  int zero = 0;
  std::vector<pipeline::LayerRange> split;  // pp*chunks parts, in virtual-stage order
  std::vector<DeviceSlot> ranks;            // dp*tp*pp, by rank

  int world() const { return world_size(dp, tp, pp); }
  int micro_batch_size_of(int replica) const {
    return replica_micro_batch_sizes.empty() ? micro_batch_size : replica_micro_batch_sizes[replica];
  }
  int64_t global_batch() const {
    int64_t per_step = 0;
    for (int r = 0; r < dp; ++r) per_step += micro_batch_size_of(r);
    return per_step * micro_batches;
  }
  int rank_of(int stage, int replica, int tp_rank) const { return tp_rank + replica * tp + stage * tp * dp; }
};

struct CostOptions {
  double bucket_mb = 25;
  double first_bucket_mb = 1;
  double overlap = 1.0;            // see (2) above; the profile's measurement when it has one
  double memory_reserve = 0.1;     // of device memory, kept for the framework
};

struct StageCost {
  double speed = 1;          // slowest device of the stage, relative to the profile's
  double compute_s = 0;      // F + B + W of the stage over the step (busy time)
  double pipeline_end_s = 0; // when its last instruction ends
  double sync_exposed_s = 0; // (2), exposed part
  double sync_total_s = 0;   // (2), all of it
  double optimizer_s = 0;    // (3), with ZeRO's all-gather
  double end_s = 0;          // every stage's pipeline end + exposed sync, closing, optimizer
  int peak_live = 0;
  double param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, activation_bytes = 0;
  double memory_bytes() const { return param_bytes + grad_bytes + optimizer_bytes + activation_bytes; }
  double device_memory_bytes = 0;  // the smallest device of the stage
};

struct Estimate {
  double step_s = 0;
  double makespan_s = 0;          // (1), the slowest stage
  double bubble_fraction = 0;     // idle share of (1), averaged over stages
  double p2p_s = 0;               // one boundary transfer (activation), for the table
  double tp_comm_s = 0;           // modelled tensor-parallel collectives per step, busiest stage
                                  // (0 when the profile measured the layers at this tp)
  std::vector<StageCost> stages;
  bool fits = true;
  std::string reason;             // why it does not fit (empty when it fits)
  double samples_per_s(int64_t global_batch) const { return step_s > 0 ? global_batch / step_s : 0; }
  double peak_memory_bytes() const;
};

// Throws InvalidArgument when the layout is malformed (sizes, split, ranks); a layout that
// only does not fit in memory returns fits = false with the reason.
Estimate estimate(const Profile& profile, const Cluster& cluster, const Layout& layout,
                  const CostOptions& options = {});

// Calibration from the profile's measured training steps (Profile::training_step, data
// parallel; Profile::pipeline_step, a 1F1B pipeline): for each row, the factor on every
// F/B/W time that makes this model's prediction of that very step (a local cluster of its
// ranks, its layout and micro-batch size) equal the measured time, found by a few
// fixed-point rounds (the exposed sync moves with the compute) and clamped to [0.25, 4];
// the cost model then applies the data-parallel rows' median to layouts without a pipeline
// and the pipeline rows' median to pipelines (one kind standing in for a missing other).
// Fills profile->calibration and the two factors (1 without rows). What it absorbs:
// compute that runs slower inside a training step than in the layers timed alone (on a
// CPU, Gloo's threads taking cores), which the overlap figure covers only in part.
void calibrate(Profile* profile, const CostOptions& options = {});

// Time of an all-reduce of `bytes` over the devices `members` (ring or hierarchical,
// whichever is faster), links from the cluster or, where it has none, from the profile.
// `sharing` collectives of this shape run at once on the same machines (the tp ranks'
// data-parallel groups), dividing the network between machines among them.
double allreduce_time(const Profile& profile, const Cluster& cluster,
                      const std::vector<DeviceSlot>& members, double bytes, int sharing = 1);
// Time of one point-to-point transfer of `bytes` between two devices, while `sharing`
// transfers (this one included) leave the sender's machine at once over its network link.
double p2p_time(const Profile& profile, const Cluster& cluster, const DeviceSlot& from,
                const DeviceSlot& to, double bytes, int sharing = 1);

// The pipeline replay alone, for tests and pictures: per stage and instruction kind,
// given durations; returns each stage's end time and fills the per-stage busy time and
// peak live micro-batches.
struct ReplayResult {
  std::vector<double> end_s;        // per stage
  std::vector<double> busy_s;       // per stage
  std::vector<int> peak_live;       // per stage
  std::vector<double> peak_activation_bytes;  // per stage
  // Per stage and chunk: when its last gradient-producing backward (W, or B with weights)
  // of the step started and ended (for bucket readiness).
  std::vector<std::vector<std::pair<double, double>>> last_backward;
  double makespan_s = 0;
};
struct InstructionTimes {
  // [stage][chunk]: seconds of F, of B (input gradient only, for split schedules), of W,
  // and of a full backward (B with weights).
  std::vector<std::vector<double>> forward, backward_input, backward_weight, backward_full;
  // [virtual stage]: seconds to send its output forward (activation) / its input gradient
  // back, to the neighbouring virtual stage.
  std::vector<double> send_forward, send_backward;
  // [stage][chunk]: bytes one live micro-batch keeps for backward (optional: empty means 0).
  std::vector<std::vector<double>> activation_bytes;
};
ReplayResult replay(const pipeline::ScheduleSpec& spec, const InstructionTimes& times);

}  // namespace trireme::plan
