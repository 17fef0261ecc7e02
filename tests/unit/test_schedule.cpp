// Pipeline schedules (parallel/pipeline/schedule.h) without processes: all stages are
// simulated together, step by step with a barrier between steps, over a sweep of p, m, v.
// Checked: every micro-batch is forwarded and backwarded exactly once per virtual stage
// (and W once, after its B, where backward is split); every receive is matched by the
// neighbour's send in the same step, in order, and no stage waits forever (deadlock);
// compute only runs on inputs that arrived; peak live activations match the theory; the
// number of steps matches the closed form.
#include <gtest/gtest.h>

#include <deque>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "trireme/common/error.h"
#include "trireme/parallel/pipeline/schedule.h"

using namespace trireme::pipeline;

namespace {

struct Result {
  int steps = 0;
  std::vector<int> peak_live;  // per stage: forwarded, not yet backwarded (B)
};

// Runs the schedule; ADD_FAILUREs on any violated rule. Within a step, sends never block
// and a receive proceeds once the matching send sits at the head of its channel.
Result simulate(const ScheduleSpec& spec) {
  const auto steps = build_schedule(spec);
  const int p = spec.stages, v = spec.chunks, last = p * v - 1;
  Result result;
  result.steps = static_cast<int>(steps.front().size());
  result.peak_live.assign(p, 0);
  std::vector<int> live(p, 0);
  // Channel (from, to, is_gradient) -> FIFO of (micro, receiver chunk).
  std::map<std::tuple<int, int, bool>, std::deque<std::pair<int, int>>> channels;
  std::set<std::tuple<char, int, int>> done;  // (op, micro, virtual stage)
  std::set<std::pair<int, int>> have_act, have_grad, loaded;  // (micro, virtual stage)

  for (size_t k = 0; k < steps.front().size(); ++k) {
    for (int s = 0; s < p; ++s) EXPECT_EQ(steps[s].size(), steps.front().size());
    std::vector<size_t> pc(p, 0);
    bool progressed = true;
    while (progressed) {
      progressed = false;
      for (int s = 0; s < p; ++s) {
        while (pc[s] < steps[s][k].size()) {
          const Instruction& ins = steps[s][k][pc[s]];
          bool blocked = false;
          if (const auto* x = std::get_if<SendActivation>(&ins)) {
            EXPECT_TRUE(done.count({'F', x->micro, x->chunk * p + s})) << "sent before computed";
            channels[{s, x->to_stage, false}].push_back({x->micro, (x->chunk * p + s + 1) / p});
          } else if (const auto* x = std::get_if<SendGradient>(&ins)) {
            EXPECT_TRUE(done.count({'B', x->micro, x->chunk * p + s})) << "sent before computed";
            channels[{s, x->to_stage, true}].push_back({x->micro, (x->chunk * p + s - 1) / p});
          } else if (const auto* x = std::get_if<RecvActivation>(&ins)) {
            auto& q = channels[{x->from_stage, s, false}];
            if (q.empty()) {
              blocked = true;
            } else {
              EXPECT_EQ(q.front(), std::make_pair(x->micro, x->chunk)) << "activation out of order";
              q.pop_front();
              have_act.insert({x->micro, x->chunk * p + s});
            }
          } else if (const auto* x = std::get_if<RecvGradient>(&ins)) {
            auto& q = channels[{x->from_stage, s, true}];
            if (q.empty()) {
              blocked = true;
            } else {
              EXPECT_EQ(q.front(), std::make_pair(x->micro, x->chunk)) << "gradient out of order";
              q.pop_front();
              have_grad.insert({x->micro, x->chunk * p + s});
            }
          } else if (const auto* x = std::get_if<LoadMicroBatch>(&ins)) {
            loaded.insert({x->micro, s});
          } else if (const auto* x = std::get_if<Forward>(&ins)) {
            const int vs = x->chunk * p + s;
            EXPECT_TRUE(done.insert({'F', x->micro, vs}).second) << "F twice";
            if (vs == 0) EXPECT_TRUE(loaded.count({x->micro, s})) << "F before load";
            else if (p > 1) EXPECT_TRUE(have_act.count({x->micro, vs})) << "F without its input";
            else EXPECT_TRUE(done.count({'F', x->micro, vs - 1}));
            result.peak_live[s] = std::max(result.peak_live[s], ++live[s]);
          } else if (const auto* x = std::get_if<BackwardInput>(&ins)) {
            const int vs = x->chunk * p + s;
            EXPECT_EQ(x->with_weights, spec.kind != ScheduleKind::kZbH1);
            EXPECT_TRUE(done.count({'F', x->micro, vs})) << "B before F";
            if (vs != last) {
              if (p > 1) EXPECT_TRUE(have_grad.count({x->micro, vs})) << "B without its gradient";
              else EXPECT_TRUE(done.count({'B', x->micro, vs + 1}));
            }
            EXPECT_TRUE(done.insert({'B', x->micro, vs}).second) << "B twice";
            --live[s];
          } else if (const auto* x = std::get_if<BackwardWeight>(&ins)) {
            const int vs = x->chunk * p + s;
            EXPECT_TRUE(done.count({'B', x->micro, vs})) << "W before B";
            EXPECT_TRUE(done.insert({'W', x->micro, vs}).second) << "W twice";
          }
          if (blocked) break;
          ++pc[s];
          progressed = true;
        }
      }
    }
    for (int s = 0; s < p; ++s)
      if (pc[s] < steps[s][k].size()) {
        ADD_FAILURE() << schedule_name(spec.kind) << " p=" << p << " m=" << spec.micro_batches
                      << " v=" << v << ": stage " << s << " deadlocks in step " << k << " at "
                      << to_string(steps[s][k][pc[s]]);
        return result;
      }
    // Barrier: nothing may be left in flight across a step boundary.
    for (const auto& [key, q] : channels) EXPECT_TRUE(q.empty()) << "message crosses a step";
  }
  const bool split = spec.kind == ScheduleKind::kZbH1;
  for (int vs = 0; vs <= last; ++vs)
    for (int micro = 0; micro < spec.micro_batches; ++micro) {
      EXPECT_TRUE(done.count({'F', micro, vs}));
      EXPECT_TRUE(done.count({'B', micro, vs}));
      EXPECT_EQ(done.count({'W', micro, vs}), split ? 1u : 0u);
    }
  for (int s = 0; s < p; ++s) {
    const Instruction& tail = steps[s].back().back();
    EXPECT_TRUE(std::holds_alternative<OptimizerStep>(tail));
  }
  return result;
}

// Peak live micro-batches on stage s by the schedule's theory.
int theory_peak(const ScheduleSpec& spec, int s) {
  const int p = spec.stages, m = spec.micro_batches, v = spec.chunks;
  switch (spec.kind) {
    case ScheduleKind::kGPipe: return m;
    case ScheduleKind::kOneFOneB:
    case ScheduleKind::kZbH1: return std::min(p - s, m);
    case ScheduleKind::kInterleaved: return std::min(2 * (p - s - 1) + (v - 1) * p + 1, m * v);
  }
  return -1;
}

}  // namespace

