// A model's measured (or computed) costs: what the cost model scales to each device.
//
// `trireme profile gpt ... --out profile.json` writes one; `trireme plan` reads it. For
// paper-scale studies `analytic_profile` derives one from the model's FLOPs instead (stated
// as such in `source`).
//
// Terms:
//   layer          one entry of the model's pipeline layer list ("embeddings", "h.0", ...,
//                  "head"); contiguous layers make a pipeline stage
//   micro batch    sequences per forward pass (b); each timing row is for one b
//   F / B / W      forward; backward for the input gradient; backward for the weight
//                  gradient. A full backward costs B + W
//   activation     bytes a layer keeps alive from its forward until its backward (for one
//                  micro-batch of size b); the pipeline's peak memory multiplies these by
//                  the micro-batches a schedule keeps live
//   link           a point-to-point or all-reduce cost under the alpha-beta model:
//                  time(n bytes) = latency + n / bandwidth; all-reduce bandwidth is the
//                  "bus" bandwidth, so a ring over w ranks takes
//                  latency + 2 (w-1)/w * n / bandwidth
//
// Times are seconds on the profiling device (`device`, one thread per rank on CPU);
// `reference_tflops` is that device's throughput in the same unit the cluster file uses,
// so a device of throughput X runs a layer in time * reference_tflops / X.
// Pure: no libtorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trireme/models/gpt_config.h"

