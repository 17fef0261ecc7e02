// Rendering schedules and measuring pipeline timelines; see parallel/pipeline/picture.h.
#include "trireme/parallel/pipeline/picture.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "trireme/common/error.h"
#include "trireme/common/intervals.h"

namespace trireme::pipeline {
namespace {

constexpr double kStepUs = 1000.0;  // one step drawn as one millisecond

constexpr const char* kPipelineCategory = "pipeline";

}  // namespace

obs::RankEvents schedule_events(const ScheduleSpec& spec) {
  const auto steps = build_schedule(spec);
  obs::RankEvents ranks(steps.size());
  for (size_t s = 0; s < steps.size(); ++s)
    for (size_t k = 0; k < steps[s].size(); ++k) {
      const double start = static_cast<double>(k) * kStepUs;
      int comm = 0;
      for (const auto& ins : steps[s][k]) {
        if (is_compute(ins)) {
          std::string label = compact_name(ins, spec.chunks).substr(1);
          ranks[s].push_back({to_string(ins), "compute", obs::Lane::kCompute, start + 0.25 * kStepUs,
                              0.75 * kStepUs, "", label});
        } else if (is_communication(ins)) {
          // Sends and receives happen at the start of a step; draw each as a thin slice.
          ranks[s].push_back({to_string(ins), "comm", obs::Lane::kComm,
                              start + comm++ * 0.1 * kStepUs, 0.08 * kStepUs, "", ""});
        }
      }
    }
  return ranks;
}

std::string schedule_table(const ScheduleSpec& spec) {
  const auto steps = build_schedule(spec);
  const int width = spec.chunks > 1 ? 6 : 4;
  std::ostringstream out;
  out << schedule_name(spec.kind) << ": p=" << spec.stages << " m=" << spec.micro_batches
      << " v=" << spec.chunks << ", " << steps.front().size() << " steps (closed form "
      << expected_steps(spec) << "), bubble " << bubble_fraction(spec) * 100 << "%\n";
  for (size_t s = 0; s < steps.size(); ++s) {
    out << "stage " << s << " |";
    for (const auto& step : steps[s]) {
      std::string cell = ".";
      for (const auto& ins : step)
        if (is_compute(ins)) cell = compact_name(ins, spec.chunks);
      cell.resize(width, ' ');
      out << cell;
    }
    out << "\n";
  }
  return out.str();
}

double bubble_fraction(const ScheduleSpec& spec) {
  const auto steps = build_schedule(spec);
  double busy = 0, total = 0;
  for (const auto& stage : steps) {
    total += static_cast<double>(stage.size());
    for (const auto& step : stage)
      for (const auto& ins : step) busy += is_compute(ins);
  }
  return total > 0 ? 1.0 - busy / total : 0.0;
}


double theoretical_bubble(const ScheduleSpec& spec) {
  validate(spec);
  const double p = spec.stages, m = spec.micro_batches, v = spec.chunks;
  switch (spec.kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
      return (p - 1) / (m + p - 1);
    case ScheduleKind::kInterleaved:
      return (p - 1) / (v * m + p - 1);
    case ScheduleKind::kZbH1:
      return bubble_fraction(spec);
  }
  TRIREME_THROW(InvalidArgument, "unknown schedule kind ", static_cast<int>(spec.kind));
}

std::optional<int> event_step(const obs::TraceEvent& event) {
  const auto args = nlohmann::json::parse(event.args_json, nullptr, /*allow_exceptions=*/false);
  if (!args.is_object()) return std::nullopt;
  const auto step = args.find("step");
  if (step == args.end() || !step->is_number_integer()) return std::nullopt;
  return step->get<int>();
}

PipelineStats measure_pipeline(const obs::RankEvents& stage_rows) {
  auto is_pipeline = [](const obs::TraceEvent& e) { return e.category == kPipelineCategory; };
  auto is_pipeline_compute = [&](const obs::TraceEvent& e) {
    return is_pipeline(e) && e.lane == obs::Lane::kCompute;
  };
  auto step_of = [](const obs::TraceEvent& e) {
    const auto step = event_step(e);
    TRIREME_CHECK(step.has_value(), "pipeline event '", e.name,
                  "' has no integer \"step\" in its args (",
                  e.args_json.empty() ? "none" : e.args_json, ")");
    return *step;
  };
  // Step -> [first pipeline start, last compute end] over all stages, in microseconds.
  std::map<int, std::pair<double, double>> windows;
  for (const auto& row : stage_rows)
    for (const auto& e : row) {
      if (!is_pipeline(e)) continue;
      const auto it = windows.try_emplace(step_of(e), e.start_us, e.start_us).first;
      it->second.first = std::min(it->second.first, e.start_us);
      if (is_pipeline_compute(e))
        it->second.second = std::max(it->second.second, e.start_us + e.duration_us);
    }
  PipelineStats stats;
  for (const auto& [step, window] : windows) {
    stats.steps.push_back(step);
    stats.span_ms += std::max(0.0, window.second - window.first) / 1e3;
  }
  for (const auto& row : stage_rows) {
    StageStats stage;
    std::map<int, std::vector<std::pair<double, double>>> spans;  // step -> compute spans
    for (const auto& e : row) {
      if (!is_pipeline_compute(e)) continue;
      const int step = step_of(e);
      const double ms = e.duration_us / 1e3;
      const std::string kind = e.name.substr(0, e.name.find(' '));
      if (kind == "F") ++stage.forwards, stage.forward_ms += ms;
      if (kind == "B" || kind == "Bi") ++stage.backwards, stage.backward_ms += ms;
      if (kind == "W") ++stage.weight_grads, stage.weight_grad_ms += ms;
      const auto& window = windows.at(step);
      spans[step].emplace_back(std::max(e.start_us, window.first),
                               std::min(e.start_us + e.duration_us, window.second));
    }
    for (const auto& [step, intervals] : spans) stage.busy_ms += union_length(intervals) / 1e3;
    stage.bubble = stats.span_ms > 0 ? 1.0 - stage.busy_ms / stats.span_ms : 0.0;
    stats.mean_bubble += stage.bubble / static_cast<double>(stage_rows.size());
    stats.stages.push_back(stage);
  }
  return stats;
}

}  // namespace trireme::pipeline
