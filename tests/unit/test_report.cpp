// What `trireme report` computes (parallel/pipeline/picture.h): the theoretical bubble of
// each schedule, and the bubble measured from hand-made pipeline events whose idle gaps
// are known.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "trireme/common/error.h"
#include "trireme/parallel/pipeline/picture.h"

using namespace trireme::pipeline;
using trireme::obs::Lane;
using trireme::obs::RankEvents;
using trireme::obs::TraceEvent;

namespace {

// A pipeline event of training step `step`, times in milliseconds.
TraceEvent op(const std::string& name, int step, double start_ms, double end_ms,
              Lane lane = Lane::kCompute) {
  const std::string args = "{\"micro\": 0, \"chunk\": 0, \"step\": " + std::to_string(step) + "}";
  return {name, "pipeline", lane, start_ms * 1e3, (end_ms - start_ms) * 1e3, args, ""};
}

// 1F1B on two stages, two micro-batches, F = 1 ms and B = 2 ms, traced for steps 2 and 3.
// Step 2 starts at 0 ms and takes 9 ms; in step 3 (from 20 ms) stage 1's last backward
// takes 3 ms and delays stage 0's, so the step takes 11 ms:
//   stage 0  F0 F1 .  .  B0 B0 .  B1 B1          busy 6 of 9     step 3: 6 of 11
//   stage 1  .  F0 B0 B0 F1 B1 B1 .  .           busy 6 of 9     step 3: 7 of 11
// Measured bubble: stage 0 1 - 12/20 = 0.40, stage 1 1 - 13/20 = 0.35.
RankEvents two_stage_run() {
  RankEvents rows(2);
  for (int step : {2, 3}) {
    const double t = step == 2 ? 0 : 20;
    const double slow = step == 2 ? 0 : 1;  // stage 1's last backward is 1 ms longer
    rows[0].push_back(op("F m0 c0", step, t + 0, t + 1));
    rows[0].push_back(op("send-act m0 c0 -> 1", step, t + 1, t + 1.1, Lane::kComm));
    rows[0].push_back(op("F m1 c0", step, t + 1, t + 2));
    rows[0].push_back(op("B m0 c0", step, t + 4, t + 6));
    rows[0].push_back(op("B m1 c0", step, t + 7 + 2 * slow, t + 9 + 2 * slow));
    rows[1].push_back(op("recv-act m0 c0 <- 0", step, t + 0.2, t + 1, Lane::kComm));
    rows[1].push_back(op("F m0 c0", step, t + 1, t + 2));
    rows[1].push_back(op("B m0 c0", step, t + 2, t + 4));
    rows[1].push_back(op("F m1 c0", step, t + 4, t + 5));
    rows[1].push_back(op("B m1 c0", step, t + 5, t + 7 + slow));
    // Not pipeline events: ignored, although they lie outside the windows.
    for (auto& row : rows)
      row.push_back({"optimizer", "compute", Lane::kCompute, (t + 12) * 1e3, 2e3, "", ""});
  }
  return rows;
}

}  // namespace

TEST(PipelineReport, TheoreticalBubbleOfEachSchedule) {
  EXPECT_NEAR(theoretical_bubble({ScheduleKind::kOneFOneB, 2, 8, 1}), 1.0 / 9, 1e-12);
  EXPECT_NEAR(theoretical_bubble({ScheduleKind::kInterleaved, 2, 8, 2}), 1.0 / 17, 1e-12);
  EXPECT_NEAR(theoretical_bubble({ScheduleKind::kGPipe, 4, 8, 1}), 3.0 / 11, 1e-12);
  const ScheduleSpec zb{ScheduleKind::kZbH1, 4, 8, 1};
  EXPECT_DOUBLE_EQ(theoretical_bubble(zb), bubble_fraction(zb));
  EXPECT_LT(theoretical_bubble(zb), theoretical_bubble({ScheduleKind::kOneFOneB, 4, 8, 1}));
  EXPECT_EQ(theoretical_bubble({ScheduleKind::kOneFOneB, 1, 8, 1}), 0.0);
  // The unit-time simulation agrees with the closed forms where they apply.
  for (const ScheduleSpec spec : {ScheduleSpec{ScheduleKind::kOneFOneB, 4, 8, 1},
                                  ScheduleSpec{ScheduleKind::kGPipe, 3, 5, 1},
                                  ScheduleSpec{ScheduleKind::kInterleaved, 2, 8, 2}})
    EXPECT_NEAR(theoretical_bubble(spec), bubble_fraction(spec), 1e-12) << schedule_name(spec.kind);
  EXPECT_THROW(theoretical_bubble({ScheduleKind::kInterleaved, 4, 6, 2}), trireme::InvalidArgument);
}

