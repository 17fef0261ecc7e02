// The replay of simulate.h: one small state machine per policy, advanced from change to
// change of the trace.
#include "trireme/plan/simulate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "trireme/common/error.h"

namespace trireme::plan {
namespace {

void check_options(const Availability& trace, const ReplayOptions& o) {
  TRIREME_CHECK(!trace.points.empty() && trace.points.front().first == 0,
                "trace ", trace.name, " must start with a point at t = 0; read it with read_trace");
  for (size_t i = 1; i < trace.points.size(); ++i)
    TRIREME_CHECK(trace.points[i].first > trace.points[i - 1].first && trace.points[i].first <= trace.duration_s,
                  "trace ", trace.name, ": point ", i, " is out of order; points must ascend within the duration");
  TRIREME_CHECK(!o.fixed_samples_per_s.empty(), "replay: fixed_samples_per_s is empty; give samples/s per node count");
  for (const auto* table : {&o.fixed_samples_per_s, &o.replanned_samples_per_s})
    for (double r : *table) TRIREME_CHECK(r >= 0, "replay: a throughput table holds ", r, "; rates must be >= 0");
  TRIREME_CHECK(o.samples_per_step >= 0, "replay: samples_per_step must be >= 0 (0: unknown), got ",
                o.samples_per_step);
  TRIREME_CHECK(o.step_s > 0 && o.checkpoint_every_s >= o.step_s,
                "replay: need 0 < step_s <= checkpoint_every_s, got ", o.step_s, " and ", o.checkpoint_every_s);
  TRIREME_CHECK(o.checkpoint_stall_s >= 0 && o.disk_load_s >= 0 && o.detect_s >= 0 && o.restart_s >= 0 &&
                    o.memory_load_s >= 0 && o.replan_s >= 0,
                "replay: stall, load, detect, restart and replan times must be >= 0");
  TRIREME_CHECK(o.snapshot_overhead >= 0 && o.snapshot_overhead < 1,
                "replay: snapshot_overhead is a fraction in [0, 1), got ", o.snapshot_overhead);
  TRIREME_CHECK(o.parity_nodes >= 0 && o.min_nodes >= 0 && o.price_per_node_hour >= 0,
                "replay: parity_nodes, min_nodes and price_per_node_hour must be >= 0");
}

class Replay {
 public:
  Replay(const ReplayOptions& o, Policy policy, int nodes) : o_(o), memory_(policy != Policy::kDiskRestart), n_(nodes) {
    r_.policy = policy;
    table_ = policy == Policy::kMemoryReplan && !o.replanned_samples_per_s.empty() ? &o.replanned_samples_per_s
                                                                                  : &o.fixed_samples_per_s;
    replan_s_ = policy == Policy::kMemoryReplan ? o.replan_s : 0;
    mode_ = runnable() ? kRunning : kWaiting;
    started_ = mode_ == kRunning;
    ran_with_ = n_;
    record();
  }

  // Moves time to t with no change of membership. Each pass either reaches t or ends at a
  // boundary (a recovery's end, a checkpoint), so the loop ends.
  void advance(double t) {
    while (now_ < t) {
      const double left = t - now_;
      if (mode_ == kWaiting) {
        r_.idle_s += left;
        now_ = t;
      } else if (mode_ == kRecovering) {
        const bool ends = until_ <= t;
        r_.downtime_s += ends ? until_ - now_ : left;
        now_ = ends ? until_ : t;
        if (ends) end_recovery();
      } else if (stall_left_ > 0) {  // a disk checkpoint being written
        const double d = std::min(left, stall_left_);
        r_.checkpoint_stall_s += d;
        stall_left_ = d == left ? stall_left_ - d : 0;
        now_ = d == left ? t : now_ + d;
        if (stall_left_ == 0) commit_checkpoint();
      } else {
        const double to_checkpoint = o_.checkpoint_every_s - since_ckpt_s_;
        if (to_checkpoint > left) {
          train(left);
          now_ = t;
        } else {
          train(to_checkpoint);
          now_ += to_checkpoint;
          if (memory_ || o_.checkpoint_stall_s == 0) {
            commit_checkpoint();
          } else {
            stall_left_ = o_.checkpoint_stall_s;
          }
        }
      }
    }
  }

