// Schedule generation; see parallel/pipeline/schedule.h for the terms and the contract.
//
// How steps are built: each stage's compute order (compute_order) is replayed for all
// stages together in lockstep. At step t a stage runs its next F/B/W if its inputs were
// produced at a step before t: F needs the previous virtual stage's F of that micro-batch;
// B needs this virtual stage's F and the next virtual stage's B; W needs this B. Results
// produced at step t that another stage needs are sent at the start of step t+1 and
// received in the same step t+1 by that stage.
#include "trireme/parallel/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "trireme/common/error.h"

namespace trireme::pipeline {
namespace {

template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

enum class Op { kF, kB, kW };

struct ComputeKey {
  Op op;
  int micro;
  int virtual_stage;
  bool operator<(const ComputeKey& o) const {
    return std::tie(op, micro, virtual_stage) < std::tie(o.op, o.micro, o.virtual_stage);
  }
};

// One-forward-one-backward order over `total` forwards of a stage, with `warmup` forwards
// first. fwd(k)/bwd(k) give the (micro, chunk) of the k-th forward/backward. In zb-h1 mode
// backward is split and up to `deferred` W's are held back to fill the cool-down.
template <class Fwd, class Bwd>
std::vector<Instruction> one_f_one_b(int total, int warmup, Fwd fwd, Bwd bwd, bool split,
                                     int deferred) {
  std::vector<Instruction> ops;
  int f = 0, b = 0;
  std::vector<std::pair<int, int>> pending_w;
  auto flush_w = [&](size_t keep) {
    while (pending_w.size() > keep) {
      ops.push_back(BackwardWeight{pending_w.front().first, pending_w.front().second});
      pending_w.erase(pending_w.begin());
    }
  };
  for (; f < std::min(warmup, total); ++f) {
    const auto [micro, chunk] = fwd(f);
    ops.push_back(Forward{micro, chunk});
  }
  for (; b < total; ++b) {
    if (f < total) {
      const auto [micro, chunk] = fwd(f++);
      ops.push_back(Forward{micro, chunk});
    }
    const auto [micro, chunk] = bwd(b);
    ops.push_back(BackwardInput{micro, chunk, !split});
    if (split) {
      pending_w.emplace_back(micro, chunk);
      flush_w(static_cast<size_t>(deferred));
    }
  }
  flush_w(0);
  return ops;
}

}  // namespace

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  if (name == "zb-h1") return ScheduleKind::kZbH1;
  TRIREME_THROW(InvalidArgument, "unknown --schedule '", name,
                "'; use gpipe, 1f1b, interleaved or zb-h1");
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::kOneFOneB: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
    case ScheduleKind::kZbH1: return "zb-h1";
  }
  return "?";
}

void validate(const ScheduleSpec& spec) {
  TRIREME_CHECK(spec.stages >= 1, "--pp must be at least 1, got ", spec.stages);
  TRIREME_CHECK(spec.micro_batches >= 1, "--micro-batches must be at least 1, got ",
                spec.micro_batches);
  TRIREME_CHECK(spec.chunks >= 1, "--chunks must be at least 1, got ", spec.chunks);
  TRIREME_CHECK(spec.chunks == 1 || spec.kind == ScheduleKind::kInterleaved, "--chunks ",
                spec.chunks, " needs --schedule interleaved (", schedule_name(spec.kind),
                " runs one chunk per stage)");
  TRIREME_CHECK(spec.kind != ScheduleKind::kInterleaved || spec.micro_batches % spec.stages == 0,
                "--schedule interleaved needs --micro-batches a multiple of --pp ", spec.stages,
                ", got ", spec.micro_batches);
  // Multiplied one factor at a time: each is below 2^31 and the product so far below 2^20.
  int64_t operations = 3;
  for (const int factor : {spec.stages, spec.chunks, spec.micro_batches})
    if (operations <= kMaxScheduleOperations) operations *= factor;
  TRIREME_CHECK(operations <= kMaxScheduleOperations, "--pp ", spec.stages, " x --micro-batches ",
                spec.micro_batches, (spec.chunks > 1 ? " x --chunks " + std::to_string(spec.chunks) : ""),
                " makes a schedule of more than ", kMaxScheduleOperations,
                " F, B and W operations (3 x pp x micro-batches x chunks); lower --micro-batches or --pp");
}

