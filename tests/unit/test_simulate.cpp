// The spot-preemption replay (plan/simulate.h) on traces small enough to work out by hand.
//
// Most cases use the job below: 10 samples/s per node (36/s for 3 nodes when re-planned),
// steps of 30 s, disk checkpoints every 60 s of training stalling 5 s, detect 10 s,
// restart 30 s, load 20 s from disk or 5 s from memory, replan 7 s, one parity node.
#include "trireme/plan/simulate.h"

#include <gtest/gtest.h>


#include "trireme/common/error.h"

using trireme::InvalidArgument;
using trireme::plan::Availability;
using trireme::plan::Policy;
using trireme::plan::PolicyResult;
using trireme::plan::replay;
using trireme::plan::replay_all;
using trireme::plan::ReplayOptions;

namespace {

ReplayOptions hand_job() {
  ReplayOptions o;
  o.fixed_samples_per_s = {0, 10, 20, 30, 40};
  o.replanned_samples_per_s = {0, 10, 20, 36, 40};
  o.step_s = 30;
  o.checkpoint_every_s = 60;
  o.checkpoint_stall_s = 5;
  o.disk_load_s = 20;
  o.detect_s = 10;
  o.restart_s = 30;
  o.memory_load_s = 5;
  o.replan_s = 7;
  o.parity_nodes = 1;
  return o;
}

Availability trace(std::vector<std::pair<double, int>> points, double duration_s = 1000) {
  return Availability{"hand", std::move(points), duration_s};
}

// wall = training + checkpoint stalls + downtime + idle, whatever happened.
void expect_time_adds_up(const PolicyResult& r) {
  EXPECT_NEAR(r.training_s + r.checkpoint_stall_s + r.downtime_s + r.idle_s, r.wall_s, 1e-6 * (1 + r.wall_s))
      << trireme::plan::policy_name(r.policy);
  EXPECT_LE(r.work_lost_s, r.training_s + 1e-9);
  ASSERT_FALSE(r.series.empty());
  EXPECT_EQ(r.series.front().t_s, 0);
  EXPECT_EQ(r.series.back().t_s, r.wall_s);
  EXPECT_DOUBLE_EQ(r.series.back().samples, r.useful_samples);
  for (size_t i = 1; i < r.series.size(); ++i) EXPECT_LE(r.series[i - 1].t_s, r.series[i].t_s);
}

}  // namespace

TEST(SimulateTable, ZeroNodesRunNothingAndPastTheEndUsesTheLastEntry) {
  const std::vector<double> table{0, 10, 25};
  EXPECT_EQ(trireme::plan::samples_per_s(table, 0), 0);
  EXPECT_EQ(trireme::plan::samples_per_s(table, -1), 0);
  EXPECT_EQ(trireme::plan::samples_per_s(table, 1), 10);
  EXPECT_EQ(trireme::plan::samples_per_s(table, 7), 25);
}

TEST(SimulateState, EveryReplicaLoadsItsStagesWholeState) {
  using trireme::plan::state_bytes_per_machine;
  // 16 GB of parameters, 48 GB of optimizer state; dp 4 x tp 2 x pp 2 on 2 machines of 8.
  // Each device holds 64 / 4 = 16 GB; a machine 8 of them. Dividing the model's 64 GB over
  // the 2 machines (32 GB) would miss that 4 replicas each hold a whole copy.
  EXPECT_DOUBLE_EQ(state_bytes_per_machine(16e9, 48e9, {4, 2, 2, 0, 8}), 128e9);
  EXPECT_DOUBLE_EQ(state_bytes_per_machine(16e9, 48e9, {4, 2, 2, 1, 8}), 8 * (16e9 + 12e9) / 4);
  // One device a machine, pure data parallel: every machine holds the whole state.
  EXPECT_DOUBLE_EQ(state_bytes_per_machine(1e9, 2e9, {8, 1, 1, 0, 1}), 3e9);
  // A machine larger than the job holds at most all its devices' state.
  EXPECT_DOUBLE_EQ(state_bytes_per_machine(1e9, 2e9, {2, 1, 1, 0, 8}), 2 * 3e9);
  EXPECT_THROW(state_bytes_per_machine(1e9, 2e9, {0, 1, 1, 0, 1}), InvalidArgument);
  EXPECT_THROW(state_bytes_per_machine(-1, 2e9, {1, 1, 1, 0, 1}), InvalidArgument);
}

