// Pipeline schedules as pictures and text: what `trireme schedule` shows, and what
// `trireme report` measures in a run's timeline.
//   schedule_events    each step as one time unit; F/B/W on the stage's compute row, sends
//                      and receives on its communication row (for obs::timeline_svg)
//   schedule_table     one text row per stage, one column per step: F3 (forward of
//                      micro-batch 3), B3 (full backward), b3 (input-gradient backward),
//                      W3 (weight-gradient backward), '.' idle; ".1" marks chunk 1
//   theoretical_bubble the idle fraction the schedule implies
//   measure_pipeline   the idle fraction (and F/B/W times) a run actually had
//
// Pipeline events in a run's timeline (what the executor records, one obs::TraceEvent per
// instruction): category "pipeline"; name = to_string(instruction), e.g. "F m3 c0",
// "B m3 c0", "Bi m3 c0", "W m3 c0", "send-act m3 c0 -> 1", "recv-grad m3 c0 <- 2";
// args_json {"micro": 3, "chunk": 0, "step": 2} with the 1-based training step. F/B/W are on
// the compute lane, sends (issue to completion) and receives (time blocked) on the comm lane.
// Pure.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "trireme/obs/timeline.h"
#include "trireme/parallel/pipeline/schedule.h"

namespace trireme::pipeline {

obs::RankEvents schedule_events(const ScheduleSpec& spec);
std::string schedule_table(const ScheduleSpec& spec);
// Idle fraction of the compute rows, counting one unit per F, B and W.
double bubble_fraction(const ScheduleSpec& spec);

// The bubble (idle fraction of a stage's time) the schedule implies:
//   gpipe, 1f1b   (p-1)/(m+p-1)     exact for any F and B times, as long as they are the
//                                   same on every stage
//   interleaved   (p-1)/(v*m+p-1)   the same with chunk-sized F and B
//   zb-h1         bubble_fraction(spec): unit-time F, B and W simulated step by step
//                                   (the closed form depends on the F:B:W time ratio)
// p = 1 gives 0. Throws InvalidArgument as validate() does.
double theoretical_bubble(const ScheduleSpec& spec);

// What one stage did in the measured steps. B counts full backwards ("B") and
// input-gradient backwards ("Bi") alike; the *_ms fields are totals.
struct StageStats {
  int forwards = 0, backwards = 0, weight_grads = 0;
  double forward_ms = 0, backward_ms = 0, weight_grad_ms = 0;
  double busy_ms = 0;  // time inside the step windows covered by this stage's F, B or W
  double bubble = 0;   // 1 - busy_ms / PipelineStats::span_ms
};

// The measured bubble. Each training step k found in the events has a window
//   [first start of any stage's pipeline event (compute or comm) of step k,
//    last end of any stage's pipeline compute event (F, B, W) of step k],
// the same for every stage, so that a stage idle at the start or end of the step counts
// that time as bubble (waiting in a receive does too). span_ms = the windows' lengths
// summed over the steps; a stage's busy_ms = the length of the union of its F/B/W spans
// clipped to the windows (overlapping spans are not counted twice, so 0 <= bubble <= 1).
struct PipelineStats {
  std::vector<int> steps;  // the training steps found, ascending
  double span_ms = 0;
  std::vector<StageStats> stages;  // index = stage
  double mean_bubble = 0;          // mean of the stages' bubbles
};

// Measures the pipeline events (category "pipeline") of stage_rows (index = stage; other
// events are ignored). Throws InvalidArgument naming the event when a pipeline event has
// no integer "step" in its args.
PipelineStats measure_pipeline(const obs::RankEvents& stage_rows);

// The "step" field of an event's args_json; nullopt when there is none (or args_json is
// not a JSON object).
std::optional<int> event_step(const obs::TraceEvent& event);

}  // namespace trireme::pipeline
