// `trireme report RUN_DIR`: what the pipeline of a finished run did, from the files that
// `trireme train gpt` leaves in its run directory:
//   RUN_DIR/run.json       the layout: mesh sizes, schedule, micro-batches, chunks, the
//                          traced steps, and each rank's pipeline stage and replica
//   RUN_DIR/timeline.tsv   every rank's traced events (obs::serialize_ranks)
// It draws RUN_DIR/pipeline.svg (or --out FILE, e.g. when RUN_DIR is read-only), one row
// per pipeline stage (the ranks of one data-parallel replica: --replica, default 0), and
// prints per stage the F/B/W counts and mean times, busy and span time and the measured
// bubble next to the schedule's theoretical one (pipeline::measure_pipeline and
// pipeline::theoretical_bubble define them). --step N restricts both to one traced step.
// A pp=1 run is drawn one row per rank.
//   trireme report runs/pp2 [--step 3] [--replica 1] [--out pp2.svg]
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trireme/cli/commands.h"
#include "trireme/cli/flags.h"
#include "trireme/common/error.h"
#include "trireme/obs/plot.h"
#include "trireme/obs/timeline.h"
#include "trireme/parallel/pipeline/picture.h"

namespace trireme::cli {
namespace {

using nlohmann::json;

// Where one rank sits in the layout.
struct RankPlace {
  int rank = 0, stage = 0, replica = 0;
};

// RUN_DIR/run.json.
struct RunLayout {
  std::string command, mesh, schedule;
  int dp = 1, tp = 1, pp = 1, micro_batches = 1, chunks = 1;
  int first_step = 1, last_step = 1;  // traced steps, 1-based, inclusive
  std::vector<RankPlace> ranks;       // index = rank
};

struct ReportOptions {
  std::string dir;
  int step = 0;  // 0: every traced step
  int replica = 0;
  std::string out;  // the picture; "" for RUN_DIR/pipeline.svg
};

// The fix named in every message about a run directory's files. `trireme train` refuses an
// --out that holds an earlier run (its metrics or layout): then another --out.
std::string rerun_hint(const std::string& dir) {
  for (const char* file : {"metrics.jsonl", "run.json"})
    if (std::filesystem::exists(std::filesystem::path(dir) / file))
      return "train again with another --out (or remove " + dir + " first)";
  return "run `trireme train gpt ... --out " + dir + "` to write it";
}

std::string read_file(const std::filesystem::path& path, const std::string& dir) {
  TRIREME_CHECK(std::filesystem::is_regular_file(path), path.string(), " not found; ",
                rerun_hint(dir));
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  TRIREME_CHECK(in.good() || in.eof(), "cannot read ", path.string());
  return text.str();
}

// Fields of run.json, each refused with one line naming the file and the field.
class Fields {
 public:
  Fields(const json& object, std::string where, std::string hint)
      : object_(object), where_(std::move(where)), hint_(std::move(hint)) {}

  const json& get(const char* key, bool (json::*is_type)() const, const char* type) const {
    const auto it = object_.find(key);
    TRIREME_CHECK(it != object_.end() && ((*it).*is_type)(), where_, " has no ", type, " \"", key,
                  "\"; ", hint_);
    return *it;
  }
  // In [min, max] (an int: json's get<int> cut 4294967298 to 2).
  int integer(const char* key, int64_t min = std::numeric_limits<int>::min(),
              int64_t max = std::numeric_limits<int>::max()) const {
    const json& v = get(key, &json::is_number_integer, "integer");
    // (An unsigned value past int64_t's range would wrap in get<int64_t>.)
    const bool fits = (!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(max)) &&
                      v.get<int64_t>() >= min && v.get<int64_t>() <= max;
    TRIREME_CHECK(fits, where_, ": \"", key, "\" must be an integer in [", min, ", ", max,
                  "], got ", v.dump(), "; ", hint_);
    return static_cast<int>(v.get<int64_t>());
  }
  std::string text(const char* key) const {
    return get(key, &json::is_string, "string").get<std::string>();
  }

