#include "trireme/plan/plan.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "trireme/common/error.h"
#include "trireme/plan/json_reader.h"

namespace trireme::plan {

Plan make_plan(const Profile& profile, const Cluster& cluster, const Candidate& chosen) {
  const Layout& l = chosen.layout;
  Plan p;
  p.cluster = cluster.name;
  p.profile = profile.source;
  p.model = profile.model;
  p.global_batch = l.global_batch();
  p.dp = l.dp;
  p.tp = l.tp;
  p.pp = l.pp;
  p.schedule = l.pp > 1 ? pipeline::schedule_name(l.schedule) : "";
  p.chunks = l.chunks;
  p.micro_batches = l.micro_batches;
  p.micro_batch_size = l.micro_batch_size;
  p.replica_micro_batch_sizes = l.replica_micro_batch_sizes;
  p.zero = l.zero;
  p.pp_split = l.pp > 1 ? pipeline::format_split(l.split) : "";
  // Emulation can only slow a rank down: the fastest emulated group runs as it is, the
  // others by their speed relative to it.
  double fastest_emulated = 0;
  for (const DeviceSlot& d : l.ranks) fastest_emulated = std::max(fastest_emulated, cluster.groups[d.group].relative_speed);
  for (int r = 0; r < l.world(); ++r) {
    const DeviceSlot& d = l.ranks[r];
    const MachineGroup& g = cluster.groups[d.group];
    p.ranks.push_back({r, g.name, d.machine, d.device, g.speed(profile),
                       g.relative_speed > 0 ? fastest_emulated / g.relative_speed : 1.0});
  }
  p.predicted_step_s = chosen.estimate.step_s;
  p.predicted_samples_per_s = chosen.estimate.samples_per_s(l.global_batch());
  p.predicted_bubble = chosen.estimate.bubble_fraction;
  for (const StageCost& s : chosen.estimate.stages) p.predicted_memory_bytes.push_back(s.memory_bytes());
  return p;
}

std::optional<Layout> fixed_layout(const Profile& profile, const Cluster& cluster, const Plan& p, int machines) {
  Cluster shrunk = cluster;
  shrunk.groups[0].machines = machines;
  const int dp = std::min(p.dp, shrunk.devices() / (p.tp * p.pp));
  const int64_t per_step = p.global_batch / p.micro_batches;
  if (dp < 1 || per_step < dp) return std::nullopt;
  Layout l;
  l.dp = dp;
  l.tp = p.tp;
  l.pp = p.pp;
  l.chunks = p.chunks;
  l.zero = dp > 1 ? p.zero : 0;
  l.micro_batches = p.micro_batches;
  if (dp == p.dp) {
    l.micro_batch_size = p.micro_batch_size;
    l.replica_micro_batch_sizes = p.replica_micro_batch_sizes;
  } else {
    l.micro_batch_size = static_cast<int>((per_step + dp - 1) / dp);
    if (per_step % dp != 0) l.replica_micro_batch_sizes = near_even_shares(per_step, dp);
  }
  const int layers = static_cast<int>(profile.layers.size());
  if (p.pp > 1) {
    l.schedule = pipeline::parse_schedule(p.schedule);
    l.split = pipeline::parse_split(p.pp_split, layers, p.pp * p.chunks);
  } else {
    l.split = {{0, layers}};
  }
  l.ranks = ranks_in_file_order(shrunk, l.world());
  return l;
}

std::string to_json(const Plan& p) {
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (const PlanRank& r : p.ranks)
    ranks.push_back({{"rank", r.rank},
                     {"group", r.group},
                     {"machine", r.machine},
                     {"device", r.device},
                     {"speed", r.speed},
                     {"emulated_slowdown", r.emulated_slowdown}});
  nlohmann::ordered_json layout = {{"dp", p.dp}, {"tp", p.tp}, {"pp", p.pp}};
  if (p.pp > 1) layout["schedule"] = p.schedule;
  layout["chunks"] = p.chunks;
  layout["micro_batches"] = p.micro_batches;
  if (p.replica_micro_batch_sizes.empty())
    layout["micro_batch_size"] = p.micro_batch_size;
  else
    layout["replica_micro_batch_sizes"] = p.replica_micro_batch_sizes;
  layout["zero"] = p.zero;
  if (p.pp > 1) layout["pp_split"] = p.pp_split;
  nlohmann::ordered_json out = {
      {"format", 1},
      {"cluster", p.cluster},
      {"profile", p.profile},
      {"model", model_json(p.model)},
      {"global_batch", p.global_batch},
      {"layout", layout},
      {"ranks", ranks},
      {"predicted",
       {{"step_s", p.predicted_step_s},
        {"samples_per_s", p.predicted_samples_per_s},
        {"bubble_fraction", p.predicted_bubble},
        {"memory_bytes_per_stage", p.predicted_memory_bytes}}}};
  if (p.measured_candidates > 0)
    out["measured"] = {{"step_s", p.measured_step_s}, {"candidates", p.measured_candidates}};
  return out.dump(1) + "\n";
}

Plan parse_plan(const std::string& text, const std::string& origin) {
  const nlohmann::json doc = Field::parse(text, origin);
  const Field root(doc, "", origin);
  root.only({"format", "cluster", "profile", "model", "global_batch", "layout", "ranks", "predicted", "measured"});
  if (root.at("format").integer(1) != 1)
    root.at("format").fail("is not 1; this plan was written by another trireme: re-run trireme plan");
  Plan p;
  p.cluster = root.str_or("cluster", "");
  p.profile = root.str_or("profile", "");
  p.model = read_model(root.at("model"));
  p.global_batch = root.at("global_batch").integer(1);
  const Field l = root.at("layout");
  l.only({"dp", "tp", "pp", "schedule", "chunks", "micro_batches", "micro_batch_size", "replica_micro_batch_sizes",
          "zero", "pp_split"});
  p.dp = l.at("dp").bounded(1);
  p.tp = l.at("tp").bounded(1);
  p.pp = l.at("pp").bounded(1);
  p.chunks = l.bounded_or("chunks", 1, 1);
  p.micro_batches = l.at("micro_batches").bounded(1);
  const int64_t dp_tp = int64_t{p.dp} * p.tp;
  if (dp_tp > std::numeric_limits<int>::max() || dp_tp * p.pp > std::numeric_limits<int>::max())
    l.fail("dp " + std::to_string(p.dp) + " x tp " + std::to_string(p.tp) + " x pp " + std::to_string(p.pp) +
           " is more than " + std::to_string(std::numeric_limits<int>::max()) + " ranks");
  // Chunks are the interleaved schedule's model chunks per stage (pipeline::validate's rule).
  if (p.chunks > 1 && p.pp == 1)
    l.at("chunks").fail("is " + std::to_string(p.chunks) + " but pp is 1; chunks need a pipeline (pp 2 or more, "
                        "schedule interleaved) or chunks 1");
  int64_t per_step = 0;  // sequences of one micro-batch of every replica
  if (l.has("replica_micro_batch_sizes")) {
    if (l.has("micro_batch_size"))
      l.at("micro_batch_size").fail("is given with replica_micro_batch_sizes; keep one of the two");
    const std::vector<Field> sizes = l.at("replica_micro_batch_sizes").items();
    if (static_cast<int>(sizes.size()) != p.dp)
      l.at("replica_micro_batch_sizes").fail("lists " + std::to_string(sizes.size()) + " replicas but dp is " +
                                             std::to_string(p.dp));
    for (const Field& f : sizes) {
      p.replica_micro_batch_sizes.push_back(f.bounded(1));
      per_step += p.replica_micro_batch_sizes.back();
    }
    p.micro_batch_size = *std::max_element(p.replica_micro_batch_sizes.begin(), p.replica_micro_batch_sizes.end());
  } else {
    p.micro_batch_size = l.at("micro_batch_size").bounded(1);
    per_step = int64_t{p.dp} * p.micro_batch_size;
  }
  const int64_t zero = l.integer_or("zero", 0, 0);
  if (zero > 2) l.at("zero").fail("must be 0, 1 or 2");
  p.zero = static_cast<int>(zero);
  if (p.pp > 1) {
    p.schedule = l.at("schedule").str();
    pipeline::ScheduleKind kind = pipeline::ScheduleKind::kOneFOneB;
    try {
      kind = pipeline::parse_schedule(p.schedule);
    } catch (const InvalidArgument& e) {
      l.at("schedule").fail(std::string("is not a schedule: ") + e.what());
    }
    if (p.chunks > 1 && kind != pipeline::ScheduleKind::kInterleaved)
      l.at("chunks").fail("is " + std::to_string(p.chunks) + " but schedule " + p.schedule +
                          " runs one chunk per stage; use schedule interleaved or chunks 1");
    if (kind == pipeline::ScheduleKind::kInterleaved && p.micro_batches % p.pp != 0)
      l.at("micro_batches").fail("is " + std::to_string(p.micro_batches) + " but schedule interleaved needs a "
                                 "multiple of pp " + std::to_string(p.pp));
    if (int64_t{p.pp} * p.chunks > p.model.layers + 2)
      l.at("chunks").fail("x pp is " + std::to_string(int64_t{p.pp} * p.chunks) + " virtual stages but the model has " +
                          std::to_string(p.model.layers + 2) + " layers (embeddings, blocks, head)");
    p.pp_split = l.at("pp_split").str();
    try {
      pipeline::parse_split(p.pp_split, static_cast<int>(p.model.layers + 2), p.pp * p.chunks);
    } catch (const InvalidArgument& e) {
      l.at("pp_split").fail(std::string("is not a split of the model: ") + e.what());
    }
  } else if (l.has("schedule") || l.has("pp_split")) {
    l.at(l.has("schedule") ? "schedule" : "pp_split").fail("is given but pp is 1; drop it or set pp");
  }
  // (per_step, up to dp x INT_MAX, times micro_batches can pass int64: compared by division.)
  if (p.global_batch % p.micro_batches != 0 || p.global_batch / p.micro_batches != per_step) {
    int64_t product = 0;
    root.at("global_batch").fail("is " + std::to_string(p.global_batch) + " but micro_batches x " +
                                 (p.replica_micro_batch_sizes.empty() ? "dp x micro_batch_size"
                                                                      : "the sum of replica_micro_batch_sizes") +
                                 " = " +
                                 (__builtin_mul_overflow(per_step, int64_t{p.micro_batches}, &product)
                                      ? "more than " + std::to_string(std::numeric_limits<int64_t>::max())
                                      : std::to_string(product)));
  }
  const std::vector<Field> ranks = root.at("ranks").items();
  if (static_cast<int>(ranks.size()) != p.world())
    root.at("ranks").fail("lists " + std::to_string(ranks.size()) + " ranks but dp x tp x pp = " +
                          std::to_string(p.world()));
  for (size_t i = 0; i < ranks.size(); ++i) {
    const Field& f = ranks[i];
    f.only({"rank", "group", "machine", "device", "speed", "emulated_slowdown"});
    PlanRank r;
    r.rank = f.at("rank").bounded(0);
    if (r.rank != static_cast<int>(i)) f.at("rank").fail("must be " + std::to_string(i) + " (ranks in order)");
    r.group = f.str_or("group", "");
    r.machine = f.bounded_or("machine", 0, 0);
    r.device = f.bounded_or("device", 0, 0);
    r.speed = f.positive_or("speed", 1);
    r.emulated_slowdown = f.positive_or("emulated_slowdown", 1);
    if (r.emulated_slowdown < 1) f.at("emulated_slowdown").fail("must be >= 1 (a factor compute is slowed by)");
    p.ranks.push_back(r);
  }
  if (root.has("predicted")) {
    const Field pr = root.at("predicted");
    pr.only({"step_s", "samples_per_s", "bubble_fraction", "memory_bytes_per_stage"});
    p.predicted_step_s = pr.non_negative_or("step_s", 0);
    p.predicted_samples_per_s = pr.non_negative_or("samples_per_s", 0);
    p.predicted_bubble = pr.non_negative_or("bubble_fraction", 0);
    if (pr.has("memory_bytes_per_stage"))
      for (const Field& m : pr.at("memory_bytes_per_stage").items()) p.predicted_memory_bytes.push_back(m.non_negative());
  }
  if (root.has("measured")) {
    const Field me = root.at("measured");
    me.only({"step_s", "candidates"});
    p.measured_step_s = me.at("step_s").positive();
    p.measured_candidates = me.at("candidates").bounded(1);
  }
  return p;
}

Plan read_plan(const std::string& path) { return parse_plan(read_text_file(path), path); }

std::string slowdown_flag(const Plan& plan) {
  std::ostringstream out;
  for (const PlanRank& r : plan.ranks)
    if (r.emulated_slowdown != 1) out << (out.tellp() > 0 ? "," : "") << r.rank << ":" << r.emulated_slowdown;
  return out.str();
}

void check_slowdown(const std::string& flag, int world_size) {
  std::stringstream items(flag);
  std::string item;
  std::vector<long> named;
  while (std::getline(items, item, ',')) {
    slowdown_of(item, -1);  // the item's own syntax (no rank is -1)
    const long rank = std::strtol(item.c_str(), nullptr, 10);  // digits that fit, checked there
    TRIREME_CHECK(rank < world_size, "--emulate-slowdown names rank ", rank, " but the job has ", world_size,
                  " ranks; name ranks 0..", world_size - 1);
    TRIREME_CHECK(std::find(named.begin(), named.end(), rank) == named.end(), "--emulate-slowdown names rank ", rank,
                  " twice; give each rank once");
    named.push_back(rank);
  }
}

double slowdown_of(const std::string& flag, int rank) {
  double factor = 1;
  std::stringstream items(flag);
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto colon = item.find(':');
    // Plain decimal: strtol and strtod also take spaces, '+', and (strtod) hexadecimal.
    const bool plain = colon != std::string::npos && colon > 0 && colon + 1 < item.size() &&
                       item.find_first_not_of("0123456789") == colon &&
                       (std::isdigit(static_cast<unsigned char>(item[colon + 1])) || item[colon + 1] == '.') &&
                       item.find_first_of("xX") == std::string::npos;
    char* end = nullptr;
    char* factor_end = nullptr;
    errno = 0;
    const long r = plain ? std::strtol(item.c_str(), &end, 10) : -1;
    const bool rank_fits = errno != ERANGE && r <= std::numeric_limits<int>::max();
    const double f = plain ? std::strtod(item.c_str() + colon + 1, &factor_end) : 0;
    TRIREME_CHECK(plain && end == item.c_str() + colon && r >= 0 && std::isfinite(f) && f >= 1 && f <= 1000 &&
                      factor_end == item.c_str() + item.size(),
                  "--emulate-slowdown '", item, "' is not RANK:FACTOR with 1 <= FACTOR <= 1000, e.g. 1:2.5");
    TRIREME_CHECK(rank_fits, "--emulate-slowdown '", item, "' names a rank past any job's; name ranks from 0");
    if (r == rank) factor = f;
  }
  return factor;
}

}  // namespace trireme::plan