TEST(Simulate, ConstantTraceTrainsAtTheTableRateAndPaysForEveryNode) {
  ReplayOptions o;
  o.fixed_samples_per_s = {0, 100, 200, 300, 400, 500, 600, 700, 800};
  o.checkpoint_every_s = 600;
  o.checkpoint_stall_s = 10;
  o.price_per_node_hour = 2.5;
  for (const auto& r : replay_all(trace({{0, 8}}, 3600), o)) {
    SCOPED_TRACE(trireme::plan::policy_name(r.policy));
    EXPECT_DOUBLE_EQ(r.cost, 8 * 1 * 2.5);
    EXPECT_DOUBLE_EQ(r.node_hours, 8);
    EXPECT_EQ(r.restarts, 0);
    EXPECT_EQ(r.work_lost_s, 0);
    expect_time_adds_up(r);
    if (r.policy == Policy::kDiskRestart) {
      // 5 cycles of 600 s training + 10 s stall, then 550 s of training.
      EXPECT_DOUBLE_EQ(r.useful_samples, 800 * 3550.0);
      EXPECT_EQ(r.checkpoints, 5);
      EXPECT_DOUBLE_EQ(r.checkpoint_stall_s, 50);
    } else {
      EXPECT_DOUBLE_EQ(r.useful_samples, 800 * 3600.0);
      EXPECT_DOUBLE_EQ(r.goodput_per_hour, 800 * 3600.0);
      EXPECT_DOUBLE_EQ(r.cost_per_million_samples, 20 / 2.88);
    }
  }
  o.snapshot_overhead = 0.25;  // memory snapshots slow training by a quarter
  EXPECT_DOUBLE_EQ(replay(trace({{0, 8}}, 3600), o, Policy::kMemory).useful_samples, 0.75 * 800 * 3600);
}

TEST(Simulate, OneLossAtHundredSecondsCostsWhatEachPolicySays) {
  const auto results = replay_all(trace({{0, 4}, {100, 3}}), hand_job());
  const auto& disk = results[0];
  // Trains 60 s, checkpoints (65 s), trains 35 s: at the loss those 35 s are lost.
  // Recovery 10 + 30 + 20 = 60 s; from 160 s, 12 cycles of 60 + 5 s and 60 s more.
  EXPECT_DOUBLE_EQ(disk.work_lost_s, 35);
  EXPECT_DOUBLE_EQ(disk.downtime_s, 60);
  EXPECT_DOUBLE_EQ(disk.useful_samples, 60 * 40 + 780 * 30);
  EXPECT_DOUBLE_EQ(disk.checkpoint_stall_s, 13 * 5);
  EXPECT_EQ(disk.restarts, 1);
  EXPECT_EQ(disk.disk_fallbacks, 0);
  const auto& memory = results[1];
  // The step in flight at 100 s began at 90 s: 10 s lost. Recovery 10 + 30 + 5 = 45 s.
  EXPECT_DOUBLE_EQ(memory.work_lost_s, 10);
  EXPECT_DOUBLE_EQ(memory.downtime_s, 45);
  EXPECT_DOUBLE_EQ(memory.useful_samples, 90 * 40 + 855 * 30);
  EXPECT_EQ(memory.restarts, 1);
  const auto& replan = results[2];
  // Recovery 52 s with the re-plan; 3 nodes then train at 36/s.
  EXPECT_DOUBLE_EQ(replan.downtime_s, 52);
  EXPECT_DOUBLE_EQ(replan.useful_samples, 90 * 40 + 848 * 36);
  for (const auto& r : results) {
    EXPECT_DOUBLE_EQ(r.node_hours, (4 * 100 + 3 * 900) / 3600.0);
    expect_time_adds_up(r);
  }
  // The series shows the rollback at 100 s: 4000 samples trained, 3600 kept.
  bool saw_drop = false;
  for (size_t i = 1; i < memory.series.size(); ++i)
    saw_drop |= memory.series[i].t_s == 100 && memory.series[i - 1].samples == 4000 && memory.series[i].samples == 3600;
  EXPECT_TRUE(saw_drop);
}