bool is_compute(const Instruction& i) {
  return std::holds_alternative<Forward>(i) || std::holds_alternative<BackwardInput>(i) ||
         std::holds_alternative<BackwardWeight>(i);
}

bool is_communication(const Instruction& i) {
  return std::holds_alternative<SendActivation>(i) || std::holds_alternative<RecvActivation>(i) ||
         std::holds_alternative<SendGradient>(i) || std::holds_alternative<RecvGradient>(i);
}

std::pair<int, int> micro_and_chunk(const Instruction& instruction) {
  return std::visit(Overloaded{
                        [](const LoadMicroBatch& x) { return std::make_pair(x.micro, 0); },
                        [](const ReduceGradients&) { return std::make_pair(-1, -1); },
                        [](const OptimizerStep&) { return std::make_pair(-1, -1); },
                        [](const auto& x) { return std::make_pair(x.micro, x.chunk); },
                    },
                    instruction);
}

std::string compact_name(const Instruction& i, int chunks) {
  std::string out;
  if (const auto* b = std::get_if<BackwardInput>(&i))
    out = b->with_weights ? "B" : "b";
  else if (std::holds_alternative<Forward>(i))
    out = "F";
  else if (std::holds_alternative<BackwardWeight>(i))
    out = "W";
  else
    return "";
  const auto [micro, chunk] = micro_and_chunk(i);
  out += std::to_string(micro);
  if (chunks > 1) out += "." + std::to_string(chunk);
  return out;
}

std::string to_string(const Instruction& instruction) {
  std::ostringstream out;
  std::visit(Overloaded{
                 [&](const LoadMicroBatch& x) { out << "load m" << x.micro; },
                 [&](const Forward& x) { out << "F m" << x.micro << " c" << x.chunk; },
                 [&](const BackwardInput& x) {
                   out << (x.with_weights ? "B m" : "Bi m") << x.micro << " c" << x.chunk;
                 },
                 [&](const BackwardWeight& x) { out << "W m" << x.micro << " c" << x.chunk; },
                 [&](const SendActivation& x) {
                   out << "send-act m" << x.micro << " c" << x.chunk << " -> " << x.to_stage;
                 },
                 [&](const RecvActivation& x) {
                   out << "recv-act m" << x.micro << " c" << x.chunk << " <- " << x.from_stage;
                 },
                 [&](const SendGradient& x) {
                   out << "send-grad m" << x.micro << " c" << x.chunk << " -> " << x.to_stage;
                 },
                 [&](const RecvGradient& x) {
                   out << "recv-grad m" << x.micro << " c" << x.chunk << " <- " << x.from_stage;
                 },
                 [&](const ReduceGradients&) { out << "reduce-grads"; },
                 [&](const OptimizerStep&) { out << "optimizer-step"; },
             },
             instruction);
  return out.str();
}

std::vector<Instruction> compute_order(const ScheduleSpec& spec, int stage) {
  validate(spec);  // bounds p*m*v, so m*v and the indices below fit an int
  const int p = spec.stages, m = spec.micro_batches, v = spec.chunks;
  TRIREME_CHECK(stage >= 0 && stage < p, "stage ", stage, " is outside 0..", p - 1);
  auto single = [](int k) { return std::make_pair(k, 0); };
  switch (spec.kind) {
    case ScheduleKind::kGPipe: {
      std::vector<Instruction> ops;
      for (int i = 0; i < m; ++i) ops.push_back(Forward{i, 0});
      for (int i = 0; i < m; ++i) ops.push_back(BackwardInput{i, 0, true});
      return ops;
    }
    case ScheduleKind::kOneFOneB:
      return one_f_one_b(m, p - stage - 1, single, single, false, 0);
    case ScheduleKind::kZbH1:
      return one_f_one_b(m, p - stage - 1, single, single, true, stage);
    case ScheduleKind::kInterleaved: {
      // Megatron's order: micro-batches in groups of p, each group through chunk 0, then
      // chunk 1, ...; backward visits the chunks in reverse.
      auto fwd = [p, v](int k) { return std::make_pair((k / (p * v)) * p + k % p, (k / p) % v); };
      auto bwd = [fwd, v](int k) {
        const auto [micro, chunk] = fwd(k);
        return std::make_pair(micro, v - 1 - chunk);
      };
      return one_f_one_b(m * v, (p - stage - 1) * 2 + (v - 1) * p, fwd, bwd, false, 0);
    }
  }
  return {};
}

