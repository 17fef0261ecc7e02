// The measuring side of `trireme profile`: what one rank times to fill a plan::Profile
// (plan/profile.h). The command (cli/profile.cpp) runs it on every rank in step and writes
// the JSON.
//
// Layers: the reference GPT's pipeline layer list (GptImpl::layers()), with the model's
// linear layers in split-backward mode (parallel/pipeline/deferred_linear.h). For each
// layer and micro-batch size b, after one warm-up round, `repeats` rounds of
//   F  the layer's forward from its input; the head's includes the loss (cross-entropy
//      against random targets), since the last stage computes it
//   B  backward from the output (a fixed random gradient; the head's from the loss) inside
//      a DeferWeightGrads scope: the input gradient and the gradients that are never
//      deferred (LayerNorm, embedding tables)
//   W  the scope's queue run: the weight and bias gradients of the linear layers
// and the medians are kept. A round is one training step of the whole model at one b, its
// parts timed one by one: F of every layer in order, B of every layer in reverse, W of
// every layer. So caches are as warm or cold as in training, and a burst of interference
// from other processes spoils one sample of many figures rather than every sample of one.
// The rounds of one b run back to back, as training repeats one micro-batch size.
// The embeddings' input is token ids, which have no gradient:
// their B is the whole backward (into wte and wpe, which are not deferred) and W is 0.
// Each layer's input is the previous layers' output for the same random token ids (so
// values and shapes are those of training), fed in as a leaf that requires grad.
//
//   activation_bytes  bytes the layer's forward allocated that are still alive when it
//                     returns, while only what it hands on is kept (its output; for the
//                     head the loss): the tensors its autograd graph saved for backward
//                     plus its output, which the next layer saves as its input or a
//                     pipeline stage keeps until its backward. Its input is not counted
//                     (the previous layer counted it). Read from the counting CPU
//                     allocator (obs/memory.h), in a run after the timed ones.
//   output_bytes      bytes of the layer's output tensor
//   optimizer_s       the trainer's optimizer phase over the layer's parameters
//                     (cli/train_worker.cpp): optim::clip_grad_norm to norm 1.0 (one
//                     process: no norm sharing), one torch::optim::AdamW step with the
//                     trainer's options, zero_grad. Before each repeat (untimed) every
//                     parameter gets a fresh copy of a fixed random gradient, as backward
//                     leaves new gradients after zero_grad set them to none; its norm is far
//                     above 1, so the clip scales them, as early in training. Median of
//                     `repeats` after a warm-up (which allocates AdamW's moments).
//
// Tensor parallel (measure_tensor_parallel_layers): the same rounds and figures with the
// model built split over a tensor-parallel group (models::Gpt with a tensor::TensorParallel,
// Megatron-style: see parallel/tensor/tensor_parallel.h), every rank of the group running
// them in step; each rank's times include the layer's tensor-parallel collectives. The
// column- and row-parallel layers route through deferred_linear in split-backward mode
// as the plain ones do, so B is the input gradient with its all-reduce (the column-parallel
// layers' dX) and W the deferred weight gradients, which need no communication.
//
// Overlap (measure_overlap, Profile::overlap): how much of a collective's time hides under
// concurrent compute. Every rank of the group measures in step, a barrier before each part:
//   T_c     a compute job alone: `compute` (the command's: forward and full backward of one
//           block at the largest micro-batch) run k times, k chosen so T_c >= 40 ms
//   T_a     n sum all-reduces of 4 MiB fp32 tensors (a gradient bucket), issued back to back
//           as c10d work handles and then all waited for, alone; n chosen so T_a ~ T_c / 2
//   T_both  the same all-reduces issued, then the compute job on this thread while the
//           backend's threads run them, then waiting for the all-reduces
//   overlap = 1 - (T_both - T_c) / T_a, clamped to [0, 1]: the share of the communication
//           that did not add to the step (1: it hid entirely; 0: the two ran one after the
//           other). Defined for T_c >= T_a, which the choice of n ensures.
// T_c, T_a and T_both are medians over `repeats` rounds after a warm-up round (a round
// times the three in that order); k and n come from a calibration every rank agrees on
// (the largest of the ranks' single-job and single-all-reduce times).
//
// Links (alpha-beta, plan::Link): message sizes from 4 bytes to 16 MiB (x4 apart); each
// size's time is the median of single operations timed one by one, in `repeats` batches
// after a barrier (messages under 1 MiB several to a batch). Point-to-point is a
// ping-pong between ranks 0 and 1 (one-way time = round trip / 2); all-reduce (sum, fp32)
// runs over the whole group and is fitted against the bus bytes 2(w-1)/w * n. fit_link
// is least squares with each point weighted by 1/t (as if a time's noise grew with it):
// unweighted, the milliseconds of the largest messages decide the latency too; weighted by
// 1/t^2 (relative error), the many latency-bound sizes and the middle ones, which sit in
// cache and run faster than large messages do, pull the bandwidth up. On this 2-core
// machine 1/t kept the fit within a few percent at 16 MiB and ~20% at small sizes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trireme/dist/backend.h"
#include "trireme/models/gpt_config.h"
#include "trireme/parallel/tensor/tensor_parallel.h"
#include "trireme/plan/profile.h"