TEST(Simulate, LosingMoreNodesThanParityFallsBackToDisk) {
  auto o = hand_job();
  const auto fell = replay(trace({{0, 4}, {100, 2}}), o, Policy::kMemory);
  // The background disk checkpoint at 60 s is all that is left: 40 s lost; disk load.
  EXPECT_EQ(fell.disk_fallbacks, 1);
  EXPECT_DOUBLE_EQ(fell.work_lost_s, 40);
  EXPECT_DOUBLE_EQ(fell.downtime_s, 10 + 30 + 20);
  EXPECT_DOUBLE_EQ(fell.useful_samples, 60 * 40 + 840 * 20);
  expect_time_adds_up(fell);
  o.parity_nodes = 2;
  const auto held = replay(trace({{0, 4}, {100, 2}}), o, Policy::kMemory);
  EXPECT_EQ(held.disk_fallbacks, 0);
  EXPECT_DOUBLE_EQ(held.work_lost_s, 10);
  EXPECT_DOUBLE_EQ(held.useful_samples, 90 * 40 + 855 * 20);
  o.parity_nodes = 0;  // no redundancy: any loss goes to disk
  EXPECT_EQ(replay(trace({{0, 4}, {100, 3}}), o, Policy::kMemory).disk_fallbacks, 1);
}

TEST(Simulate, LosingEveryNodeFallsBackToDiskWhateverTheParity) {
  // 2 nodes, parity 1: 1 lost at 100 s recovers from memory (until 145 s). The job then
  // runs on 1 node; losing it at 340 s leaves no survivor to rebuild from, so memory cannot
  // hold the state even though one loss is within parity.
  const auto r = replay(trace({{0, 2}, {100, 1}, {340, 0}, {400, 2}}), hand_job(), Policy::kMemory);
  EXPECT_EQ(r.disk_fallbacks, 1);
  // Lost: the step in flight at 100 s (10 s), at 340 s (15 s, from 325 s), and the 30 s
  // since the background disk checkpoint of 295 s.
  EXPECT_DOUBLE_EQ(r.work_lost_s, 10 + 15 + 30);
  // Back at 400 s: restart 30 s and a disk load of 20 s; then 550 s on 2 nodes.
  EXPECT_DOUBLE_EQ(r.downtime_s, 45 + 30 + 20);
  EXPECT_DOUBLE_EQ(r.idle_s, 60);
  EXPECT_DOUBLE_EQ(r.useful_samples, 90 * 20 + 150 * 10 + 550 * 20);
  expect_time_adds_up(r);
  // Likewise when all nodes go at once, with parity as large as the job.
  auto o = hand_job();
  o.parity_nodes = 2;
  EXPECT_EQ(replay(trace({{0, 2}, {100, 0}, {200, 2}}), o, Policy::kMemory).disk_fallbacks, 1);
}