std::vector<std::vector<Step>> build_schedule(const ScheduleSpec& spec) {
  validate(spec);
  const int p = spec.stages, last_virtual = spec.stages * spec.chunks - 1;
  std::vector<std::vector<Instruction>> orders;
  for (int s = 0; s < p; ++s) orders.push_back(compute_order(spec, s));

  std::map<ComputeKey, int> done;  // compute op -> step it ran in
  auto done_before = [&](ComputeKey key, int step) {
    auto it = done.find(key);
    return it != done.end() && it->second < step;
  };
  std::vector<size_t> next(p, 0);
  std::vector<std::vector<Step>> steps(p);
  // Messages produced in the previous step: delivered at the start of this one.
  struct Message { int from, to; Instruction send, recv; };
  std::vector<Message> in_flight;
  const size_t total_ops = [&] {
    size_t n = 0;
    for (const auto& o : orders) n += o.size();
    return n;
  }();
  size_t ran = 0;
  for (int step = 0; ran < total_ops || !in_flight.empty(); ++step) {
    TRIREME_CHECK(step <= 4 * static_cast<int>(total_ops) + 4 * p, "schedule ",
                  schedule_name(spec.kind), " does not make progress (internal error)");
    for (int s = 0; s < p; ++s) steps[s].emplace_back();
    for (const auto& msg : in_flight) steps[msg.from][step].push_back(msg.send);
    for (const auto& msg : in_flight) steps[msg.to][step].push_back(msg.recv);
    in_flight.clear();

    std::vector<std::pair<int, Instruction>> runnable;
    for (int s = 0; s < p; ++s) {
      if (next[s] >= orders[s].size()) continue;
      const Instruction& op = orders[s][next[s]];
      bool ready = false;
      if (const auto* f = std::get_if<Forward>(&op)) {
        const int vs = f->chunk * p + s;
        ready = vs == 0 || done_before({Op::kF, f->micro, vs - 1}, step);
      } else if (const auto* b = std::get_if<BackwardInput>(&op)) {
        const int vs = b->chunk * p + s;
        ready = done_before({Op::kF, b->micro, vs}, step) &&
                (vs == last_virtual || done_before({Op::kB, b->micro, vs + 1}, step));
      } else if (const auto* w = std::get_if<BackwardWeight>(&op)) {
        ready = done_before({Op::kB, w->micro, w->chunk * p + s}, step);
      }
      if (ready) runnable.emplace_back(s, op);
    }
    for (const auto& [s, op] : runnable) {
      ++next[s];
      ++ran;
      if (const auto* f = std::get_if<Forward>(&op)) {
        const int vs = f->chunk * p + s;
        if (vs == 0 || vs == last_virtual) steps[s][step].push_back(LoadMicroBatch{f->micro});
        steps[s][step].push_back(op);
        done[{Op::kF, f->micro, vs}] = step;
        if (vs < last_virtual && p > 1) {
          const int to = (vs + 1) % p, to_chunk = (vs + 1) / p;
          in_flight.push_back({s, to, SendActivation{f->micro, f->chunk, to},
                               RecvActivation{f->micro, to_chunk, s}});
        }
      } else if (const auto* b = std::get_if<BackwardInput>(&op)) {
        const int vs = b->chunk * p + s;
        steps[s][step].push_back(op);
        done[{Op::kB, b->micro, vs}] = step;
        if (vs > 0 && p > 1) {
          const int to = (vs - 1) % p, to_chunk = (vs - 1) / p;
          in_flight.push_back({s, to, SendGradient{b->micro, b->chunk, to},
                               RecvGradient{b->micro, to_chunk, s}});
        }
      } else if (const auto* w = std::get_if<BackwardWeight>(&op)) {
        steps[s][step].push_back(op);
        done[{Op::kW, w->micro, w->chunk * p + s}] = step;
      }
    }
  }
  for (int s = 0; s < p; ++s) {
    steps[s].back().push_back(ReduceGradients{});
    steps[s].back().push_back(OptimizerStep{});
  }
  return steps;
}

int expected_steps(const ScheduleSpec& spec) {
  const int p = spec.stages, m = spec.micro_batches, v = spec.chunks;
  switch (spec.kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB: return 2 * (m + p - 1);
    case ScheduleKind::kInterleaved: return 2 * (m * v + p - 1);
    case ScheduleKind::kZbH1: return 3 * m + p - 1;
  }
  return 0;
}

}  // namespace trireme::pipeline