 private:
  const json& object_;
  std::string where_, hint_;
};

RunLayout read_layout(const std::string& dir) {
  const auto path = std::filesystem::path(dir) / "run.json";
  const std::string file = path.string(), hint = rerun_hint(dir);
  const json root = json::parse(read_file(path, dir), nullptr, /*allow_exceptions=*/false);
  TRIREME_CHECK(!root.is_discarded(), file, " is not valid JSON; ", hint);
  TRIREME_CHECK(root.is_object(), file, " is not a JSON object; ", hint);
  const Fields fields(root, file, hint);
  RunLayout layout;
  layout.command = fields.text("command");
  layout.mesh = fields.text("mesh");
  layout.schedule = fields.text("schedule");
  // (Each at most a run's ranks, and their product too: dp = tp = 65536 was 0 in an int.)
  constexpr int64_t kMostRanks = 1 << 20;
  layout.dp = fields.integer("dp", 1, kMostRanks);
  layout.tp = fields.integer("tp", 1, kMostRanks);
  layout.pp = fields.integer("pp", 1, kMostRanks);
  layout.micro_batches = fields.integer("micro_batches", 1);
  layout.chunks = fields.integer("chunks", 1);
  TRIREME_CHECK(int64_t{layout.dp} * layout.tp * layout.pp <= kMostRanks, file, ": dp*tp*pp = ",
                int64_t{layout.dp} * layout.tp * layout.pp, " ranks, more than a run has (", kMostRanks, "); ", hint);
  const json& steps = fields.get("traced_steps", &json::is_array, "array");
  // (--trace-steps 0 writes [first, first - 1]: a run that traced nothing.)
  TRIREME_CHECK(!(steps.size() == 2 && steps[0].is_number_integer() && steps[1].is_number_integer() &&
                  steps[0].get<int64_t>() == steps[1].get<int64_t>() + 1),
                file, ": the run traced no steps (--trace-steps 0, or it resumed after the traced ones); train "
                "again with --trace-steps N (N >= 1) and another --out to draw its schedule");
  TRIREME_CHECK(steps.size() == 2 && steps[0].is_number_integer() && steps[1].is_number_integer() &&
                    steps[0].get<int64_t>() >= 1 && steps[0].get<int64_t>() <= steps[1].get<int64_t>() &&
                    steps[1].get<int64_t>() <= std::numeric_limits<int>::max(),
                file, ": \"traced_steps\" must be [first, last] with 1 <= first <= last, got ",
                steps.dump(), "; ", hint);
  layout.first_step = steps[0].get<int>();
  layout.last_step = steps[1].get<int>();
  const int world = layout.dp * layout.tp * layout.pp;
  const json& ranks = fields.get("ranks", &json::is_array, "array");
  TRIREME_CHECK(static_cast<int>(ranks.size()) == world, file, ": \"ranks\" lists ", ranks.size(),
                " ranks but dp*tp*pp = ", world, "; ", hint);
  layout.ranks.resize(world);
  std::vector<bool> listed(world, false);
  for (size_t i = 0; i < ranks.size(); ++i) {
    TRIREME_CHECK(ranks[i].is_object(), file, ": \"ranks\"[", i, "] is not an object; ", hint);
    const Fields entry(ranks[i], file + " \"ranks\"[" + std::to_string(i) + "]", hint);
    const RankPlace place{entry.integer("rank"), entry.integer("stage"), entry.integer("dp")};
    TRIREME_CHECK(place.rank >= 0 && place.rank < world && place.stage >= 0 &&
                      place.stage < layout.pp && place.replica >= 0 && place.replica < layout.dp,
                  file, ": \"ranks\"[", i, "] = ", ranks[i].dump(), " is outside the mesh ",
                  layout.mesh, "; ", hint);
    TRIREME_CHECK(!listed[place.rank], file, ": rank ", place.rank, " is listed twice; ", hint);
    listed[place.rank] = true;
    layout.ranks[place.rank] = place;
  }
  return layout;
}

obs::RankEvents read_timeline(const std::string& dir, size_t world) {
  const auto path = std::filesystem::path(dir) / "timeline.tsv";
  obs::RankEvents ranks;
  try {
    ranks = obs::parse_ranks(read_file(path, dir));
  } catch (const InvalidArgument& e) {
    if (!std::filesystem::is_regular_file(path)) throw;
    TRIREME_THROW(InvalidArgument, path.string(), ": ", e.what(), "; ", rerun_hint(dir));
  }
  TRIREME_CHECK(ranks.size() == world, path.string(), " holds ", ranks.size(),
                " ranks but run.json lists ", world, "; ", rerun_hint(dir));
  return ranks;
}

// The stage rows of one replica: per stage the lowest rank of that stage and replica.
std::vector<int> stage_ranks(const RunLayout& layout, int replica, const std::string& dir) {
  std::vector<int> ranks(layout.pp, -1);
  for (const auto& place : layout.ranks)
    if (place.replica == replica && ranks[place.stage] < 0) ranks[place.stage] = place.rank;
  for (int stage = 0; stage < layout.pp; ++stage)
    TRIREME_CHECK(ranks[stage] >= 0, (std::filesystem::path(dir) / "run.json").string(),
                  ": \"ranks\" has no rank for stage ", stage, " of replica ", replica, "; ",
                  rerun_hint(dir));
  return ranks;
}

// The events of steps [first, last]: pipeline events by their "step" (those without one are
// kept, for measure_pipeline to refuse); other events (optimizer, all-reduce) when they
// start inside a selected step, i.e. after the step's first pipeline event and before the
// next traced step's. Pipeline compute events without a label get the micro-batch
// (".chunk" when chunks > 1), as `trireme schedule` draws them.
obs::RankEvents select_steps(const obs::RankEvents& rows, int first, int last, int chunks) {
  std::map<int, double> step_start;  // step -> first pipeline event start, over all rows
  for (const auto& row : rows)
    for (const auto& e : row)
      if (e.category == "pipeline")
        if (const auto step = pipeline::event_step(e)) {
          auto [it, inserted] = step_start.try_emplace(*step, e.start_us);
          if (!inserted) it->second = std::min(it->second, e.start_us);
        }
  // Step i's window is [its start, step i+1's start). The steps' starts rise with the step
  // (each step ends in an all-reduce of its loss), so a window is found by bisection;
  // scanning every step for every event took events x steps on long traces.
  std::vector<std::pair<double, int>> starts;  // (start, step), in step order
  for (const auto& [step, start] : step_start) starts.emplace_back(start, step);
  const bool rising = std::is_sorted(starts.begin(), starts.end());
  auto in_selected_step = [&](double us) {
    if (rising) {
      auto it = std::upper_bound(starts.begin(), starts.end(), std::make_pair(us, std::numeric_limits<int>::max()));
      if (it == starts.begin()) return false;
      --it;
      return it->second >= first && it->second <= last;
    }
    for (size_t i = 0; i < starts.size(); ++i) {
      const double end = i + 1 == starts.size() ? std::numeric_limits<double>::infinity() : starts[i + 1].first;
      if (starts[i].second >= first && starts[i].second <= last && us >= starts[i].first && us < end) return true;
    }
    return false;
  };
  obs::RankEvents out(rows.size());
  for (size_t r = 0; r < rows.size(); ++r)
    for (auto e : rows[r]) {
      if (e.category == "pipeline") {
        const auto step = pipeline::event_step(e);
        if (step && (*step < first || *step > last)) continue;
        int micro = 0, chunk = 0;
        if (e.lane == obs::Lane::kCompute && e.label.empty() &&
            std::sscanf(e.name.c_str(), "%*s m%d c%d", &micro, &chunk) == 2)
          e.label = std::to_string(micro) + (chunks > 1 ? "." + std::to_string(chunk) : "");
      } else if (!in_selected_step(e.start_us)) {
        continue;
      }
      out[r].push_back(std::move(e));
    }
  return out;
}

std::string steps_text(int first, int last) {
  return first == last ? "step " + std::to_string(first)
                       : "steps " + std::to_string(first) + "-" + std::to_string(last);
}

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", fraction * 100);
  return buf;
}

// "   2.25" or "      -" when nothing was counted.
std::string mean_ms(double total_ms, int count) {
  char buf[32];
  if (count == 0) return "      -";
  std::snprintf(buf, sizeof(buf), "%7.2f", total_ms / count);
  return buf;
}

void print_stats(const pipeline::PipelineStats& stats, const std::vector<int>& ranks,
                 double theory, const char* backward_name) {
  const std::string backward_ms = std::string(backward_name) + " ms";
  std::printf("%5s %5s  %5s %7s  %5s %7s  %5s %7s %9s %9s %8s %8s\n", "stage", "rank", "F", "F ms",
              backward_name, backward_ms.c_str(), "W", "W ms", "busy ms", "span ms", "bubble",
              "theory");
  for (size_t s = 0; s < stats.stages.size(); ++s) {
    const auto& st = stats.stages[s];
    std::printf("%5zu %5d  %5d %s  %5d %s  %5d %s %9.2f %9.2f %8s %8s\n", s, ranks[s],
                st.forwards, mean_ms(st.forward_ms, st.forwards).c_str(), st.backwards,
                mean_ms(st.backward_ms, st.backwards).c_str(), st.weight_grads,
                mean_ms(st.weight_grad_ms, st.weight_grads).c_str(), st.busy_ms, stats.span_ms,
                percent(st.bubble).c_str(), percent(theory).c_str());
  }
  std::printf("mean%81s %8s\n", percent(stats.mean_bubble).c_str(), percent(theory).c_str());
}

ReportOptions parse_options(const std::vector<std::string>& args, bool* help) {
  ReportOptions opt;
  FlagParser parser("trireme report");
  parser.add("step", &opt.step, "draw and measure only this traced step; 0: every traced step");
  parser.add("replica", &opt.replica, "data-parallel replica whose stages are drawn");
  parser.add("out", &opt.out, "write the picture to this file (default RUN_DIR/pipeline.svg)");
  const auto rest = parser.parse(args);
  *help = parser.help_requested();
  if (*help) {
    std::fputs("usage: trireme report RUN_DIR [--step N] [--replica R] [--out FILE]\n", stdout);
    std::fputs(parser.usage().c_str(), stdout);
    return opt;
  }
  TRIREME_CHECK(!rest.empty(), "missing RUN_DIR: trireme report RUN_DIR (the --out of a "
                               "`trireme train gpt` run)");
  TRIREME_CHECK(rest.size() == 1, "unexpected argument '", rest[1], "' for 'trireme report'; see trireme report "
                "--help");
  opt.dir = rest[0];
  return opt;
}

}  // namespace