// The step in flight is a step of the global batch at the rate of the nodes running: with
// fewer nodes than the plan's it takes longer than the plan's step. Here a step of 2
// samples takes 1 s on 3 nodes (the plan) but 2 s on 2; 1.5 s into a run on 2 nodes no
// step has ended, so a loss then takes all 1.5 samples (before, the plan's 1 s step
// wrapped: 0.5 s lost and 1 sample kept).
TEST(Simulate, TheStepInFlightIsOneOfTheGlobalBatchAtTheNodesRate) {
  ReplayOptions o;
  o.fixed_samples_per_s = {0, 1, 1, 2};
  o.step_s = 1;
  o.samples_per_step = 2;
  o.checkpoint_every_s = 100;
  o.checkpoint_stall_s = o.disk_load_s = o.detect_s = o.restart_s = o.memory_load_s = o.replan_s = 0;
  o.parity_nodes = 1;
  const auto r = replay(trace({{0, 2}, {1.5, 1}}, 2), o, Policy::kMemory);
  EXPECT_DOUBLE_EQ(r.work_lost_s, 1.5);
  EXPECT_DOUBLE_EQ(r.useful_samples, 0.5);  // the 0.5 s on 1 node after it
  expect_time_adds_up(r);
  o.samples_per_step = 0;  // unknown: the plan's step, as before
  EXPECT_DOUBLE_EQ(replay(trace({{0, 2}, {1.5, 1}}, 2), o, Policy::kMemory).useful_samples, 1.5);
}

TEST(Simulate, ALossDuringRecoveryRestartsItAndItsLossesAddUp) {
  auto o = hand_job();
  // 100 s: one lost (memory recovery until 145 s). 120 s: a second: two since the job
  // last ran exceed m = 1, so it rolls back to the 60 s checkpoint and recovers from disk
  // until 120 + 60 = 180 s.
  const auto r = replay(trace({{0, 4}, {100, 3}, {120, 2}}), o, Policy::kMemory);
  EXPECT_EQ(r.restarts, 2);
  EXPECT_EQ(r.disk_fallbacks, 1);
  EXPECT_DOUBLE_EQ(r.work_lost_s, 10 + 30);
  EXPECT_DOUBLE_EQ(r.downtime_s, 20 + 60);
  EXPECT_DOUBLE_EQ(r.useful_samples, 60 * 40 + 820 * 20);
  expect_time_adds_up(r);
  o.parity_nodes = 2;  // the same from memory: recovery restarts at 120 s, ends at 165 s
  const auto m2 = replay(trace({{0, 4}, {100, 3}, {120, 2}}), o, Policy::kMemory);
  EXPECT_EQ(m2.disk_fallbacks, 0);
  EXPECT_DOUBLE_EQ(m2.downtime_s, 20 + 45);
  EXPECT_DOUBLE_EQ(m2.useful_samples, 90 * 40 + 835 * 20);
}

TEST(Simulate, AnAdditionDuringRecoveryRestartsItWithoutDetection) {
  // 100 s: a loss (until 145 s); 130 s: a node back, restart + memory load: until 165 s.
  const auto r = replay(trace({{0, 4}, {100, 3}, {130, 4}}), hand_job(), Policy::kMemory);
  EXPECT_EQ(r.restarts, 2);
  EXPECT_DOUBLE_EQ(r.downtime_s, 30 + 35);
  EXPECT_DOUBLE_EQ(r.useful_samples, 90 * 40 + 835 * 40);
  expect_time_adds_up(r);
}

TEST(Simulate, AnAdditionLosesNothingInMemoryButRollsBackOnDisk) {
  const auto results = replay_all(trace({{0, 3}, {100, 4}}), hand_job());
  const auto& disk = results[0];
  // 35 s since the 65 s checkpoint lost; restart + disk load 50 s; from 150 s, 13 cycles
  // of 60 + 5 s and 5 s more.
  EXPECT_DOUBLE_EQ(disk.work_lost_s, 35);
  EXPECT_DOUBLE_EQ(disk.downtime_s, 50);
  EXPECT_DOUBLE_EQ(disk.useful_samples, 60 * 30 + 785 * 40);
  const auto& memory = results[1];
  EXPECT_DOUBLE_EQ(memory.work_lost_s, 0);
  EXPECT_DOUBLE_EQ(memory.downtime_s, 35);
  EXPECT_DOUBLE_EQ(memory.useful_samples, 100 * 30 + 865 * 40);
  for (const auto& r : results) expect_time_adds_up(r);
}

