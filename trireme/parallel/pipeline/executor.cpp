// StageExecutor; see parallel/pipeline/executor.h.
#include "trireme/parallel/pipeline/executor.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "trireme/common/error.h"
#include "trireme/obs/clock.h"

namespace trireme::pipeline {

StageExecutor::StageExecutor(ScheduleSpec spec, int stage, std::vector<PartForward> parts,
                             LossFunction loss, ActivationSpec activation, dist::Group pp_group)
    : spec_(spec),
      stage_(stage),
      parts_(std::move(parts)),
      loss_(std::move(loss)),
      activation_(std::move(activation)),
      group_(std::move(pp_group)),
      schedule_(build_schedule(spec)) {
  TRIREME_CHECK(stage_ >= 0 && stage_ < spec_.stages, "pipeline stage ", stage_, " is not one of the schedule's ",
                spec_.stages, " stages (0 to ", spec_.stages - 1, ")");
  TRIREME_CHECK(group_ || spec_.stages == 1, "a pipeline of ", spec_.stages,
                " stages needs a process group for its stage exchanges");
  TRIREME_CHECK(static_cast<int>(parts_.size()) == spec_.chunks, "stage ", stage_, " has ",
                parts_.size(), " model parts but the schedule uses ", spec_.chunks, " chunks");
  TRIREME_CHECK(spec_.stages > 1 || spec_.chunks == 1,
                "--chunks needs at least two pipeline stages (--pp 2 or more)");
  // Receives are posted ahead of the sends before them and matched by tag (Gloo); NCCL's
  // point-to-point has no tags and runs a pair's operations in order, so they would wait
  // for sends queued behind them for ever.
  TRIREME_CHECK(!group_ || group_->getBackendName() != "nccl",
                "the pipeline executor needs a Gloo group for its stage exchanges; NCCL is not supported yet "
                "(run pipelines on the CPU, or use tensor and data parallelism on GPUs)");
  TRIREME_CHECK(!group_ || group_->getSize() == spec_.stages, "the pipeline group has ",
                group_ ? group_->getSize() : 0, " ranks but the schedule has ", spec_.stages,
                " stages");
  // Stage s exchanges with the group's ranks s-1 and s+1: another numbering would send to
  // the wrong stages and wait until the collective time-out.
  TRIREME_CHECK(!group_ || group_->getRank() == stage_, "stage ", stage_, " runs as rank ", group_ ? group_->getRank() : 0,
                " of its pipeline group; a stage must be its rank in the group");
}

int StageExecutor::tag(int micro, int chunk, bool gradient) const {
  return (micro * spec_.chunks + chunk) * 2 + (gradient ? 1 : 0);
}

std::string StageExecutor::exchange_text(const Instruction& instruction) const {
  const auto [micro, chunk] = micro_and_chunk(instruction);
  const std::string what = "micro-batch " + std::to_string(micro) +
                           (spec_.chunks > 1 ? " chunk " + std::to_string(chunk) : "");
  std::string text = "pipeline stage " + std::to_string(stage_) + ": ";
  if (const auto* x = std::get_if<SendActivation>(&instruction))
    text += "send of the activation of " + what + " to stage " + std::to_string(x->to_stage);
  else if (const auto* x = std::get_if<RecvActivation>(&instruction))
    text += "receive of the activation of " + what + " from stage " + std::to_string(x->from_stage);
  else if (const auto* x = std::get_if<SendGradient>(&instruction))
    text += "send of the input gradient of " + what + " to stage " + std::to_string(x->to_stage);
  else if (const auto* x = std::get_if<RecvGradient>(&instruction))
    text += "receive of the output gradient of " + what + " from stage " + std::to_string(x->from_stage);
  else
    text += to_string(instruction);
  return text;
}

std::pair<int, int> StageExecutor::receive_source(const Instruction& instruction) const {
  if (const auto* x = std::get_if<RecvActivation>(&instruction))
    return {x->from_stage, tag(x->micro, x->chunk, false)};
  if (const auto* x = std::get_if<RecvGradient>(&instruction))
    return {x->from_stage, tag(x->micro, x->chunk, true)};
  return {-1, -1};
}

void StageExecutor::post_receives(size_t step) {
  if (step >= schedule_[stage_].size()) return;
  for (const Instruction& instruction : schedule_[stage_][step]) {
    const auto [from, t] = receive_source(instruction);
    if (from < 0) continue;
    PostedReceive posted;
    posted.buffer = at::empty(activation_.shape, at::TensorOptions(activation_.dtype).device(activation_.device));
    std::vector<at::Tensor> buffers{posted.buffer};
    try {
      posted.work = group_->recv(buffers, from, t);
    } catch (const std::exception& e) {
      TRIREME_THROW(CommError, "posting the ", exchange_text(instruction), " failed: ",
                    dist::error_text(e));
    }
    receives_[t] = std::move(posted);
  }
}

at::Tensor StageExecutor::receive(const Instruction& instruction) {
  auto it = receives_.find(receive_source(instruction).second);
  TRIREME_ENFORCE_EQ(it != receives_.end(), true, "a receive that was never posted");
  PostedReceive posted = std::move(it->second);
  receives_.erase(it);
  dist::wait_work(posted.work, exchange_text(instruction).c_str());
  return posted.buffer;
}

void StageExecutor::send(at::Tensor tensor, int to, int tag, const Instruction& instruction) {
  PendingSend pending;
  pending.what = exchange_text(instruction);
  // The neighbour receives into a buffer of the agreed shape and dtype: anything else would
  // fail there, or hang it, far from the part that produced it.
  const at::IntArrayRef agreed(activation_.shape);
  TRIREME_CHECK(tensor.defined(), pending.what, ": there is no tensor to send (",
                std::holds_alternative<SendGradient>(instruction) ? "the part's input got no gradient"
                                                                 : "the part returned none", ")");
  TRIREME_CHECK(tensor.sizes() == agreed && tensor.scalar_type() == activation_.dtype, pending.what, ": it is ",
                tensor.sizes(), " ", tensor.scalar_type(), " but the stages agreed on ", agreed, " ",
                activation_.dtype, "; every model part must return activations of that shape and dtype");
  tensor = tensor.contiguous();
  std::vector<at::Tensor> tensors{tensor};
  try {
    pending.work = group_->send(tensors, to, tag);
  } catch (const std::exception& e) {
    TRIREME_THROW(CommError, pending.what, " failed: ", dist::error_text(e));
  }
  pending.tensor = std::move(tensor);
  if (recording_) pending.record = static_cast<int>(stats_.executed.size()) - 1;  // this send
  pending.step = step_;
  sends_.push_back(std::move(pending));
  stats_.peak_pending_sends = std::max(stats_.peak_pending_sends, static_cast<int>(sends_.size()));
}

void StageExecutor::retire_sends(int64_t wait_through) {
  // Not every backend's Work is ever seen complete before wait() (Gloo's sends are not), so
  // sends are also waited for, a fixed number of steps after their own (kSendWaitLag).
  size_t done = 0;
  for (; done < sends_.size(); ++done) {
    PendingSend& pending = sends_[done];
    if (pending.step <= wait_through)
      dist::wait_work(pending.work, pending.what.c_str());
    else if (!pending.work->isCompleted() || !pending.work->isSuccess())
      break;  // (a failure surfaces when it is waited for)
    if (pending.record >= 0) stats_.executed[pending.record].end_us = obs::now_us();
  }
  sends_.erase(sends_.begin(), sends_.begin() + static_cast<std::ptrdiff_t>(done));
}

void StageExecutor::check_micro_batches(const std::vector<MicroBatch>& micro_batches) const {
  TRIREME_CHECK(static_cast<int>(micro_batches.size()) == spec_.micro_batches, "pipeline stage ", stage_,
                ": expected ", spec_.micro_batches, " micro-batches, got ", micro_batches.size());
  if (activation_.shape.empty()) return;
  const int64_t size = activation_.shape[0];
  auto check = [&](size_t micro, const char* name, const at::Tensor& t) {
    TRIREME_CHECK(t.defined(), "pipeline stage ", stage_, ": micro-batch ", micro, " has no ", name);
    TRIREME_CHECK(t.dim() >= 1 && t.size(0) == size, "pipeline stage ", stage_, ": micro-batch ", micro, " has ",
                  name, " of shape ", t.sizes(), " but the stages agreed on micro-batches of ", size,
                  "; give run() micro-batches of the activation's first dimension");
  };
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    if (stage_ == 0) check(i, "inputs", micro_batches[i].inputs);
    // (A loss may need no targets.)
    if (stage_ == spec_.stages - 1 && micro_batches[i].targets.defined()) check(i, "targets", micro_batches[i].targets);
  }
}

