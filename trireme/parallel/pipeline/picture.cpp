// Rendering schedules; see parallel/pipeline/picture.h.
#include "trireme/parallel/pipeline/picture.h"

#include <sstream>

namespace trireme::pipeline {
namespace {

constexpr double kStepUs = 1000.0;  // one step drawn as one millisecond

bool is_compute(const Instruction& i) {
  return std::holds_alternative<Forward>(i) || std::holds_alternative<BackwardInput>(i) ||
         std::holds_alternative<BackwardWeight>(i);
}

bool is_comm(const Instruction& i) {
  return std::holds_alternative<SendActivation>(i) || std::holds_alternative<RecvActivation>(i) ||
         std::holds_alternative<SendGradient>(i) || std::holds_alternative<RecvGradient>(i);
}

// "F3", "B3", "b3", "W3", with ".c" for chunks > 0.
std::string short_name(const Instruction& i, int chunks) {
  std::string out;
  int micro = 0, chunk = 0;
  if (const auto* f = std::get_if<Forward>(&i)) out = "F", micro = f->micro, chunk = f->chunk;
  if (const auto* b = std::get_if<BackwardInput>(&i))
    out = b->with_weights ? "B" : "b", micro = b->micro, chunk = b->chunk;
  if (const auto* w = std::get_if<BackwardWeight>(&i)) out = "W", micro = w->micro, chunk = w->chunk;
  out += std::to_string(micro);
  if (chunks > 1) out += "." + std::to_string(chunk);
  return out;
}

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
          std::string label = short_name(ins, spec.chunks).substr(1);
          ranks[s].push_back({to_string(ins), "compute", obs::Lane::kCompute, start + 0.25 * kStepUs,
                              0.75 * kStepUs, "", label});
        } else if (is_comm(ins)) {
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
        if (is_compute(ins)) cell = short_name(ins, spec.chunks);
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

}  // namespace trireme::pipeline