TEST(Schedule, EveryScheduleIsCompleteDeadlockFreeAndMatchesTheory) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                            ScheduleKind::kInterleaved, ScheduleKind::kZbH1})
    for (int p : {1, 2, 3, 4, 8})
      for (int m : {1, 2, 3, 4, 8, 16})
        for (int v : {1, 2, 3}) {
          ScheduleSpec spec{kind, p, m, v};
          if (v > 1 && kind != ScheduleKind::kInterleaved) continue;
          if (kind == ScheduleKind::kInterleaved && m % p != 0) continue;
          if (kind == ScheduleKind::kZbH1 && m < p) continue;  // closed form below needs m >= p
          SCOPED_TRACE(std::string(schedule_name(kind)) + " p=" + std::to_string(p) +
                       " m=" + std::to_string(m) + " v=" + std::to_string(v));
          const Result r = simulate(spec);
          EXPECT_EQ(r.steps, expected_steps(spec));
          for (int s = 0; s < p; ++s) EXPECT_EQ(r.peak_live[s], theory_peak(spec, s)) << "stage " << s;
        }
}

TEST(Schedule, ZeroBubbleWithFewMicroBatchesIsStillValid) {
  for (int p : {2, 4, 8})
    for (int m = 1; m < p; ++m) {
      ScheduleSpec spec{ScheduleKind::kZbH1, p, m, 1};
      const Result r = simulate(spec);
      // Never slower than 1F1B with B and W fused into one 2-step backward.
      EXPECT_LE(r.steps, 3 * (m + p - 1));
      for (int s = 0; s < p; ++s) EXPECT_LE(r.peak_live[s], std::min(p - s, m));
    }
}

TEST(Schedule, FirstStageNeverReceivesActivationsAndLastNeverReceivesGradients) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZbH1}) {
    const auto steps = build_schedule({kind, 4, 8, 1});
    for (const auto& step : steps.front())
      for (const auto& ins : step) EXPECT_FALSE(std::holds_alternative<RecvActivation>(ins));
    for (const auto& step : steps.back())
      for (const auto& ins : step) EXPECT_FALSE(std::holds_alternative<RecvGradient>(ins));
  }
}

TEST(Schedule, OneFOneBWarmupAndZeroBubbleDefersWeights) {
  // Stage 0 of 4: three warm-up forwards, then F, B alternate.
  const auto order = compute_order({ScheduleKind::kOneFOneB, 4, 8, 1}, 0);
  std::string text;
  for (size_t i = 0; i < 6; ++i) text += to_string(order[i]) + "; ";
  EXPECT_EQ(text, "F m0 c0; F m1 c0; F m2 c0; F m3 c0; B m0 c0; F m4 c0; ");
  // zb-h1 on stage 2 of 4 keeps two W's pending, so its first W comes after its third B.
  const auto zb = compute_order({ScheduleKind::kZbH1, 4, 8, 1}, 2);
  int bs = 0;
  for (const auto& ins : zb) {
    if (std::holds_alternative<BackwardInput>(ins)) ++bs;
    if (std::holds_alternative<BackwardWeight>(ins)) break;
  }
  EXPECT_EQ(bs, 3);
}

