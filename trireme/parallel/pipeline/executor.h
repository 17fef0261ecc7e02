// StageExecutor: runs one pipeline stage's instructions (parallel/pipeline/schedule.h)
// with libtorch autograd and c10d point-to-point operations.
//
// A stage holds one model part per chunk (virtual stage = chunk * p + stage). For each
// micro-batch and chunk it keeps the part's input (a leaf that requires grad, when it came
// from the previous stage) and output, so that backward can run when the schedule says:
//   F          output = part(input); on the last virtual stage, output = loss / m
//   send-act   asynchronous send of the output to the next stage, waited for at the end of
//              the step after its own (so a stage holds at most two steps' sends)
//   recv-act   wait for the receive into a buffer of the agreed activation shape; every
//              receive is posted two steps ahead, so the transfer overlaps compute, and
//              waited for only when the F or B that consumes it comes (a step's receive
//              is often for a later compute: waiting at once would be a false dependency)
//   B          backward from the loss, or from the gradient received for the output
//   send-grad  asynchronous send of the input's gradient to the previous stage
//   recv-grad  receive the gradient of this part's output
//   reduce     the caller's data-parallel gradient reduction (StageCallbacks)
// Activation shape and dtype are agreed once per run (every activation between parts has
// the same shape: micro-batch x sequence x width for the GPT); every send is checked
// against them, and run()'s micro-batches against the micro-batch size, so that a part
// returning another shape or dtype is an InvalidArgument naming the stage and micro-batch
// rather than a receive that fails or hangs on the neighbour. For zb-h1, B runs with the
// linear layers' weight gradients deferred (deferred_linear.h) into the micro-batch's
// queue, and W runs that queue.
//
// Failures name the stage: a neighbour that died or timed out surfaces as a CommError
// "pipeline stage 0: receive of the activation of micro-batch 3 from stage 1 failed: ...".
// With recording on, run() keeps the start and end of every instruction it executed
// (steady-clock microseconds, obs/clock.h); a send ends when it is first seen complete
// (checked between instructions) or waited for, a receive when its data has arrived. The
// time of F, and of B and W, is summed on every run, recording or not.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
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
  std::vector<int64_t> shape;  // shape[0] is the micro-batch size
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
};

// What the executor calls back into (all optional).
struct StageCallbacks {
  // At the ReduceGradients instruction: the data-parallel reduction of this stage's
  // gradients (e.g. DataParallel::synchronize).
  std::function<void()> reduce_gradients;
  // After a W instruction accumulated into a parameter's gradient outside autograd
  // (e.g. DataParallel::gradient_accumulated).
  std::function<void(const at::Tensor&)> weight_grad_accumulated;
  // After each F, B or W instruction, with the seconds it took (e.g. to emulate a slower
  // device by waiting in proportion).
  std::function<void(const Instruction&, double seconds)> computed;
};

struct ExecutedInstruction {
  Instruction instruction;
  double start_us = 0, end_us = 0;  // steady clock
};

struct StageRunStats {
  std::vector<ExecutedInstruction> executed;  // only when recording
  double forward_us = 0, backward_us = 0;  // summed time of F, and of B and W (always)
  int peak_live_micro_batches = 0;  // forwarded and not yet backwarded (B), at most
  int peak_pending_sends = 0;       // sends issued and not yet waited for, at most
};

class StageExecutor {
 public:
  // parts[c] is this stage's chunk c. pp_group ranks are the stages (rank = stage).
  StageExecutor(ScheduleSpec spec, int stage, std::vector<PartForward> parts,
                LossFunction loss, ActivationSpec activation, dist::Group pp_group);

  // Runs every step of one optimizer step. micro_batches has spec.micro_batches entries
  // (only inputs are needed on the first stage and targets on the last), each of the
  // activation's micro-batch size. Returns the sum over micro-batches of loss / m on the
  // stage holding the last part, 0 elsewhere. Throws CommError naming this stage and the
  // neighbour when a neighbour fails or times out, and InvalidArgument naming this stage
  // and the micro-batch for a micro-batch or a sent tensor not of the agreed size, shape
  // or dtype.
  double run(const std::vector<MicroBatch>& micro_batches, const StageCallbacks& callbacks = {});

