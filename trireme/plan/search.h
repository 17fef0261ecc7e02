// The layout search: every layout `trireme train` can run on (a subset of) the cluster,
// estimated with the cost model, the fastest that fits chosen. Pure: no libtorch.
//
// What is searched:
//   groups        which groups of the cluster to use (all, or leave slow ones out)
//   dp, tp, pp    tp inside a machine of equal devices (tp divides devices_per_machine,
//                 heads and vocab); a pipeline stage runs on one group: with d = dp*tp
//                 dividing every used group's device count, group g holds devices_g / d
//                 stages, so pp = sum of devices_g / d
//   stage order   which group holds the first stages, the next ones, ... (each group's
//                 stages contiguous: every permutation of the used groups in a cluster of
//                 up to 4 groups; in a larger one, the groups by speed, fastest first and
//                 slowest first)
//   schedule      gpipe, 1f1b, interleaved (v = 2..max_chunks), zb-h1 when pp > 1
//   m, b          micro-batches per replica and their size, m*b = global_batch/dp, m up
//                 to max_micro_batches; when dp does not divide the global batch, m
//                 divides it and the replicas' sizes are one sequence apart (16 over
//                 dp 7 at m 1: 3,3,2,2,2,2,2)
//   zero          0, 1, 2 when dp > 1
//   layer split   contiguous, balanced for time on each stage's device speed (a slower
//                 stage gets fewer layers): min-max partition, one split for every replica
//   replica batches  on 2-4 groups, each replica placed whole inside one group and each
//                 group's replicas given their own micro-batch size (uneven data parallelism)
// Not searched, because the runtime cannot run it yet: different splits or micro-batch
// counts per replica. Searched and emitted although the runtime does not run it
// everywhere: pp > 1 on accelerator groups (`trireme train --device cuda` refuses
// pipelines for now; such plans run on CPU ranks). Only the symmetric baseline below may
// spread a stage over two groups (as symmetric planning does on a mixed cluster).
//
// Fewer devices: when no layout can run on every device of a one-group cluster (its
// device count splits into no pipeline of at most the model's layers whose replicas the
// batch can feed), the same search on the cluster less one machine, then less one device
// of the last machine, down to one device; the fastest layout found on any of these sizes
// is the result, with the devices it leaves idle counted. Sizes above global batch x
// devices per machine x layers, which no layout can fill, are skipped unsearched. Layouts
// that run but do not fit in memory are an error as before.
//
// Pruning: a layout whose lower bound (its compute spread evenly over its stages, at the
// fastest device) is already slower than `prune_factor` x the best found is not replayed.
//
// Heterogeneity-unaware baseline (`aware = false`, what Megatron-style symmetric planning
// does): devices are taken in the cluster file's order (rank r on the r-th device), every
// group is used, layers are split evenly by count; the best such layout is still chosen by
// the cost model on the real cluster, so the baseline is the best symmetric layout.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "trireme/plan/cost_model.h"

namespace trireme::plan {

// The largest global batch searched, in sequences: a micro-batch's size (global batch
// over dp x m) is an int in a layout.
constexpr int64_t kMaxGlobalBatch = std::numeric_limits<int>::max();

struct SearchOptions {
  int64_t global_batch = 16;  // 1..kMaxGlobalBatch
  bool aware = true;
  int max_chunks = 4;
  int64_t max_micro_batches = 256;  // m is tried from 1 to this
  int runners_up = 5;
  double prune_factor = 1.5;
  // When no layout can run on every device of a one-group cluster: the fastest layout on
  // fewer devices (SearchResult::idle_devices), instead of an error.
  bool fewer_devices = true;
  CostOptions cost;
  // Told how far the search is, often (before each subset of groups, each smaller size of
  // the fewer-devices fallback): "searched 27 of 255 subsets of the cluster's groups". A
  // cluster of 8 groups takes most of a minute.
  std::function<void(const std::string& how_far)> progress;
};

struct Candidate {
  Layout layout;
  Estimate estimate;
  std::vector<std::string> groups;  // names of the groups used, in stage order
};

struct SearchResult {
  Candidate best;
  // The fastest layout of each other (dp, tp, pp, schedule, zero) family, fastest first,
  // each with why it lost to the best.
  std::vector<std::pair<Candidate, std::string>> runners_up;
  // Families that never fit, with the reason of their smallest-memory member.
  std::vector<std::pair<std::string, std::string>> rejected;
  int64_t evaluated = 0;  // layouts estimated
  int64_t pruned = 0;     // layouts skipped by the lower bound
  double search_s = 0;
  // Devices of a one-group cluster the layouts leave idle because no layout can run on all
  // of them (SearchOptions::fewer_devices): whole machines, then the last machine's last
  // devices. 0 otherwise.
  int idle_devices = 0;
};

// Throws InvalidArgument when nothing fits, naming the closest layout and why.
SearchResult search(const Profile& profile, const Cluster& cluster, const SearchOptions& options);

// "dp 2 x tp 1 x pp 2, 1f1b, m 4 x b 2, zero 0, split 0:3,3:6"
std::string describe(const Layout& layout);
// "dp 2 x tp 1 x pp 2, 1f1b, zero 0": the family a runner-up stands for.
std::string family(const Layout& layout);

// `per_step` sequences over `dp` replicas on equal devices, as evenly as whole sequences
// allow: the first per_step % dp replicas take one more (16 over 7: 3,3,2,2,2,2,2).
std::vector<int> near_even_shares(int64_t per_step, int dp);

// Rank r on the r-th device of the cluster file (groups in order, machines in turn), for
// the first `count` ranks. Throws when the cluster has fewer devices.
std::vector<DeviceSlot> ranks_in_file_order(const Cluster& cluster, int count);

// Contiguous split of the layers into speeds.size() parts, part i running at speeds[i]:
// minimises the slowest part's time, sum of costs / speed. Deterministic like
// pipeline::balance_partition (which is the case of equal speeds).
std::vector<pipeline::LayerRange> balance_for_speeds(const std::vector<double>& costs,
                                                     const std::vector<double>& speeds);

// For each n in 1..max_machines, the best layout on at most n machines of a one-group
// cluster (spot replay: the cluster shrunk to n machines; leaving some idle when fewer
// split better). Index 0 and sizes where nothing fits hold an empty Candidate (step_s 0).
std::vector<Candidate> best_per_size(const Profile& profile, const Cluster& cluster,
                                     const SearchOptions& options, int max_machines);

}  // namespace trireme::plan
