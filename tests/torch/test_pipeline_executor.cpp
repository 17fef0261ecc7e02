// StageExecutor over real Gloo groups (ranks as threads, tests/torch/ranks.h): sends are
// waited for within the schedule's bound, compute is timed on every step, and an
// activation or micro-batch that is not of the agreed shape and dtype is refused by name.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ranks.h"
#include "trireme/common/error.h"
#include "trireme/parallel/pipeline/executor.h"

using namespace trireme::pipeline;

namespace {
// Each stage scales its input by a weight of its own; the loss is the sum of the last output.
std::vector<MicroBatch> micro_batches(int m, int64_t rows) {
  at::manual_seed(5);
  std::vector<MicroBatch> out;
  for (int i = 0; i < m; ++i) out.push_back({at::randn({rows, 4}), at::Tensor()});
  return out;
}
at::Tensor sum_loss(const at::Tensor& y, const at::Tensor&) { return y.sum(); }
}  // namespace

TEST(StageExecutor, WaitsForEachSendWithinTwoSteps) {
  // Gloo's send work is never seen complete before wait(): unless the executor waits for
  // them, all m activations and input gradients stay alive to the end of the run. A stage
  // sends at most one tensor per step (what its one compute produced) and waits, at the
  // end of step k, for the sends of step k-1: at most 2 are pending, whatever m is.
  const int m = 16;
  const auto batches = micro_batches(m, 2);
  for (const ScheduleKind kind :
       {ScheduleKind::kOneFOneB, ScheduleKind::kGPipe, ScheduleKind::kZbH1, ScheduleKind::kInterleaved})
    for (const int p : {2, 3}) {
      const int v = kind == ScheduleKind::kInterleaved ? 2 : 1;
      if (m % p != 0 && kind == ScheduleKind::kInterleaved) continue;
      const ScheduleSpec spec{kind, p, m, v};
      const std::string name = std::string(schedule_name(kind)) + " p=" + std::to_string(p);
      // Virtual stage vs scales by 1 + vs / 4, so the loss is the inputs' sum times the product.
      double scale = 1;
      for (int vs = 0; vs < p * v; ++vs) scale *= 1 + vs / 4.0;
      std::vector<int> peak(p, -1);
      double loss = 0;
      trireme::testing::run_ranks(p, [&](int rank, const trireme::dist::Group& group) {
        std::vector<PartForward> parts;
        for (int c = 0; c < v; ++c) {
          const at::Tensor w = at::full({4}, 1 + (c * p + rank) / 4.0).requires_grad_(true);
          parts.push_back([w](const at::Tensor& x) { return x * w; });
        }
        StageExecutor executor(spec, rank, parts, sum_loss, ActivationSpec{{2, 4}}, group);
        const double stage_loss = executor.run(batches);
        if (rank == p - 1) loss = stage_loss;
        peak[rank] = executor.last_run().peak_pending_sends;
      });
      for (int rank = 0; rank < p; ++rank) {
        EXPECT_GE(peak[rank], 1) << name << " stage " << rank;
        EXPECT_LE(peak[rank], 2) << name << " stage " << rank;
      }
      double expect = 0;
      for (const auto& b : batches) expect += b.inputs.sum().item<double>() * scale / m;
      EXPECT_NEAR(loss, expect, 1e-4) << name;
    }
}

TEST(StageExecutor, TimesComputeWithoutRecording) {
  // metrics.jsonl's forward_ms and backward_ms come from these totals on every step, traced
  // or not (the instruction list is kept only when recording).
  const ScheduleSpec spec{ScheduleKind::kOneFOneB, 1, 3, 1};
  const at::Tensor w = at::full({4}, 1.5).requires_grad_(true);
  StageExecutor executor(spec, 0, {[w](const at::Tensor& x) { return (x * w).tanh(); }}, sum_loss,
                         ActivationSpec{{2, 4}}, nullptr);
  executor.run(micro_batches(3, 2));
  EXPECT_TRUE(executor.last_run().executed.empty());
  EXPECT_GT(executor.last_run().forward_us, 0);
  EXPECT_GT(executor.last_run().backward_us, 0);
}

TEST(StageExecutor, RefusesAnActivationOfAnotherDtype) {
  // Stage 0's part returns doubles where the stages agreed on floats: refused at the send,
  // naming the stage and micro-batch, instead of a receive that fails or reads garbage.
  const ScheduleSpec spec{ScheduleKind::kOneFOneB, 2, 4, 1};
  const auto batches = micro_batches(4, 2);
  std::string refusal = "accepted";
  trireme::testing::run_ranks(2, [&](int rank, const trireme::dist::Group& group) {
    StageExecutor executor(spec, rank, {[](const at::Tensor& x) { return (x * 2).to(at::kDouble); }}, sum_loss,
                           ActivationSpec{{2, 4}}, group);
    if (rank != 0) return;  // (stage 1 would wait for an activation that never comes)
    try {
      executor.run(batches);
    } catch (const trireme::InvalidArgument& e) {
      refusal = e.what();
    }
  });
  EXPECT_NE(refusal.find("pipeline stage 0"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("micro-batch 0"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("Double"), std::string::npos) << refusal;
}

TEST(StageExecutor, RefusesAMicroBatchOfAnotherSize) {
  const ScheduleSpec spec{ScheduleKind::kOneFOneB, 1, 3, 1};
  const at::Tensor w = at::full({4}, 1.5).requires_grad_(true);
  StageExecutor executor(spec, 0, {[w](const at::Tensor& x) { return x * w; }}, sum_loss, ActivationSpec{{2, 4}},
                         nullptr);
  EXPECT_NO_THROW(executor.run(micro_batches(3, 2)));
  auto batches = micro_batches(3, 2);
  batches[1].inputs = at::randn({3, 4});
  try {
    executor.run(batches);
    FAIL() << "a micro-batch of 3 accepted where the stages agreed on 2";
  } catch (const trireme::InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("pipeline stage 0"), std::string::npos) << what;
    EXPECT_NE(what.find("micro-batch 1"), std::string::npos) << what;
  }
}