  // The live count becomes `nodes` at the current time.
  void change(int nodes) {
    if (nodes == n_) return;
    record();
    const int lost = std::max(0, n_ - nodes);
    if (mode_ == kRunning) {
      // The step in flight: lost on a memory loss, kept on a memory addition.
      if (memory_ && lost > 0) lose(in_flight_s(), rate());
      stall_left_ = 0;
    }
    n_ = nodes;
    lost_in_window_ += lost;
    if (!started_) {  // the first start is free
      lost_in_window_ = 0;
      if (runnable()) {
        started_ = true;
        mode_ = kRunning;
        ran_with_ = n_;
      }
      record();
      return;
    }
    // Memory rebuilds the state from the survivors: at most m lost, and at least one left.
    if (!memory_ || lost_in_window_ > std::min(o_.parity_nodes, ran_with_ - 1)) fall_back();
    if (!runnable()) {
      mode_ = kWaiting;
    } else {
      mode_ = kRecovering;
      until_ = now_ + (lost > 0 ? o_.detect_s : 0) + o_.restart_s + (from_disk_ ? o_.disk_load_s : o_.memory_load_s) +
               replan_s_;
      ++r_.restarts;
      if (until_ == now_) end_recovery();
    }
    record();
  }

  PolicyResult finish(const Availability& trace) {
    advance(trace.duration_s);
    record();
    r_.useful_samples = samples_;
    r_.wall_s = trace.duration_s;
    r_.goodput_per_hour = r_.wall_s > 0 ? samples_ / (r_.wall_s / 3600) : 0;
    r_.node_hours = summarize(trace).node_hours;
    r_.cost = r_.node_hours * o_.price_per_node_hour;
    r_.cost_per_million_samples =
        samples_ > 0 ? r_.cost / samples_ * 1e6 : std::numeric_limits<double>::infinity();
    return r_;
  }

 private:
  enum Mode { kRunning, kRecovering, kWaiting };

  double rate() const {
    return samples_per_s(*table_, n_) * (memory_ ? 1 - o_.snapshot_overhead : 1.0);
  }
  bool runnable() const { return n_ >= o_.min_nodes && samples_per_s(*table_, n_) > 0; }

  void train(double d) {
    const double s = d * rate();
    r_.training_s += d;
    samples_ += s;
    since_ckpt_samples_ += s;
    since_ckpt_s_ += d;
    since_step_s_ = std::fmod(since_step_s_ + d, o_.step_s);
    if (o_.samples_per_step > 0) since_step_samples_ = std::fmod(since_step_samples_ + s, o_.samples_per_step);
  }

  // Training seconds since the last step boundary. (The rate is constant between
  // boundaries: every change of the live count restarts the job, and a step with it.)
  double in_flight_s() const {
    if (o_.samples_per_step <= 0) return since_step_s_;
    const double r = rate();
    return r > 0 ? since_step_samples_ / r : 0;
  }

  // Throws away the last d seconds of training, done at rate r.
  void lose(double d, double r) {
    r_.work_lost_s += d;
    samples_ -= d * r;
    since_ckpt_samples_ -= d * r;
    since_ckpt_s_ -= d;
    since_step_s_ = since_step_samples_ = 0;
  }

  // A disk checkpoint counts. Memory policies write the snapshot of the last step
  // boundary, so the step in flight stays after it.
  void commit_checkpoint() {
    ++r_.checkpoints;
    const double in_flight = memory_ ? in_flight_s() : 0;
    since_ckpt_s_ = in_flight;
    since_ckpt_samples_ = in_flight * rate();
  }