double StageExecutor::run(const std::vector<MicroBatch>& micro_batches,
                          const StageCallbacks& callbacks) {
  check_micro_batches(micro_batches);
  double loss_sum = 0;
  slots_.clear();
  sends_.clear();
  stats_ = StageRunStats{};
  live_ = 0;
  receives_.clear();
  awaited_.clear();
  const auto& steps = schedule_[stage_];
  for (size_t k = 0; k < kReceiveLookahead && k < steps.size(); ++k) post_receives(k);
  for (size_t k = 0; k < steps.size(); ++k) {
    step_ = static_cast<int64_t>(k);
    // Receives are posted ahead of need, so the transfer overlaps this stage's compute
    // (a Gloo transfer starts only once its receive is posted).
    post_receives(k + kReceiveLookahead);
    for (const Instruction& instruction : steps[k]) {
      const auto [from, t] = receive_source(instruction);
      if (from >= 0) {
        // Waited for by the compute that consumes it, not here: a step's receive is often
        // for a later compute, and waiting early would stall on a dependency that is not one.
        awaited_.emplace(t, instruction);
        continue;
      }
      if (const auto* f = std::get_if<Forward>(&instruction))
        finish_receive(tag(f->micro, f->chunk, false), micro_batches, callbacks, &loss_sum);
      else if (const auto* b = std::get_if<BackwardInput>(&instruction))
        finish_receive(tag(b->micro, b->chunk, true), micro_batches, callbacks, &loss_sum);
      else if (std::holds_alternative<ReduceGradients>(instruction))
        while (!awaited_.empty())
          finish_receive(awaited_.begin()->first, micro_batches, callbacks, &loss_sum);
      timed_execute(instruction, micro_batches, callbacks, &loss_sum);
    }
    retire_sends(step_ - kSendWaitLag);
  }
  while (!awaited_.empty()) finish_receive(awaited_.begin()->first, micro_batches, callbacks, &loss_sum);
  retire_sends(std::numeric_limits<int64_t>::max());
  slots_.clear();
  return loss_sum;
}

