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
//   optimizer_s       one torch::optim::AdamW step over the layer's parameters, with the
//                     trainer's options, median of `repeats` after a warm-up step
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

// Raw samples of a link and their fit.
struct LinkMeasurement {
  std::vector<double> bytes;    // message sizes
  std::vector<double> seconds;  // median time of one operation, per size
  Link link;
};

// 4, 16, 64, ..., 16 MiB.
std::vector<int64_t> message_sizes();

// Ping-pong between ranks 0 and 1 of `group`; the other ranks only join its barriers. A
// collective: every rank of the group calls it. The result is meaningful on ranks 0 and 1.
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

// Median (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> values);

}  // namespace trireme::plan