namespace trireme::plan {

struct LayerMeasureOptions {
  models::GptConfig model;
  std::vector<int64_t> micro_batches = {1, 2, 4, 8};  // ascending, distinct
  int repeats = 5;                                     // timed runs per median
  uint64_t seed = 1234;                                // model and inputs
  // Called before each timing round and each layer's optimizer steps: a barrier keeps
  // several ranks measuring in step, so that all cores are busy as in training. Optional.
  std::function<void()> in_step;
  // Progress: after each timing round (warm-ups included; `done` of `rounds`) with the
  // seconds since the first began, and with each layer's profile once it is complete.
  std::function<void(int done, int rounds, double seconds)> on_round;
  std::function<void(const LayerProfile&)> on_layer;
};

// Measures every layer of the reference GPT for options.model. Installs the counting CPU
// allocator (obs::CpuMemory) if it is not installed. Throws InvalidArgument for a bad
// model or an empty or non-ascending micro-batch list.
std::vector<LayerProfile> measure_layers(const LayerMeasureOptions& options);

// The whole model in place (Profile::whole_model): per micro-batch size, after a warm-up,
// `repeats` rounds of the loss over random tokens and one full backward (one autograd
// graph, backward not split), as a data-parallel or single-stage training step runs them,
// in_step before each round; medians. What the layers' separately timed parts miss
// (autograd's whole-graph bookkeeping, the allocator and caches of a whole step) shows as
// the ratio of this to their sum.
std::vector<WholeModelTiming> measure_whole_model(const LayerMeasureOptions& options);

// Data-parallel training steps (Profile::training_step): per micro-batch size, after a
// warm-up, `repeats` steps of the whole model as the trainer's data-parallel engine runs
// them over `group` — the loss, a full backward whose gradients DataParallel all-reduces in
// buckets as they complete (default buckets), the trainer's clipping and AdamW step,
// zero_grad, and the closing all-reduce of two scalars — in_step before each; medians. A
// collective: every rank of `group` calls it with the same options.
std::vector<TrainingStepTiming> measure_training_step(const LayerMeasureOptions& options,
                                                      const dist::Group& group);

// Pipeline training steps (Profile::pipeline_step): the ranks of `group` as the stages of
// the reference GPT split evenly by layer count, per micro-batch size `micro_batches`
// micro-batches through StageExecutor's 1F1B (point-to-point over `group`), then the
// trainer's clipping with the norm summed over the stages, AdamW and zero_grad on each
// stage, and the closing all-reduce of two scalars; in_step before each; medians after a
// warm-up. A collective, like measure_training_step.
std::vector<PipelineStepTiming> measure_pipeline_step(const LayerMeasureOptions& options,
                                                      const dist::Group& group, int micro_batches = 4);

// Each layer's timings with the model split over `tp` (see above), one entry per layer of
// the layer list: {tp.size, rows}. A collective: every rank of tp.group calls it with the
// same options (the same seed gives every rank the same inputs). on_layer is not called.
// Throws InvalidArgument as measure_layers does, and when the heads or the vocabulary are
// not divisible by tp.size or tp is not active.
std::vector<TensorParallelTimings> measure_tensor_parallel_layers(const LayerMeasureOptions& options,
                                                                  const tensor::TensorParallel& tp);

// Overlap of all-reduces with compute (see above); a collective over `group`.
struct OverlapMeasurement {
  double compute_s = 0;       // T_c, median
  double communication_s = 0; // T_a, median
  double both_s = 0;          // T_both, median
  int compute_runs = 0;       // k: calls of the compute job in T_c
  int allreduces = 0;         // n: all-reduces in T_a
  int64_t allreduce_bytes = 0;
  double overlap = 0;         // 1 - (T_both - T_c) / T_a, in [0, 1]
};
// `compute` must do the same work on every call (and no communication over `group`).
// in_step is not used: the measurement keeps the ranks in step with `group`'s barriers.
OverlapMeasurement measure_overlap(const dist::Group& group, const std::function<void()>& compute,
                                   int repeats);
// overlap from the three times, clamped to [0, 1]; 0 when communication_s is not positive.
double overlap_share(double compute_s, double communication_s, double both_s);
// The command's compute job: forward and full backward (not split) of one block of the
// reference GPT at micro-batch b, from a fixed random input and output gradient. The job
// owns its block; the block's gradients accumulate from call to call.
std::function<void()> block_step_job(const models::GptConfig& model, int64_t micro_batch, uint64_t seed);

// Raw samples of a link and their fit.
struct LinkMeasurement {
  std::vector<double> bytes;    // message sizes
  std::vector<double> seconds;  // median time of one operation, per size
  Link link;
};

// 4, 16, 64, ..., 16 MiB.
std::vector<int64_t> message_sizes();

// Ping-pong between ranks 0 and 1 of `group`; the other ranks only join its barriers. A
// collective: every rank of the group calls it. The result is meaningful on ranks 0 and 1
// (elsewhere the link is left at its zero default).
LinkMeasurement measure_p2p(const dist::Group& group, const std::vector<int64_t>& sizes,
                            int repeats);
// Sum all-reduce of fp32 tensors over `group`; a collective. Fitted against bus bytes.
LinkMeasurement measure_allreduce(const dist::Group& group, const std::vector<int64_t>& sizes,
                                  int repeats);

// time = latency + bytes / bandwidth, least squares weighted by 1/time. When the fit gives
// a negative latency, the latency is 0 and the bandwidth is refitted through the origin.
// Throws InvalidArgument with fewer than two sizes or times that do not grow with size.
Link fit_link(const std::vector<double>& bytes, const std::vector<double>& seconds);

// Achieved fp32 matmul throughput of this process (512x512x512, at the current intra-op
// thread count), in TFLOPS: median of `repeats` after a warm-up. in_step as above.
double measure_matmul_tflops(int repeats, const std::function<void()>& in_step = {});

}  // namespace trireme::plan
