// `trireme simulate`: replays spot availability (a recorded trace or a synthetic one from a
// preemption rate) for a plan on a one-group spot cluster, under three recovery policies
// (restart from a disk checkpoint, in-memory recovery, in-memory recovery re-planning at
// each membership change), and reports goodput, cost per useful sample and the time lost.
//   trireme simulate --plan plan.json --cluster spot.json --profile profile.json
//                    --trace ../shared/traces/bamboo/aws-2021-12/p3-trace.csv --out spot.svg
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "trireme/cli/commands.h"
#include "trireme/cli/flags.h"
#include "trireme/cli/profile_source.h"
#include "trireme/common/error.h"
#include "trireme/obs/plot.h"
#include "trireme/plan/plan.h"
#include "trireme/plan/search.h"
#include "trireme/plan/simulate.h"
#include "trireme/plan/trace.h"

namespace trireme::cli {
namespace {

constexpr double kMaxHours = 87660;  // ten years: the longest trace plan::synthetic_trace makes

struct SimulateFlags {
  ProfileSource source;
  std::string plan, cluster, trace, trace_format = "auto", out;
  double hours = 12;        // synthetic trace length
  int64_t seed = 1;
  double replacement_s = 600;  // synthetic: mean time until a preempted machine is replaced
  double storage_gbps = 10;    // shared storage bandwidth (disk checkpoints), Gb/s per machine
  plan::ReplayOptions replay;
};

// Samples/s of the plan's fixed layout on 1..max_machines machines (plan::fixed_layout):
// 0 where no replica fits or the layout does not fit in memory.
std::vector<double> fixed_rates(const plan::Profile& profile, const plan::Cluster& cluster, const plan::Plan& p,
                                const plan::CostOptions& cost, int max_machines) {
  std::vector<double> rates(max_machines + 1, 0);
  for (int n = 1; n <= max_machines; ++n) {
    const std::optional<plan::Layout> l = plan::fixed_layout(profile, cluster, p, n);
    if (!l) continue;
    plan::Cluster shrunk = cluster;
    shrunk.groups[0].machines = n;
    const plan::Estimate e = plan::estimate(profile, shrunk, *l, cost);
    if (e.fits) rates[n] = e.samples_per_s(l->global_batch());
  }
  return rates;
}

}  // namespace

int simulate_main(const std::vector<std::string>& args) {
  SimulateFlags f;
  plan::ReplayOptions& r = f.replay;
  r.checkpoint_every_s = 1800;
  FlagParser parser("trireme simulate");
  parser.add("plan", &f.plan, "the plan (from trireme plan) the job starts with (required)");
  parser.add("cluster", &f.cluster, "the cluster: one spot group; its trace or preemptions_per_hour is used (required)");
  add_profile_flags(parser, &f.source);
  parser.add("trace", &f.trace, "availability trace (overrides the cluster's); see plan/trace.h for formats");
  parser.add("trace-format", &f.trace_format, "auto, events, count, gcp, asg, step-seconds, step-hours, json-events");
  parser.add("hours", &f.hours, "length of a synthetic trace (when no trace is given)");
  parser.add("seed", &f.seed, "seed of a synthetic trace");
  parser.add("replacement-s", &f.replacement_s, "synthetic trace: mean seconds until a lost machine is replaced");
  parser.add("checkpoint-every-s", &r.checkpoint_every_s, "disk checkpoint interval, seconds of training");
  parser.add("storage-gbps", &f.storage_gbps, "shared storage bandwidth per machine for disk checkpoints, Gb/s");
  parser.add("detect-s", &r.detect_s, "seconds from a machine's loss until the job sees it (node timeout)");
  parser.add("restart-s", &r.restart_s, "seconds to stop and restart every process of the job");
  parser.add("replan-s", &r.replan_s, "seconds to re-plan and re-shard on a membership change (memory-replan)");
  parser.add("parity-nodes", &r.parity_nodes, "machines the in-memory redundancy survives at once (m of K+M)");
  parser.add("snapshot-overhead", &r.snapshot_overhead, "fraction of step time in-memory snapshots cost");
  parser.add("out", &f.out, "draw live machines and useful samples over time (SVG)");
  const auto rest = parser.parse(args);
  if (parser.help_requested()) {
    std::fputs("usage: trireme simulate --plan plan.json --cluster spot.json (--profile profile.json | --analytic "
               "DEVICE ...)\n"
               "                        [--trace FILE [--trace-format F] | --hours H --seed S --replacement-s R]\n"
               "                        [--out spot.svg]\n",
               stdout);
    std::fputs(parser.usage().c_str(), stdout);
    return 0;
  }
  TRIREME_CHECK(rest.empty(), "unexpected argument '", rest.front(), "' for 'trireme simulate'; see trireme "
                "simulate --help");
  TRIREME_CHECK(!f.plan.empty() && !f.cluster.empty(),
                "--plan and --cluster are required (and the plan's --profile or --analytic source)");
  check_profile_flags(f.source);
  TRIREME_CHECK(f.storage_gbps > 0, "--storage-gbps must be positive (Gb/s per machine), got ", f.storage_gbps);
  TRIREME_CHECK(f.hours > 0 && f.hours <= kMaxHours, "--hours must be more than 0 and at most ", kMaxHours,
                " (ten years), got ", f.hours);
  TRIREME_CHECK(f.replacement_s > 0, "--replacement-s must be positive (seconds), got ", f.replacement_s);
  TRIREME_CHECK(f.seed >= 0, "--seed must be >= 0, got ", f.seed);
  // The replay's own checks name its fields; these name the flags, before anything runs.
  TRIREME_CHECK(r.checkpoint_every_s > 0, "--checkpoint-every-s must be positive (seconds of training between "
                "disk checkpoints), got ", r.checkpoint_every_s);
  TRIREME_CHECK(r.detect_s >= 0 && r.restart_s >= 0 && r.replan_s >= 0,
                "--detect-s, --restart-s and --replan-s must be >= 0 (seconds)");
  TRIREME_CHECK(r.parity_nodes >= 0, "--parity-nodes must be >= 0 (m of --redundancy K+M), got ", r.parity_nodes);
  TRIREME_CHECK(r.snapshot_overhead >= 0 && r.snapshot_overhead < 1,
                "--snapshot-overhead must be a fraction in [0, 1), got ", r.snapshot_overhead);
  const plan::Profile profile = load_profile(f.source);
  const plan::Cluster cluster = plan::read_cluster(f.cluster);
  const plan::Plan p = plan::read_plan(f.plan);
  const models::GptConfig& a = p.model;
  const models::GptConfig& b = profile.model;
  TRIREME_CHECK(a.layers == b.layers && a.dim == b.dim && a.heads == b.heads && a.seq_len == b.seq_len &&
                    a.vocab == b.vocab && a.mlp_ratio == b.mlp_ratio,
                f.plan, " is for a model of ", a.layers, " layers, dim ", a.dim, ", but the profile is of ", b.layers,
                " layers, dim ", b.dim, "; give the profile the plan was made from");
  TRIREME_CHECK(cluster.groups.size() == 1, f.cluster, ": the replay needs a cluster of one group of spot machines (it has ",
                cluster.groups.size(), ")");
  const plan::MachineGroup& g = cluster.groups[0];
  plan::Availability trace;
  const std::string trace_path = !f.trace.empty() ? f.trace : g.trace;
  // The flags of the trace not used would be ignored: refused. (Not against a cluster's own
  // trace: scripts give --hours for every cluster, bench/spot_replay among them.)
  for (const char* flag : {"hours", "seed", "replacement-s"})
    TRIREME_CHECK(f.trace.empty() || !parser.given(flag), "--", flag, " shapes a synthetic trace, but --trace ",
                  f.trace, " is given; drop --", flag);
  TRIREME_CHECK(!trace_path.empty() || !parser.given("trace-format"), "--trace-format applies only to a trace file, "
                "and neither --trace nor ", f.cluster, " gives one; add --trace FILE or drop --trace-format");
  if (!trace_path.empty()) {
    trace = plan::read_trace(trace_path, f.trace_format);
  } else {
    TRIREME_CHECK(g.preemptions_per_hour > 0, f.cluster,
                  ": groups[0] has neither a trace nor preemptions_per_hour; give one (or --trace)");
    trace = plan::synthetic_trace(g.machines, g.preemptions_per_hour, f.replacement_s, f.hours * 3600,
                                  static_cast<uint64_t>(f.seed));
  }
  const int max_machines = std::max(trace.peak(), 1);

  plan::SearchOptions options;
  options.global_batch = p.global_batch;
  options.runners_up = 0;
  options.cost = cost_options_for(profile);
  std::fprintf(stderr, "trireme simulate: planning every size from 1 to %d machines\n", max_machines);
  r.fixed_samples_per_s = fixed_rates(profile, cluster, p, options.cost, max_machines);
  r.replanned_samples_per_s.assign(max_machines + 1, 0);
  const std::vector<plan::Candidate> best = plan::best_per_size(profile, cluster, options, max_machines);
  for (int n = 1; n <= max_machines; ++n)
    r.replanned_samples_per_s[n] = best[n].estimate.step_s > 0 ? best[n].estimate.samples_per_s(p.global_batch) : 0;
  // Each policy runs where its own table has a rate (a zero rate is what gates it): the
  // fixed layout's smallest size says nothing about what a re-planned layout runs on.
  r.min_nodes = 1;
  r.price_per_node_hour = g.price_per_hour;
  r.step_s = p.predicted_step_s > 0 ? p.predicted_step_s : 1;
  r.samples_per_step = static_cast<double>(p.global_batch);
  TRIREME_CHECK(r.checkpoint_every_s >= r.step_s, "--checkpoint-every-s ", r.checkpoint_every_s,
                " is shorter than one step of the plan (", r.step_s, " s); give at least one step");
  // The state to load: every device's parameters and optimizer state (mixed precision or
  // fp32, as the profile says), read from shared storage or rebuilt from peers' memory.
  // Each data-parallel replica holds its stage's whole state, so a machine's share is not
  // the model's state over the machines (plan::state_bytes_per_machine).
  double param_bytes = 0, optimizer_bytes = 0;
  for (const plan::LayerProfile& layer : profile.layers) {
    param_bytes += static_cast<double>(layer.parameters) * profile.state.param;
    optimizer_bytes += static_cast<double>(layer.parameters) * profile.state.optimizer;
  }
  const double state_bytes = param_bytes + optimizer_bytes;
  const double per_machine =
      plan::state_bytes_per_machine(param_bytes, optimizer_bytes, {p.dp, p.tp, p.pp, p.zero, g.devices_per_machine});
  r.disk_load_s = per_machine / (f.storage_gbps * 1e9 / 8);  // each machine reads its share
  r.checkpoint_stall_s = 0;  // written in the background from the in-memory snapshot (issue 5)
  const double inter = g.inter.bandwidth_Bps > 0 ? g.inter.bandwidth_Bps : profile.p2p.bandwidth_Bps;
  r.memory_load_s = per_machine / inter;  // a lost machine's share rebuilt over the network

  std::printf("trace: %s, %.2f h, %d..%d machines, %d preemptions\n", trace.name.c_str(), trace.duration_s / 3600,
              plan::summarize(trace).min_live, trace.peak(), plan::summarize(trace).preemptions);
  std::printf("plan: dp %d x tp %d x pp %d, global batch %lld; state %.2f GB; detect %.1f s, restart %.1f s, "
              "load from disk %.1f s / memory %.2f s, checkpoint every %.0f s\n",
              p.dp, p.tp, p.pp, static_cast<long long>(p.global_batch), state_bytes / 1e9, r.detect_s, r.restart_s,
              r.disk_load_s, r.memory_load_s, r.checkpoint_every_s);
  const std::vector<plan::PolicyResult> results = plan::replay_all(trace, r);
  std::printf("%-14s %14s %12s %16s %11s %11s %9s %9s %11s\n", "policy", "samples/hour", "cost", "cost/M samples",
              "down (h)", "lost (h)", "restarts", "fallback", "idle (h)");
  for (const plan::PolicyResult& res : results)
    std::printf("%-14s %14.0f %12.2f %16.3f %11.2f %11.2f %9d %9d %11.2f\n", plan::policy_name(res.policy),
                res.goodput_per_hour, res.cost, res.cost_per_million_samples, res.downtime_s / 3600,
                res.work_lost_s / 3600, res.restarts, res.disk_fallbacks, res.idle_s / 3600);
  if (!f.out.empty()) {
    std::vector<obs::Series> series;
    for (const plan::PolicyResult& res : results) {
      obs::Series s{std::string(plan::policy_name(res.policy)) + ": useful samples (millions)", {}, {}};
      for (const plan::SeriesPoint& point : res.series) {
        s.x.push_back(point.t_s / 3600);
        s.y.push_back(point.samples / 1e6);
      }
      series.push_back(s);
    }
    obs::Series live{"live machines", {}, {}};
    for (const auto& [t, n] : trace.points) {
      live.x.push_back(t / 3600);
      live.y.push_back(n);
    }
    live.x.push_back(trace.duration_s / 3600);
    live.y.push_back(trace.points.empty() ? 0 : trace.points.back().second);
    obs::write_text_file(f.out, obs::line_chart_svg("spot replay: " + trace.name, "hours",
                                                    "useful samples (M)", series) );
    // Beside --out, named after it: DIR/spot.svg -> DIR/spot-machines.svg.
    const std::filesystem::path out_path(f.out);
    const std::string live_out =
        (out_path.parent_path() / (out_path.stem().string() + "-machines.svg")).string();
    obs::write_text_file(live_out, obs::line_chart_svg("live machines: " + trace.name, "hours", "machines", {live}));
    std::printf("wrote %s and %s\n", f.out.c_str(), live_out.c_str());
  }
  return 0;
}

}  // namespace trireme::cli