int report_main(const std::vector<std::string>& args) {
  bool help = false;
  const ReportOptions opt = parse_options(args, &help);
  if (help) return 0;
  TRIREME_CHECK(std::filesystem::is_directory(opt.dir), "run directory '", opt.dir,
                "' not found; pass the --out directory of a `trireme train gpt` run");
  const RunLayout layout = read_layout(opt.dir);
  const obs::RankEvents ranks = read_timeline(opt.dir, layout.ranks.size());
  TRIREME_CHECK(opt.replica >= 0 && opt.replica < layout.dp, "--replica ", opt.replica,
                " is outside 0..", layout.dp - 1, " (dp=", layout.dp, ")");
  TRIREME_CHECK(opt.step == 0 || (opt.step >= layout.first_step && opt.step <= layout.last_step),
                "--step ", opt.step, " was not traced; the run traced ",
                steps_text(layout.first_step, layout.last_step));
  TRIREME_CHECK(layout.pp > 1 || opt.step == 0, "--step needs a pipeline run; ", opt.dir, " has pp=1");
  const int first = opt.step ? opt.step : layout.first_step;
  const int last = opt.step ? opt.step : layout.last_step;
  const std::string svg_path =
      opt.out.empty() ? (std::filesystem::path(opt.dir) / "pipeline.svg").string() : opt.out;
  const std::string svg_fix = "pass --out FILE to write the picture elsewhere";
  std::printf("run: %s; %s; %s\n", layout.command.c_str(), layout.mesh.c_str(),
              steps_text(first, last).c_str());

  if (layout.pp == 1) {
    obs::write_text_file(svg_path, obs::timeline_svg("trireme report: " + layout.command + ", " +
                                                         layout.mesh + ", " +
                                                         steps_text(first, last),
                                                     ranks),
                         svg_fix);
    std::printf("no pipeline (pp=1): one row per rank\npipeline.svg: %s\n", svg_path.c_str());
    return 0;
  }

  pipeline::ScheduleSpec spec;
  try {
    spec = {pipeline::parse_schedule(layout.schedule), layout.pp, layout.micro_batches,
            layout.chunks};
    pipeline::validate(spec);
  } catch (const InvalidArgument& e) {
    TRIREME_THROW(InvalidArgument, (std::filesystem::path(opt.dir) / "run.json").string(), ": ",
                  e.what());
  }
  const std::vector<int> row_ranks = stage_ranks(layout, opt.replica, opt.dir);
  obs::RankEvents rows;
  std::vector<std::string> names;
  for (int stage = 0; stage < layout.pp; ++stage) {
    rows.push_back(ranks[row_ranks[stage]]);
    names.push_back("stage " + std::to_string(stage) + " (rank " +
                    std::to_string(row_ranks[stage]) + ")");
  }
  rows = select_steps(rows, first, last, layout.chunks);
  pipeline::PipelineStats stats;
  try {
    stats = pipeline::measure_pipeline(rows);
  } catch (const InvalidArgument& e) {
    TRIREME_THROW(InvalidArgument, (std::filesystem::path(opt.dir) / "timeline.tsv").string(),
                  ": ", e.what(), "; ", rerun_hint(opt.dir));
  }
  TRIREME_CHECK(!stats.steps.empty(), opt.dir, "/timeline.tsv has no pipeline events for ",
                steps_text(first, last), " on the ranks of replica ", opt.replica, "; ",
                rerun_hint(opt.dir));
  const std::string schedule =
      std::string(pipeline::schedule_name(spec.kind)) + ", " +
      std::to_string(spec.micro_batches) + " micro-batches" +
      (spec.chunks > 1 ? ", " + std::to_string(spec.chunks) + " chunks" : "");
  std::printf("schedule: %s; replica %d\n", schedule.c_str(), opt.replica);
  print_stats(stats, row_ranks, pipeline::theoretical_bubble(spec),
              spec.kind == pipeline::ScheduleKind::kZbH1 ? "Bi" : "B");
  obs::write_text_file(svg_path,
                       obs::timeline_svg("trireme report: " + layout.command + ", " + layout.mesh +
                                             ", " + schedule + ", " + steps_text(first, last) +
                                             ", replica " + std::to_string(opt.replica),
                                         rows, names),
                       svg_fix);
  std::printf("pipeline.svg: %s\n", svg_path.c_str());
  return 0;
}

}  // namespace trireme::cli
