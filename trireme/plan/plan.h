// A plan: the layout `trireme plan` chose, written as JSON for `trireme train --plan`.
//
//   {"format": 1, "cluster": "...", "profile": "...",
//    "model": {"vocab": 256, "seq_len": 128, "layers": 4, "dim": 128, "heads": 4, "mlp_ratio": 4},
//    "global_batch": 16,
//    "layout": {"dp": 1, "tp": 1, "pp": 2, "schedule": "1f1b", "chunks": 1,
//               "micro_batches": 4, "micro_batch_size": 4, "zero": 0, "pp_split": "0:3,3:6"},
//    (replicas of unequal shares: "replica_micro_batch_sizes": [3, 1] instead of
//     "micro_batch_size"; replica r takes micro_batches x its size, --replica-batches)
//    "ranks": [{"rank": 0, "group": "fast", "machine": 0, "device": 0, "speed": 1,
//               "emulated_slowdown": 1}, ...],
//    "predicted": {"step_s": 0.12, "samples_per_s": 133, "bubble_fraction": 0.2,
//                  "memory_bytes_per_stage": [...]},
//    (chosen by trial runs, trireme plan --measure-top K:
//     "measured": {"step_s": 0.13, "candidates": 3})}
//
// `emulated_slowdown` is, for ranks of a group described by a relative speed (a device
// emulated on this machine's CPU ranks), the fastest such group's speed over theirs:
// `trireme train --plan` slows their compute by that factor. 1 for real devices. Everything a plan says is checked when it
// is read; errors name the file and the JSON path. Pure: no libtorch.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "trireme/models/gpt_config.h"
#include "trireme/plan/search.h"

namespace trireme::plan {

struct PlanRank {
  int rank = 0;
  std::string group;
  int machine = 0, device = 0;
  double speed = 1;
  double emulated_slowdown = 1;
};

struct Plan {
  std::string cluster;
  std::string profile;  // the profile's source
  models::GptConfig model;
  int64_t global_batch = 0;
  int dp = 1, tp = 1, pp = 1;
  std::string schedule;  // "" when pp == 1
  int chunks = 1;
  int micro_batches = 1;
  int micro_batch_size = 1;
  std::vector<int> replica_micro_batch_sizes;  // per replica when unequal, else empty
  int zero = 0;
  std::string pp_split;  // "" when pp == 1
  std::vector<PlanRank> ranks;
  double predicted_step_s = 0;
  double predicted_samples_per_s = 0;
  double predicted_bubble = 0;
  std::vector<double> predicted_memory_bytes;  // per stage
  // `trireme plan --measure-top K`: this layout's step time measured on this machine (the
  // fastest measured of `measured_candidates` trial runs); 0 and 0 when not measured.
  double measured_step_s = 0;
  int measured_candidates = 0;

  int world() const { return world_size(dp, tp, pp); }
};

Plan make_plan(const Profile& profile, const Cluster& cluster, const Candidate& chosen);
// The plan's layout on the first `machines` machines of the cluster's first group
// (`trireme simulate`'s fixed policy): tp, pp, schedule, chunks, split and micro-batch
// count kept; dp as many replicas as fit, never more than the plan's (machines beyond its
// size stay idle); the global batch kept, split over the replicas as evenly as whole
// sequences allow (the plan's own shares at the plan's dp). nullopt when no replica fits.
std::optional<Layout> fixed_layout(const Profile& profile, const Cluster& cluster, const Plan& plan, int machines);
std::string to_json(const Plan& plan);
Plan parse_plan(const std::string& text, const std::string& origin);
Plan read_plan(const std::string& path);

// "--emulate-slowdown" form of the plan's slowdowns: "1:2.5" (only ranks slowed), "" if none.
std::string slowdown_flag(const Plan& plan);
// Parses "RANK:FACTOR,RANK:FACTOR" (1 <= factor <= 1000) and returns rank's factor (1 if
// absent). Throws InvalidArgument naming the problem.
double slowdown_of(const std::string& flag, int rank);
// Throws InvalidArgument when the flag is malformed or names a rank >= world_size.
void check_slowdown(const std::string& flag, int world_size);

}  // namespace trireme::plan