  // Keep the timing of every executed instruction in last_run() (off by default).
  void set_recording(bool on) { recording_ = on; }
  const StageRunStats& last_run() const { return stats_; }
  int stage() const { return stage_; }
  const ScheduleSpec& spec() const { return spec_; }

 private:
  struct Slot {
    at::Tensor input, output, output_grad;
    WeightGradQueue weight_grads;  // zb-h1: filled by B, run by W
  };
  struct PendingSend {
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor tensor;  // kept alive until the send completed
    std::string what;
    int record = -1;    // index into stats_.executed, or -1
    int64_t step = 0;   // the schedule step that issued it
  };
  void execute(const Instruction& instruction, const std::vector<MicroBatch>& micro_batches,
               const StageCallbacks& callbacks, double* loss_sum);
  // execute() with the instruction's span recorded, then completed sends retired.
  void timed_execute(const Instruction& instruction, const std::vector<MicroBatch>& micro_batches,
                     const StageCallbacks& callbacks, double* loss_sum);
  // Executes the receive instruction met earlier under this tag, if it is still awaited.
  void finish_receive(int receive_tag, const std::vector<MicroBatch>& micro_batches,
                      const StageCallbacks& callbacks, double* loss_sum);
  struct PostedReceive {
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor buffer;
  };
  // Receives are posted this many steps before the step that needs them.
  static constexpr size_t kReceiveLookahead = 2;
  // A send is waited for at the end of the step this many steps after its own: its transfer
  // overlaps two steps of compute, and a stage holds at most two steps' sends. No deadlock:
  // the matching receive is in the neighbour's same step (schedule.h), posted
  // kReceiveLookahead steps ahead, and within step k a stage waits only for receives of
  // steps <= k (sent first thing in their step) and for sends of steps < k; so once every
  // stage has finished the steps before k, every stage finishes step k.
  static constexpr int64_t kSendWaitLag = 1;
  void post_receives(size_t step);
  // The (source stage, tag) of a receive instruction; (-1, -1) for any other.
  std::pair<int, int> receive_source(const Instruction& instruction) const;
  // Waits for the posted receive of a RecvActivation or RecvGradient.
  at::Tensor receive(const Instruction& instruction);
  // Checks `tensor` against the agreed activation (shape and dtype), then sends it.
  void send(at::Tensor tensor, int to, int tag, const Instruction& instruction);
  // InvalidArgument for a micro-batch whose inputs (first stage) or targets (last stage)
  // are not of the activation's micro-batch size.
  void check_micro_batches(const std::vector<MicroBatch>& micro_batches) const;
  // "pipeline stage 0: receive of the activation of micro-batch 3 from stage 1".
  std::string exchange_text(const Instruction& instruction) const;
  // Releases the sends that are over, oldest first: those issued at or before step
  // `wait_through` are waited for, later ones only taken if already seen complete.
  void retire_sends(int64_t wait_through);
  int tag(int micro, int chunk, bool gradient) const;

  ScheduleSpec spec_;
  int stage_;
  std::vector<PartForward> parts_;
  LossFunction loss_;
  ActivationSpec activation_;
  dist::Group group_;
  std::vector<std::vector<Step>> schedule_;  // built once
  std::map<std::pair<int, int>, Slot> slots_;  // (micro, chunk)
  std::vector<PendingSend> sends_;  // in the order issued
  int64_t step_ = 0;                 // the step run() is executing
  std::map<int, PostedReceive> receives_;  // by tag
  std::map<int, Instruction> awaited_;     // receive instructions met, not yet waited for, by tag
  bool recording_ = false;
  StageRunStats stats_;
  int live_ = 0;
};

}  // namespace trireme::pipeline