TEST(PipelineReport, MeasuresKnownIdleGaps) {
  const PipelineStats stats = measure_pipeline(two_stage_run());
  EXPECT_EQ(stats.steps, (std::vector<int>{2, 3}));
  EXPECT_NEAR(stats.span_ms, 9 + 11, 1e-9);
  ASSERT_EQ(stats.stages.size(), 2u);
  const StageStats& s0 = stats.stages[0];
  const StageStats& s1 = stats.stages[1];
  EXPECT_EQ(s0.forwards, 4);
  EXPECT_EQ(s0.backwards, 4);
  EXPECT_EQ(s0.weight_grads, 0);
  EXPECT_NEAR(s0.forward_ms, 4, 1e-9);
  EXPECT_NEAR(s0.backward_ms, 8, 1e-9);
  EXPECT_NEAR(s1.backward_ms, 9, 1e-9);
  EXPECT_NEAR(s0.busy_ms, 12, 1e-9);
  EXPECT_NEAR(s1.busy_ms, 13, 1e-9);
  EXPECT_NEAR(s0.bubble, 0.40, 1e-12);
  EXPECT_NEAR(s1.bubble, 0.35, 1e-12);
  EXPECT_NEAR(stats.mean_bubble, 0.375, 1e-12);
}

TEST(PipelineReport, MeasuresOneStepAlone) {
  RankEvents rows = two_stage_run();
  for (auto& row : rows)
    row.erase(std::remove_if(row.begin(), row.end(),
                             [](const TraceEvent& e) { return event_step(e) == 3; }),
              row.end());
  const PipelineStats stats = measure_pipeline(rows);
  EXPECT_EQ(stats.steps, (std::vector<int>{2}));
  EXPECT_NEAR(stats.span_ms, 9, 1e-9);
  EXPECT_NEAR(stats.stages[0].bubble, 1.0 / 3, 1e-12);
  EXPECT_NEAR(stats.stages[1].bubble, 1.0 / 3, 1e-12);
}

TEST(PipelineReport, SplitBackwardAndOverlapsCountOnce) {
  // Zero-bubble style: Bi and W; a W overlapping its Bi is busy time counted once.
  RankEvents rows(1);
  rows[0].push_back(op("F m0 c0", 1, 0, 2));
  rows[0].push_back(op("Bi m0 c0", 1, 2, 4));
  rows[0].push_back(op("W m0 c0", 1, 3, 5));
  const PipelineStats stats = measure_pipeline(rows);
  const StageStats& s = stats.stages[0];
  EXPECT_EQ(s.forwards, 1);
  EXPECT_EQ(s.backwards, 1);
  EXPECT_EQ(s.weight_grads, 1);
  EXPECT_NEAR(s.weight_grad_ms, 2, 1e-9);
  EXPECT_NEAR(s.busy_ms, 5, 1e-9);
  EXPECT_NEAR(s.bubble, 0.0, 1e-12);
}

TEST(PipelineReport, TheoreticalBubbleRefusesAnOversizedSchedule) {
  // A run.json with micro_batches 1e8: refused at once, not built (tens of GB).
  EXPECT_THROW(theoretical_bubble({ScheduleKind::kZbH1, 4, 100000000, 1}), trireme::InvalidArgument);
  EXPECT_THROW(theoretical_bubble({ScheduleKind::kOneFOneB, 4, 100000000, 1}), trireme::InvalidArgument);
}

TEST(PipelineReport, NoPipelineEventsAndMissingSteps) {
  RankEvents rows(2);
  rows[0].push_back({"forward", "compute", Lane::kCompute, 0, 1000, "", ""});
  const PipelineStats empty = measure_pipeline(rows);
  EXPECT_TRUE(empty.steps.empty());
  EXPECT_EQ(empty.span_ms, 0.0);
  EXPECT_EQ(empty.stages.size(), 2u);
  EXPECT_EQ(empty.mean_bubble, 0.0);

  rows[1].push_back({"F m0 c0", "pipeline", Lane::kCompute, 0, 1000, R"({"micro": 0})", ""});
  try {
    measure_pipeline(rows);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const trireme::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'F m0 c0' has no integer \"step\""), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(event_step({"x", "pipeline", Lane::kCompute, 0, 0, "not json", ""}), std::nullopt);
  EXPECT_EQ(event_step({"x", "pipeline", Lane::kCompute, 0, 0, R"({"step": 7})", ""}), 7);
}