TEST(Schedule, BubbleFractionShrinksAsTheoryPredicts) {
  // Unit-time ops: idle fraction of a stage = 1 - busy/steps.
  auto bubble = [](const ScheduleSpec& spec) {
    const int busy = spec.micro_batches * spec.chunks * (spec.kind == ScheduleKind::kZbH1 ? 3 : 2);
    return 1.0 - static_cast<double>(busy) / expected_steps(spec);
  };
  const int p = 4, m = 8;
  EXPECT_NEAR(bubble({ScheduleKind::kOneFOneB, p, m, 1}), (p - 1.0) / (m + p - 1), 1e-12);
  EXPECT_NEAR(bubble({ScheduleKind::kGPipe, p, m, 1}), (p - 1.0) / (m + p - 1), 1e-12);
  EXPECT_LT(bubble({ScheduleKind::kInterleaved, p, m, 2}), bubble({ScheduleKind::kOneFOneB, p, m, 1}));
  EXPECT_LT(bubble({ScheduleKind::kZbH1, p, m, 1}), bubble({ScheduleKind::kOneFOneB, p, m, 1}) / 2);
}

TEST(Schedule, RefusesInvalidCombinations) {
  EXPECT_THROW(validate({ScheduleKind::kInterleaved, 4, 6, 2}), trireme::InvalidArgument);
  EXPECT_THROW(validate({ScheduleKind::kOneFOneB, 2, 4, 2}), trireme::InvalidArgument);
  EXPECT_THROW(validate({ScheduleKind::kGPipe, 0, 4, 1}), trireme::InvalidArgument);
  EXPECT_THROW(parse_schedule("pipedream"), trireme::InvalidArgument);
  EXPECT_EQ(parse_schedule("zb-h1"), ScheduleKind::kZbH1);
  try {
    validate({ScheduleKind::kInterleaved, 4, 6, 2});
  } catch (const trireme::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of --pp 4"), std::string::npos) << e.what();
  }
}

TEST(Schedule, RefusesSchedulesAboveTheSizeBound) {
  // 3 * p * m * v operations at most: 10^6.
  EXPECT_NO_THROW(validate({ScheduleKind::kOneFOneB, 1, 333333, 1}));
  EXPECT_THROW(validate({ScheduleKind::kOneFOneB, 1, 333334, 1}), trireme::InvalidArgument);
  EXPECT_THROW(validate({ScheduleKind::kInterleaved, 4, 20000, 5}), trireme::InvalidArgument);
  try {
    validate({ScheduleKind::kOneFOneB, 4, 50000000, 1});  // would need tens of GB
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const trireme::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--pp 4 x --micro-batches 50000000 makes a schedule of "
                                         "more than 1000000"),
              std::string::npos)
        << e.what();
  }
  // No int overflow on the way: the largest sizes are refused, not wrapped round.
  const int most = std::numeric_limits<int>::max();
  EXPECT_THROW(validate({ScheduleKind::kOneFOneB, most, most, 1}), trireme::InvalidArgument);
  EXPECT_THROW(validate({ScheduleKind::kInterleaved, 1 << 30, 1 << 30, most}), trireme::InvalidArgument);
  EXPECT_THROW(compute_order({ScheduleKind::kInterleaved, 2, 1 << 30, 1 << 30}, 0), trireme::InvalidArgument);
  EXPECT_THROW(build_schedule({ScheduleKind::kGPipe, 4, 100000000, 1}), trireme::InvalidArgument);
}

#include "trireme/parallel/pipeline/picture.h"

TEST(SchedulePicture, TableEventsAndBubble) {
  const ScheduleSpec one_f_one_b{ScheduleKind::kOneFOneB, 4, 8, 1};
  EXPECT_NEAR(bubble_fraction(one_f_one_b), 3.0 / 11.0, 1e-12);  // (p-1)/(m+p-1)
  const std::string table = schedule_table(one_f_one_b);
  EXPECT_NE(table.find("22 steps (closed form 22)"), std::string::npos) << table;
  EXPECT_NE(table.find("stage 3 |.   .   .   F0  B0  F1  B1"), std::string::npos) << table;
  const ScheduleSpec zb{ScheduleKind::kZbH1, 4, 8, 1};
  EXPECT_LT(bubble_fraction(zb), bubble_fraction(one_f_one_b) / 2);
  const auto events = schedule_events(zb);
  ASSERT_EQ(events.size(), 4u);
  for (const auto& stage : events) {
    int compute = 0;
    for (const auto& e : stage) compute += e.lane == trireme::obs::Lane::kCompute;
    EXPECT_EQ(compute, 3 * 8);  // F, B and W of every micro-batch
  }
  const std::string svg = trireme::obs::timeline_svg("zb-h1 <4>", events);
  EXPECT_EQ(svg.find("<-"), std::string::npos);  // instruction names are escaped
  EXPECT_NE(svg.find("zb-h1 &lt;4&gt;"), std::string::npos);
}