namespace trireme::plan {

struct LayerTiming {
  int64_t micro_batch = 1;        // b, sequences
  double forward_s = 0;           // F, median
  double backward_input_s = 0;    // B, median
  double backward_weight_s = 0;   // W, median
  int64_t activation_bytes = 0;   // kept for backward, one micro-batch of b sequences
  int64_t output_bytes = 0;       // the layer's output (what a stage boundary sends)
};

// A layer measured split over a tensor-parallel group of `tp` ranks (each rank's time,
// its tensor-parallel collectives included).
struct TensorParallelTimings {
  int tp = 2;
  std::vector<LayerTiming> timings;  // ascending micro_batch
};

struct LayerProfile {
  std::string name;                  // "embeddings", "h.0", ..., "head"
  int64_t parameters = 0;            // elements (at tp 1)
  // The trainer's optimizer phase over this layer's parameters, median: gradient norm and
  // clipping, the AdamW step, zeroing the gradients.
  double optimizer_s = 0;
  std::vector<LayerTiming> timings;  // ascending micro_batch, at least one row
  std::vector<TensorParallelTimings> tensor_parallel;  // optional, measured at tp > 1
};

// The whole model's forward and backward as training runs them (one autograd graph, no
// split of backward), per micro-batch size: what the layers' separately timed parts add
// up to in place. The cost model scales every layer's times by whole / sum of parts.
struct WholeModelTiming {
  int64_t micro_batch = 1;
  double forward_backward_s = 0;  // median
};

// One data-parallel training step of the whole model as `trireme train` runs it, measured
// over the profiling ranks: forward, backward with DataParallel's bucketed all-reduce
// overlapping it, the trainer's clipping and AdamW, and the closing scalar all-reduce. Where
// the cost model's sum of parts meets a real step: calibrate() (cost_model.h) turns these
// rows into Profile::calibration.
struct TrainingStepTiming {
  int64_t micro_batch = 1;
  double step_s = 0;       // median
  int data_parallel = 2;   // ranks in the step
};

// One pipeline training step as `trireme train --pp` runs it, over the profiling ranks as
// the stages: StageExecutor's 1F1B with point-to-point transfers, the trainer's clipping
// (norm summed over the stages) and AdamW on each stage, the closing all-reduce.
struct PipelineStepTiming {
  int64_t micro_batch = 1;
  int micro_batches = 4;
  int stages = 2;
  std::string split;  // "0:3,3:6", the layers of each stage
  double step_s = 0;  // median
};

// Compute in training over compute as profiled, for one measured step (see calibrate()).
struct CalibrationRow {
  int64_t micro_batch = 1;
  double factor = 1;
  bool pipeline = false;  // from a pipeline step (else a data-parallel one)
};

struct Link {
  double latency_s = 0;        // alpha
  double bandwidth_Bps = 0;    // 1 / beta, bytes per second
  double time(double bytes) const { return latency_s + bytes / bandwidth_Bps; }
};

// Bytes of state per parameter element: fp32 training keeps 4 + 4 + 8 (AdamW's two
// moments); mixed precision 2 + 2 + 12 (fp32 master copy and moments).
struct StateBytes {
  double param = 4;
  double grad = 4;
  double optimizer = 8;
};

struct Profile {
  int format = 1;
  std::string source = "measured";  // "measured" or "analytic: ..." (how it was made)
  std::string device = "cpu";       // what ran it, e.g. "cpu (1 thread per rank)", "A100"
  double reference_tflops = 1;      // the profiling device's throughput (see above)
  int threads = 1;                  // intra-op threads per rank while profiling
  models::GptConfig model;
  StateBytes state;
  Link p2p;        // one point-to-point send/recv pair, measured between two ranks
  Link allreduce;  // bus bandwidth, measured at `allreduce_world` ranks
  int allreduce_world = 2;
  // Share of a collective's time that hides under concurrent compute, measured: 1 when they
  // run on separate engines; on CPU the communication thread takes the core from the
  // compute, so less. Negative: not measured (the cost model then assumes 1).
  double overlap = -1;
  int repeats = 0;                   // measurements per median
  std::vector<LayerProfile> layers;  // the pipeline layer list, in order
  std::vector<WholeModelTiming> whole_model;  // optional, ascending micro_batch
  std::vector<TrainingStepTiming> training_step;  // optional, ascending micro_batch
  std::vector<PipelineStepTiming> pipeline_step;  // optional, ascending micro_batch
  // Not in the file: computed from training_step by calibrate() when the profile is loaded
  // for planning; empty (factor 1) until then. Each row's own factor, and the medians of
  // them, which the cost model applies at every micro-batch size (one step per size is a
  // noisy measurement; the median is robust to one that caught a burst of interference):
  // the data-parallel steps' to layouts without a pipeline, the pipeline steps' to
  // pipelines (each kind standing in for the other when only one was measured).
  std::vector<CalibrationRow> calibration;
  double calibration_factor = 1;
  double pipeline_calibration_factor = 1;
};

// Which part of a layer's work.
enum class Work { kForward, kBackwardInput, kBackwardWeight };

// Time of `work` for micro-batch size b: linear interpolation between the measured rows,
// linear extrapolation beyond them (through the origin when there is a single row).
double layer_time(const LayerProfile& layer, Work work, double micro_batch);
// Each layer's F + B + W at micro-batch b, in layer order: what pipeline stages are
// balanced by and what a step's compute adds up to.
std::vector<double> layer_costs(const Profile& profile, double micro_batch);
// The rows measured at tensor-parallel size tp, or null when tp was not measured.
const std::vector<LayerTiming>* tensor_parallel_rows(const LayerProfile& layer, int tp);
double rows_time(const std::vector<LayerTiming>& rows, Work work, double micro_batch);
// The whole model's measured forward and backward over the sum of its layers' F + B + W at
// micro-batch b (interpolated like the times); 1 when the profile has no whole-model rows.
double in_place_factor(const Profile& profile, double micro_batch);
// Median (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> values);
// The calibration factor the cost model applies to a layout with (or without) a pipeline
// (1 before calibrate()).
inline double training_factor(const Profile& profile, bool pipeline) {
  return pipeline ? profile.pipeline_calibration_factor : profile.calibration_factor;
}
// Activation (or output) bytes for micro-batch b, interpolated like the times.
double layer_activation_bytes(const LayerProfile& layer, double micro_batch);
double rows_activation_bytes(const std::vector<LayerTiming>& rows, double micro_batch);
double layer_output_bytes(const LayerProfile& layer, double micro_batch);

// JSON (see docs/design-notes.md "Planner"). parse_profile throws InvalidArgument naming
// the JSON path of the bad field, e.g. "profile.json: layers[3].timings[0].forward_s must
// be a positive number (got -1)". `origin` names the file in messages.
std::string to_json(const Profile& profile);
Profile parse_profile(const std::string& text, const std::string& origin);
Profile read_profile(const std::string& path);

// A profile computed from FLOPs, for models too big to run here: per block and sequence of
// T tokens, forward (8+4R)*T*C^2 (the matmuls) + 4*T^2*C (attention) FLOPs, B the matmuls
// again plus twice the attention, W the matmuls again; embeddings and head from their matmuls; activations 34*T*C bytes per block
// (Megatron's 16-bit estimate without the T^2 attention scores, which FlashAttention-style
// kernels do not keep); times at `tflops` x `utilisation` (the model FLOPs utilisation
// assumed on every device). Mixed-precision state bytes.
Profile analytic_profile(const models::GptConfig& model, const std::string& device,
                         double tflops, double utilisation);

}  // namespace trireme::plan
