// StageExecutor; see parallel/pipeline/executor.h.
#include "trireme/parallel/pipeline/executor.h"

#include <optional>

#include "trireme/common/error.h"

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
  TRIREME_CHECK(static_cast<int>(parts_.size()) == spec_.chunks, "stage ", stage_, " has ",
                parts_.size(), " model parts but the schedule uses ", spec_.chunks, " chunks");
  TRIREME_CHECK(spec_.stages > 1 || spec_.chunks == 1,
                "--chunks needs at least two pipeline stages (--pp 2 or more)");
  TRIREME_CHECK(!group_ || group_->getSize() == spec_.stages, "the pipeline group has ",
                group_ ? group_->getSize() : 0, " ranks but the schedule has ", spec_.stages,
                " stages");
}

int StageExecutor::tag(int micro, int chunk, bool gradient) const {
  return (micro * spec_.chunks + chunk) * 2 + (gradient ? 1 : 0);
}

at::Tensor StageExecutor::receive(int from, int tag) {
  std::vector<at::Tensor> buffer{at::empty(activation_.shape, at::TensorOptions(activation_.dtype))};
  dist::run_collective("pipeline receive", [&] { return group_->recv(buffer, from, tag); });
  return buffer[0];
}

double StageExecutor::run(const std::vector<MicroBatch>& micro_batches,
                          const std::function<void()>& reduce_gradients) {
  TRIREME_CHECK(static_cast<int>(micro_batches.size()) == spec_.micro_batches, "expected ",
                spec_.micro_batches, " micro-batches, got ", micro_batches.size());
  double loss_sum = 0;
  slots_.clear();
  for (const Step& step : schedule_[stage_])
    for (const Instruction& instruction : step)
      execute(instruction, micro_batches, reduce_gradients, &loss_sum);
  for (auto& [work, tensor] : sends_) dist::wait_work(work, "pipeline send");
  sends_.clear();
  slots_.clear();
  return loss_sum;
}

void StageExecutor::execute(const Instruction& instruction,
                            const std::vector<MicroBatch>& micro_batches,
                            const std::function<void()>& reduce_gradients, double* loss_sum) {
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
  } else if (const auto* b = std::get_if<BackwardInput>(&instruction)) {
    Slot& slot = slots_[{b->micro, b->chunk}];
    std::optional<DeferWeightGrads> defer;
    if (!b->with_weights) defer.emplace(slot.weight_grads);
    if (virtual_stage(b->chunk) == last)
      slot.output.backward();
    else
      slot.output.backward(slot.output_grad);
    slot.output = at::Tensor();  // frees this micro-batch's graph
  } else if (const auto* w = std::get_if<BackwardWeight>(&instruction)) {
    slots_[{w->micro, w->chunk}].weight_grads.run_all();
  } else if (const auto* x = std::get_if<SendActivation>(&instruction)) {
    at::Tensor out = slots_[{x->micro, x->chunk}].output.detach().contiguous();
    std::vector<at::Tensor> tensors{out};
    // The receiver files it under its own chunk: (vs + 1) / p.
    const int to_chunk = (virtual_stage(x->chunk) + 1) / p;
    sends_.emplace_back(group_->send(tensors, x->to_stage, tag(x->micro, to_chunk, false)), out);
  } else if (const auto* x = std::get_if<RecvActivation>(&instruction)) {
    slots_[{x->micro, x->chunk}].input =
        receive(x->from_stage, tag(x->micro, x->chunk, false)).requires_grad_(true);
  } else if (const auto* x = std::get_if<SendGradient>(&instruction)) {
    at::Tensor grad = slots_[{x->micro, x->chunk}].input.grad().contiguous();
    std::vector<at::Tensor> tensors{grad};
    const int to_chunk = (virtual_stage(x->chunk) - 1) / p;
    sends_.emplace_back(group_->send(tensors, x->to_stage, tag(x->micro, to_chunk, true)), grad);
  } else if (const auto* x = std::get_if<RecvGradient>(&instruction)) {
    slots_[{x->micro, x->chunk}].output_grad = receive(x->from_stage, tag(x->micro, x->chunk, true));
  } else if (std::holds_alternative<ReduceGradients>(instruction)) {
    if (reduce_gradients) reduce_gradients();
  } else if (std::holds_alternative<LoadMicroBatch>(instruction) ||
             std::holds_alternative<OptimizerStep>(instruction)) {
    // Micro-batches are handed to run(); the optimizer step is the caller's.
  } else {
    TRIREME_THROW(InvalidArgument, "stage ", stage_, " cannot execute '", to_string(instruction), "'");
  }
}

}  // namespace trireme::pipeline