  // Roll back to the newest disk checkpoint and load from disk when the recovery ends.
  void fall_back() {
    if (from_disk_) return;
    from_disk_ = true;
    if (memory_) ++r_.disk_fallbacks;
    r_.work_lost_s += since_ckpt_s_;
    samples_ -= since_ckpt_samples_;
    since_ckpt_s_ = since_ckpt_samples_ = since_step_s_ = since_step_samples_ = 0;
  }

  void end_recovery() {
    mode_ = kRunning;
    ran_with_ = n_;
    lost_in_window_ = 0;
    from_disk_ = false;
    since_step_s_ = since_step_samples_ = 0;
    record();
  }

  void record() {
    const SeriesPoint p{now_, n_, samples_};
    auto& s = r_.series;
    if (s.empty() || s.back().t_s != p.t_s || s.back().live != p.live || s.back().samples != p.samples)
      s.push_back(p);
  }

  const ReplayOptions& o_;
  const bool memory_;
  const std::vector<double>* table_ = nullptr;
  double replan_s_ = 0;
  PolicyResult r_;
  int n_;
  Mode mode_ = kWaiting;
  bool started_ = false;
  double now_ = 0;
  double until_ = 0;             // end of the recovery (kRecovering)
  double stall_left_ = 0;        // of the disk checkpoint being written (kRunning)
  double samples_ = 0;           // trained and kept
  double since_ckpt_s_ = 0;      // training since the newest disk checkpoint
  double since_ckpt_samples_ = 0;
  double since_step_s_ = 0;      // training since the last step boundary
  double since_step_samples_ = 0;  // (the same in samples, with samples_per_step)
  int lost_in_window_ = 0;       // nodes lost since the job last ran
  int ran_with_ = 0;             // nodes the job last ran with
  bool from_disk_ = false;       // this recovery loads from disk
};

}  // namespace

const char* policy_name(Policy policy) {
  switch (policy) {
    case Policy::kDiskRestart: return "disk-restart";
    case Policy::kMemory: return "memory";
    case Policy::kMemoryReplan: return "memory-replan";
  }
  return "?";
}

double samples_per_s(const std::vector<double>& table, int nodes) {
  if (nodes <= 0 || table.empty()) return 0;
  return table[std::min<size_t>(static_cast<size_t>(nodes), table.size() - 1)];
}

double state_bytes_per_machine(double param_bytes, double optimizer_bytes, const StateLayout& layout) {
  const StateLayout& l = layout;
  TRIREME_CHECK(l.dp >= 1 && l.tp >= 1 && l.pp >= 1 && l.devices_per_machine >= 1 && l.zero >= 0,
                "state_bytes_per_machine: dp, tp, pp and devices_per_machine must be >= 1 and zero >= 0, got dp ", l.dp,
                ", tp ", l.tp, ", pp ", l.pp, ", devices_per_machine ", l.devices_per_machine, ", zero ", l.zero);
  TRIREME_CHECK(param_bytes >= 0 && optimizer_bytes >= 0, "state_bytes_per_machine: byte counts must be >= 0, got ",
                param_bytes, " and ", optimizer_bytes);
  const double shards = static_cast<double>(l.tp) * l.pp;
  const double per_device = (param_bytes + optimizer_bytes / (l.zero > 0 ? l.dp : 1)) / shards;
  return per_device * std::min(static_cast<double>(l.devices_per_machine), shards * l.dp);
}

PolicyResult replay(const Availability& trace, const ReplayOptions& options, Policy policy) {
  check_options(trace, options);
  Replay job(options, policy, trace.points.front().second);
  for (size_t i = 1; i < trace.points.size(); ++i) {
    job.advance(trace.points[i].first);
    job.change(trace.points[i].second);
  }
  return job.finish(trace);
}

std::vector<PolicyResult> replay_all(const Availability& trace, const ReplayOptions& options) {
  std::vector<PolicyResult> out;
  for (Policy p : {Policy::kDiskRestart, Policy::kMemory, Policy::kMemoryReplan})
    out.push_back(replay(trace, options, p));
  return out;
}

}  // namespace trireme::plan