void StageExecutor::timed_execute(const Instruction& instruction,
                                  const std::vector<MicroBatch>& micro_batches,
                                  const StageCallbacks& callbacks, double* loss_sum) {
  const double start = obs::now_us();
  if (recording_) stats_.executed.push_back({instruction, start, start});
  execute(instruction, micro_batches, callbacks, loss_sum);
  if (callbacks.computed && is_compute(instruction)) callbacks.computed(instruction, (obs::now_us() - start) * 1e-6);
  const double end = obs::now_us();
  if (std::holds_alternative<Forward>(instruction))
    stats_.forward_us += end - start;
  else if (is_compute(instruction))
    stats_.backward_us += end - start;
  // A send's end is its completion, filled in when it is retired.
  if (recording_ && !std::holds_alternative<SendActivation>(instruction) &&
      !std::holds_alternative<SendGradient>(instruction))
    stats_.executed.back().end_us = end;
  retire_sends(-1);
}

void StageExecutor::finish_receive(int receive_tag, const std::vector<MicroBatch>& micro_batches,
                                   const StageCallbacks& callbacks, double* loss_sum) {
  auto it = awaited_.find(receive_tag);
  if (it == awaited_.end()) return;
  const Instruction instruction = it->second;
  awaited_.erase(it);
  timed_execute(instruction, micro_batches, callbacks, loss_sum);
}

