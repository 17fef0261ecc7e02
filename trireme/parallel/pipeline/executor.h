// StageExecutor: runs one pipeline stage's instructions (parallel/pipeline/schedule.h)
// with libtorch autograd and c10d point-to-point operations.
//
// A stage holds one model part per chunk (virtual stage = chunk * p + stage). For each
// micro-batch and chunk it keeps the part's input (a leaf that requires grad, when it came
// from the previous stage) and output, so that backward can run when the schedule says:
//   F          output = part(input); on the last virtual stage, output = loss / m
//   send-act   asynchronous send of the output to the next stage (waited for at the end)
//   recv-act   receive into a buffer of the agreed activation shape (blocks in its step)
//   B          backward from the loss, or from the gradient received for the output
//   send-grad  asynchronous send of the input's gradient to the previous stage
//   recv-grad  receive the gradient of this part's output
//   reduce     the caller's data-parallel gradient reduction
// Activation shape and dtype are agreed once per run (every activation between parts has
// the same shape: micro-batch x sequence x width for the GPT). For zb-h1, B runs with the
// linear layers' weight gradients deferred (deferred_linear.h) into the micro-batch's
// queue, and W runs that queue.
#pragma once

#include <functional>
#include <map>
#include <vector>

#include "trireme/dist/backend.h"
#include "trireme/parallel/pipeline/deferred_linear.h"
#include "trireme/parallel/pipeline/schedule.h"

namespace trireme::pipeline {

// One model part: its forward (input -> output).
using PartForward = std::function<at::Tensor(const at::Tensor&)>;
// Loss of the last part's output for the micro-batch's targets.
using LossFunction = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& targets)>;

struct MicroBatch {
  at::Tensor inputs;   // used on virtual stage 0
  at::Tensor targets;  // used on the last virtual stage
};

struct ActivationSpec {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
};

class StageExecutor {
 public:
  // parts[c] is this stage's chunk c. pp_group ranks are the stages (rank = stage).
  StageExecutor(ScheduleSpec spec, int stage, std::vector<PartForward> parts,
                LossFunction loss, ActivationSpec activation, dist::Group pp_group);

  // Runs every step of one optimizer step. micro_batches has spec.micro_batches entries
  // (only inputs are needed on the first stage and targets on the last). Calls
  // reduce_gradients at the ReduceGradients instruction. Returns the sum over micro-batches
  // of loss / m on the stage holding the last part, 0 elsewhere. Throws CommError when a
  // neighbour fails or times out.
  double run(const std::vector<MicroBatch>& micro_batches,
             const std::function<void()>& reduce_gradients);

 private:
  struct Slot {
    at::Tensor input, output, output_grad;
    WeightGradQueue weight_grads;  // zb-h1: filled by B, run by W
  };
  void execute(const Instruction& instruction, const std::vector<MicroBatch>& micro_batches,
               const std::function<void()>& reduce_gradients, double* loss_sum);
  at::Tensor receive(int from, int tag);
  int tag(int micro, int chunk, bool gradient) const;

  ScheduleSpec spec_;
  int stage_;
  std::vector<PartForward> parts_;
  LossFunction loss_;
  ActivationSpec activation_;
  dist::Group group_;
  std::vector<std::vector<Step>> schedule_;  // built once
  std::map<std::pair<int, int>, Slot> slots_;  // (micro, chunk)
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>> sends_;
};

}  // namespace trireme::pipeline
