// Spot-preemption replay: a training job run through an availability trace (trace.h) under
// three recovery policies, with goodput, cost and where the time went. Closed-form: every
// number follows from the rules below, and tests/unit/test_simulate.cpp checks them by hand.
//
// Terms:
//   rate r(n)      samples/s the job trains at with n live nodes, from a table indexed by n
//                  (n = 0 gives 0; n past the table's end uses its last entry). A job runs
//                  when n >= min_nodes and r(n) > 0; otherwise it waits (idle)
//   change         a trace point where the live count changes: a loss (fewer nodes) or an
//                  addition (more). Counts are net per instant (trace.h collapses them)
//   recovery       the stop after a change: the job makes no progress until it ends
//                  (downtime). Its length, counted from the change:
//                    loss      detect_s + restart_s + load (+ replan_s)
//                    addition  restart_s + load (+ replan_s)
//                  load = disk_load_s when the recovery reads the disk checkpoint, else
//                  memory_load_s
//   work lost      training seconds whose result is thrown away and redone
//
// Policies:
//   kDiskRestart   a disk checkpoint after every checkpoint_every_s seconds of training,
//                  stalling checkpoint_stall_s (it counts once the stall is over; a change
//                  during the stall drops it). Every change rolls back to the newest disk
//                  checkpoint: the training since it is lost, and the load is from disk.
//   kMemory        in-memory snapshots at every step (step_s seconds of training a step),
//                  which slow training by the fraction snapshot_overhead: r(n) *
//                  (1 - snapshot_overhead). A loss loses the step in flight (the training
//                  since the last step boundary) and loads from memory. An addition loses
//                  nothing (the step in flight is kept) and loads from memory. The
//                  snapshots are also written to disk every checkpoint_every_s of training,
//                  in the background (no stall); such a checkpoint holds the state at the
//                  last step boundary. Fallback: when the nodes lost since the job last
//                  ran exceed parity_nodes m, or leave none of the nodes it ran with (lost
//                  > min(m, ran_with - 1)), memory cannot rebuild the state and the
//                  recovery takes the disk path (rollback to the disk checkpoint, disk
//                  load). The trace does not say which nodes went, so all of them are
//                  assumed to be in one redundancy group (the worst case).
//   kMemoryReplan  kMemory plus replan_s in every recovery, and the rate from
//                  replanned_samples_per_s (the fixed table when that one is empty).
//
// Events during a recovery: a change while a recovery runs restarts it from the change,
// with that change's full cost (detect_s again for a loss); the downtime so far stays
// spent. Losses add up over the recovery: a second loss in a kMemory recovery can push
// the window past m and turn it into a disk fallback (load from disk from then on).
// Too few nodes: a change to a count the job cannot run at puts it to wait (idle, no
// restart counted); the change that makes it runnable again starts a recovery costed as
// an addition, loading from disk if the losses while it waited exceeded m. The first
// start is free: a job whose trace begins with too few nodes starts, at no cost, when
// enough arrive.
//
// Accounting: wall_s = training_s + checkpoint_stall_s + downtime_s + idle_s, and
// useful_samples is what was trained and never rolled back by the end of the trace. Cost
// is node-hours of live nodes (whether or not the job uses them) times the price.
// Pure: no libtorch.
#pragma once

#include <string>
#include <vector>

#include "trireme/plan/trace.h"

namespace trireme::plan {

enum class Policy { kDiskRestart, kMemory, kMemoryReplan };

// "disk-restart" | "memory" | "memory-replan"
const char* policy_name(Policy policy);

struct ReplayOptions {
  std::vector<double> fixed_samples_per_s;      // [n]: layout kept in kind (e.g. shrink dp)
  std::vector<double> replanned_samples_per_s;  // [n]: layout re-planned for n nodes
  int min_nodes = 1;                            // every policy; a zero rate in its table also waits
  double price_per_node_hour = 1.0;             // one price (on-demand or spot)
  double step_s = 1.0;                          // training seconds a step (memory policies)
  // Samples a step trains (the global batch; 0: unknown). Given, the step in flight is
  // counted in samples: with fewer nodes a step takes longer than step_s, the plan's.
  double samples_per_step = 0;
  double checkpoint_every_s = 1800;             // training seconds between disk checkpoints
  double checkpoint_stall_s = 20;               // kDiskRestart only
  double disk_load_s = 60;
  double detect_s = 10;                         // from a loss until the job sees it
  double restart_s = 30;                        // stop and start every process
  double memory_load_s = 5;
  double snapshot_overhead = 0;                 // fraction of training, in [0, 1)
  int parity_nodes = 1;                         // m: losses memory survives at once
  double replan_s = 10;                         // kMemoryReplan only
};

struct SeriesPoint {
  double t_s;
  int live;
  double samples;  // trained and kept so far; drops where a recovery rolls back
};

struct PolicyResult {
  Policy policy = Policy::kDiskRestart;
  double useful_samples = 0;
  double wall_s = 0;                    // the trace's duration
  double goodput_per_hour = 0;          // useful_samples per wall hour
  double node_hours = 0;
  double cost = 0;                      // node_hours * price
  double cost_per_million_samples = 0;  // infinity when nothing useful was trained
  double training_s = 0;                // time spent training, work later lost included
  double checkpoint_stall_s = 0;
  double downtime_s = 0;                // time in recoveries
  double idle_s = 0;                    // waiting with too few nodes
  double work_lost_s = 0;
  int restarts = 0;                     // recoveries started or restarted
  int disk_fallbacks = 0;               // kMemory* recoveries that took the disk path
  int checkpoints = 0;                  // disk checkpoints completed
  std::vector<SeriesPoint> series;      // at t = 0, each change, each recovery end, the end
};

// r(n) for a table: 0 for n <= 0, the last entry past the table's end.
double samples_per_s(const std::vector<double>& table, int nodes);

// The layout a machine's share of the training state depends on.
struct StateLayout {
  int dp = 1, tp = 1, pp = 1;
  int zero = 0;                 // > 0: the optimizer state is split over the dp replicas
  int devices_per_machine = 1;
};

// Bytes of training state one machine holds (what a recovery loads onto it), given the whole
// model's parameter and optimizer state. Each device holds 1 / (tp * pp) of it, since every
// data-parallel replica holds its stage's whole state (the optimizer part / dp under ZeRO);
// a machine holds devices_per_machine devices' worth (at most dp * tp * pp). Example: 16 GB
// of parameters and 48 GB of optimizer state, dp 4 x tp 2 x pp 2, 8 devices a machine:
// 8 * (16 + 48) / 4 = 128 GB without ZeRO, 8 * (16 + 48 / 4) / 4 = 56 GB with it.
// Throws InvalidArgument for a size below 1 or a negative byte count.
double state_bytes_per_machine(double param_bytes, double optimizer_bytes, const StateLayout& layout);

// Throws InvalidArgument naming the bad option or trace.
PolicyResult replay(const Availability& trace, const ReplayOptions& options, Policy policy);

// The three policies, in enum order.
std::vector<PolicyResult> replay_all(const Availability& trace, const ReplayOptions& options);

}  // namespace trireme::plan