void StageExecutor::execute(const Instruction& instruction,
                            const std::vector<MicroBatch>& micro_batches,
                            const StageCallbacks& callbacks, double* loss_sum) {
  const int p = spec_.stages, last = spec_.stages * spec_.chunks - 1;
  auto virtual_stage = [&](int chunk) { return chunk * p + stage_; };
  if (const auto* f = std::get_if<Forward>(&instruction)) {
    Slot& slot = slots_[{f->micro, f->chunk}];
    const int vs = virtual_stage(f->chunk);
    if (vs == 0) slot.input = micro_batches[f->micro].inputs;
    TRIREME_ENFORCE_EQ(slot.input.defined(), true, "forward without its input");
    slot.output = parts_[f->chunk](slot.input);
    if (vs == last) {
      slot.output = loss_(slot.output, micro_batches[f->micro].targets) / spec_.micro_batches;
      *loss_sum += slot.output.item<double>();
    }
    stats_.peak_live_micro_batches = std::max(stats_.peak_live_micro_batches, ++live_);
  } else if (const auto* b = std::get_if<BackwardInput>(&instruction)) {
    Slot& slot = slots_[{b->micro, b->chunk}];
    std::optional<DeferWeightGrads> defer;
    if (!b->with_weights) defer.emplace(slot.weight_grads);
    if (virtual_stage(b->chunk) == last)
      slot.output.backward();
    else
      slot.output.backward(slot.output_grad);
    slot.output = at::Tensor();  // frees this micro-batch's graph
    slot.output_grad = at::Tensor();
    --live_;
  } else if (const auto* w = std::get_if<BackwardWeight>(&instruction)) {
    slots_[{w->micro, w->chunk}].weight_grads.run_all(callbacks.weight_grad_accumulated);
  } else if (const auto* x = std::get_if<SendActivation>(&instruction)) {
    at::Tensor out = slots_[{x->micro, x->chunk}].output.detach();
    // The receiver files it under its own chunk: (vs + 1) / p.
    const int to_chunk = (virtual_stage(x->chunk) + 1) / p;
    send(out, x->to_stage, tag(x->micro, to_chunk, false), instruction);
  } else if (const auto* x = std::get_if<RecvActivation>(&instruction)) {
    slots_[{x->micro, x->chunk}].input = receive(instruction).requires_grad_(true);
  } else if (const auto* x = std::get_if<SendGradient>(&instruction)) {
    Slot& slot = slots_[{x->micro, x->chunk}];
    at::Tensor grad = slot.input.grad();
    slot.input = at::Tensor();
    const int to_chunk = (virtual_stage(x->chunk) - 1) / p;
    send(grad, x->to_stage, tag(x->micro, to_chunk, true), instruction);
  } else if (const auto* x = std::get_if<RecvGradient>(&instruction)) {
    slots_[{x->micro, x->chunk}].output_grad = receive(instruction);
  } else if (std::holds_alternative<ReduceGradients>(instruction)) {
    if (callbacks.reduce_gradients) callbacks.reduce_gradients();
  } else if (std::holds_alternative<LoadMicroBatch>(instruction) ||
             std::holds_alternative<OptimizerStep>(instruction)) {
    // Micro-batches are handed to run(); the optimizer step is the caller's.
  } else {
    TRIREME_THROW(InvalidArgument, "stage ", stage_, " cannot execute '", to_string(instruction), "'");
  }
}

}  // namespace trireme::pipeline
