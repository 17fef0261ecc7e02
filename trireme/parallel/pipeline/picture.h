// Pipeline schedules as pictures and text: what `trireme schedule` shows.
//   schedule_events   each step as one time unit; F/B/W on the stage's compute row, sends
//                     and receives on its communication row (for obs::timeline_svg)
//   schedule_table    one text row per stage, one column per step: F3 (forward of
//                     micro-batch 3), B3 (full backward), b3 (input-gradient backward),
//                     W3 (weight-gradient backward), '.' idle; ".1" marks chunk 1
// Pure.
#pragma once

#include <string>

#include "trireme/obs/timeline.h"
#include "trireme/parallel/pipeline/schedule.h"

namespace trireme::pipeline {

obs::RankEvents schedule_events(const ScheduleSpec& spec);
std::string schedule_table(const ScheduleSpec& spec);
// Idle fraction of the compute rows, counting one unit per F, B and W.
double bubble_fraction(const ScheduleSpec& spec);

}  // namespace trireme::pipeline
