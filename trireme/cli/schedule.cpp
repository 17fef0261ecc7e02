// `trireme schedule`: prints a pipeline schedule as a table and draws it as an SVG Gantt
// chart (one row per stage), without running anything.
//   trireme schedule --schedule zb-h1 --pp 4 --micro-batches 8 --out zb-h1.svg
#include <cstdio>

#include "trireme/cli/commands.h"
#include "trireme/cli/flags.h"
#include "trireme/common/error.h"
#include "trireme/obs/plot.h"
#include "trireme/parallel/pipeline/picture.h"

namespace trireme::cli {

int schedule_main(const std::vector<std::string>& args) {
  std::string schedule = "1f1b", out;
  int pp = 4, micro_batches = 8, chunks = 1;
  FlagParser parser("trireme schedule");
  parser.add("schedule", &schedule, "gpipe, 1f1b, interleaved or zb-h1");
  parser.add("pp", &pp, "pipeline stages");
  parser.add("micro-batches", &micro_batches, "micro-batches per step");
  parser.add("chunks", &chunks, "model chunks per stage (interleaved)");
  parser.add("out", &out, "write the schedule as an SVG picture to this file");
  const auto rest = parser.parse(args);
  if (parser.help_requested()) {
    std::fputs("usage: trireme schedule [--schedule S] [--pp N] [--micro-batches M] [--chunks V] [--out FILE]\n",
               stdout);
    std::fputs(parser.usage().c_str(), stdout);
    return 0;
  }
  TRIREME_CHECK(rest.empty(), "unexpected argument '", rest.front(), "' for 'trireme schedule'; see trireme schedule "
                "--help");
  const pipeline::ScheduleSpec spec{pipeline::parse_schedule(schedule), pp, micro_batches, chunks};
  pipeline::validate(spec);
  std::fputs(pipeline::schedule_table(spec).c_str(), stdout);
  if (!out.empty()) {
    const std::string title = std::string(pipeline::schedule_name(spec.kind)) + ": " +
                              std::to_string(pp) + " stages, " + std::to_string(micro_batches) +
                              " micro-batches" +
                              (chunks > 1 ? ", " + std::to_string(chunks) + " chunks" : "") +
                              " (1 ms = 1 step)";
    obs::write_text_file(out, obs::timeline_svg(title, pipeline::schedule_events(spec)),
                         "give --out a file in a directory you can write to");
    std::printf("wrote %s\n", out.c_str());
  }
  return 0;
}

}  // namespace trireme::cli