TEST(Simulate, TooFewNodesWaitAndTheReturnCostsARecovery) {
  auto o = hand_job();
  o.min_nodes = 4;
  const auto results = replay_all(trace({{0, 4}, {100, 3}, {500, 4}}), o);
  const auto& disk = results[0];
  EXPECT_DOUBLE_EQ(disk.idle_s, 400);
  EXPECT_DOUBLE_EQ(disk.downtime_s, 30 + 20);
  EXPECT_DOUBLE_EQ(disk.useful_samples, 60 * 40 + 420 * 40);
  const auto& memory = results[1];
  EXPECT_DOUBLE_EQ(memory.idle_s, 400);
  EXPECT_DOUBLE_EQ(memory.downtime_s, 30 + 5);
  EXPECT_DOUBLE_EQ(memory.useful_samples, 90 * 40 + 465 * 40);
  EXPECT_EQ(memory.restarts, 1);
  for (const auto& r : results) expect_time_adds_up(r);
  // A zero in the table works like min_nodes.
  auto zero = hand_job();
  zero.fixed_samples_per_s = {0, 0, 0, 0, 40};
  EXPECT_DOUBLE_EQ(replay(trace({{0, 4}, {100, 3}, {500, 4}}), zero, Policy::kMemory).useful_samples,
                   memory.useful_samples);
}

TEST(Simulate, TheFirstStartIsFree) {
  const auto r = replay(trace({{0, 0}, {100, 4}}), hand_job(), Policy::kMemory);
  EXPECT_EQ(r.restarts, 0);
  EXPECT_DOUBLE_EQ(r.idle_s, 100);
  EXPECT_DOUBLE_EQ(r.useful_samples, 900 * 40);
}

TEST(Simulate, ReplanTableDefaultsToTheFixedOne) {
  auto o = hand_job();
  o.replanned_samples_per_s.clear();
  const auto r = replay(trace({{0, 4}, {100, 3}}), o, Policy::kMemoryReplan);
  EXPECT_DOUBLE_EQ(r.useful_samples, 90 * 40 + 848 * 30);
}

TEST(Simulate, RejectsBadOptionsAndTraces) {
  auto o = hand_job();
  o.fixed_samples_per_s.clear();
  EXPECT_THROW(replay(trace({{0, 4}}), o, Policy::kMemory), InvalidArgument);
  o = hand_job();
  o.snapshot_overhead = 1;
  EXPECT_THROW(replay(trace({{0, 4}}), o, Policy::kMemory), InvalidArgument);
  o = hand_job();
  o.step_s = 120;  // longer than the checkpoint interval
  EXPECT_THROW(replay(trace({{0, 4}}), o, Policy::kMemory), InvalidArgument);
  EXPECT_THROW(replay(trace({{10, 4}}), hand_job(), Policy::kMemory), InvalidArgument);
  EXPECT_THROW(replay(trace({{0, 4}, {0, 3}}), hand_job(), Policy::kMemory), InvalidArgument);
}

TEST(Simulate, SyntheticTraceTimeAddsUpAndMemoryBeatsDisk) {
  const auto t = trireme::plan::synthetic_trace(16, 0.2, 300, 48 * 3600, 3);
  ReplayOptions o;
  o.fixed_samples_per_s = {0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100, 1200, 1300, 1400, 1500, 1600};
  o.min_nodes = 4;
  const auto results = replay_all(t, o);
  for (const auto& r : results) expect_time_adds_up(r);
  EXPECT_GT(results[1].useful_samples, results[0].useful_samples);
  EXPECT_LT(results[1].work_lost_s, results[0].work_lost_s);
  EXPECT_EQ(results[0].restarts, results[1].restarts);  // the same changes, one recovery each
}
