// `trireme plan`: chooses the layout for a cluster from a profile and writes it as a plan
// for `trireme train --plan`; with --evaluate it predicts one given layout instead.
//   trireme plan --profile profile.json --cluster cluster.json --global-batch 64 --out plan.json
//   trireme plan --profile profile.json --local 2 --evaluate --pp 2 --schedule zb-h1 --micro-batches 4
//   trireme plan --profile profile.json --local 2 --measure-top 3 --out plan.json   (cli/plan_trials.h)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <tuple>

#include "trireme/cli/commands.h"
#include "trireme/cli/flags.h"
#include "trireme/cli/launch_flags.h"
#include "trireme/cli/plan_trials.h"
#include "trireme/cli/profile_source.h"
#include "trireme/cli/train_options.h"
#include "trireme/common/error.h"
#include "trireme/obs/plot.h"
#include "trireme/plan/plan.h"
#include "trireme/plan/search.h"

namespace trireme::cli {
namespace {

struct PlanFlags {
  ProfileSource source;
  std::string cluster, out;
  int local = 0;
  int64_t global_batch = 16;
  int runners_up = 5;
  bool symmetric = false;
  double overlap = -1;
  // --evaluate: this layout instead of a search (placement: rank r on the r-th device).
  bool evaluate = false;
  int dp = 0, tp = 1, pp = 1, chunks = 1, zero = 0;
  int64_t micro_batches = 1;
  std::string schedule, pp_split, replica_batches;
  bool compare_symmetric = false;
  TrialOptions trials;  // --measure-top
};

std::string ms(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), seconds < 0.01 ? "%.2f ms" : "%.1f ms", seconds * 1e3);
  return text;
}

std::string mib(double bytes) {
  char text[32];
  const double m = bytes / (1024.0 * 1024.0);
  std::snprintf(text, sizeof(text), m < 10240 ? "%.1f MiB" : "%.1f GiB", m < 10240 ? m : m / 1024);
  return text;
}

// The flags of --evaluate that need neither the profile nor the cluster, checked as
// `trireme train` checks them (the cost model's own checks name its fields).
void check_evaluate_flags(const PlanFlags& f) {
  TRIREME_CHECK(f.zero >= 0 && f.zero <= 2, "--zero ", f.zero,
                " is not a ZeRO stage; use 1 (optimizer state sharded), 2 (gradients too) or 0 (off)");
  TRIREME_CHECK(f.chunks >= 1, "--chunks must be at least 1, got ", f.chunks);
  if (f.pp != 1) return;
  TRIREME_CHECK(f.schedule.empty(), "--schedule ", f.schedule,
                " needs a pipeline: add --pp 2 or more (or drop --schedule)");
  TRIREME_CHECK(f.chunks == 1, "--chunks ", f.chunks,
                " needs a pipeline: add --pp 2 or more with --schedule interleaved");
  TRIREME_CHECK(f.pp_split.empty(), "--pp-split needs a pipeline: add --pp 2 or more");
}

// --measure-dir is a writable directory or can be made as one: refused before the search
// rather than after it.
void check_measure_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path existing = fs::absolute(dir, ec);
  while (!fs::exists(existing, ec) && existing.has_parent_path() && existing != existing.parent_path())
    existing = existing.parent_path();
  const std::string where = existing == fs::absolute(dir, ec) ? "" : ": " + existing.string();
  TRIREME_CHECK(fs::is_directory(existing, ec), "--measure-dir ", dir, where,
                " is a file, not a directory; choose another path");
  TRIREME_CHECK(::access(existing.c_str(), W_OK) == 0, "--measure-dir ", dir, where,
                " is not writable; choose another path");
}

plan::Layout layout_from_flags(const PlanFlags& f, const plan::Profile& profile, const plan::Cluster& cluster) {
  plan::Layout l;
  const int world = cluster.devices();
  l.tp = f.tp;
  l.pp = f.pp;
  TRIREME_CHECK(l.tp >= 1 && l.pp >= 1, "--tp and --pp must be at least 1");
  TRIREME_CHECK(static_cast<int64_t>(l.tp) * l.pp <= world, "--tp ", l.tp, " x --pp ", l.pp,
                " needs more devices than the cluster's ", world, "; choose sizes whose product divides ", world);
  TRIREME_CHECK(f.dp >= 0, "--dp must be at least 1, got ", f.dp, " (or leave it out: the devices --tp x --pp leave)");
  l.dp = f.dp > 0 ? f.dp : world / (l.tp * l.pp);
  // (In 64 bits: tp x pp is at most the cluster's devices, an int, and so is dp.)
  TRIREME_CHECK(l.dp >= 1 && int64_t{l.dp} * l.tp * l.pp == world, "--dp ", l.dp, " x --tp ", l.tp, " x --pp ",
                l.pp, " does not make the cluster's ", world, " devices; choose sizes whose product is ", world);
  TRIREME_CHECK(f.zero == 0 || l.dp >= 2, "--zero ", f.zero,
                " shards over the data-parallel group, which has 1 rank here; use --dp 2 or more, or drop --zero");
  l.chunks = f.chunks;
  l.zero = f.zero;
  TRIREME_CHECK(f.micro_batches >= 1 && f.micro_batches <= plan::kMaxGlobalBatch && f.global_batch >= 1,
                "--micro-batches and --global-batch must be at least 1 (and --micro-batches at most ",
                plan::kMaxGlobalBatch, ")");
  l.micro_batches = static_cast<int>(f.micro_batches);
  if (l.pp > 1)  // names --schedule, --chunks and --micro-batches
    pipeline::validate({pipeline::parse_schedule(f.schedule.empty() ? "1f1b" : f.schedule), l.pp, l.micro_batches,
                        l.chunks});
  if (!f.replica_batches.empty()) {
    // The runtime's rules and errors for --replica-batches.
    TrainOptions train;
    train.batch = f.global_batch;
    train.dp = l.dp;
    train.micro_batches = l.micro_batches;
    train.replica_batches = f.replica_batches;
    validate_replica_batches(&train, "--global-batch");
    for (int64_t b : train.replica_batch_sizes) l.replica_micro_batch_sizes.push_back(static_cast<int>(b / l.micro_batches));
    l.micro_batch_size = *std::max_element(l.replica_micro_batch_sizes.begin(), l.replica_micro_batch_sizes.end());
  } else {
    TRIREME_CHECK(f.global_batch % (int64_t{l.dp} * l.micro_batches) == 0, "--global-batch ", f.global_batch,
                  " is not divisible by dp x --micro-batches = ", int64_t{l.dp} * l.micro_batches);
    l.micro_batch_size = static_cast<int>(f.global_batch / (l.dp * l.micro_batches));
  }
  if (l.pp > 1) l.schedule = pipeline::parse_schedule(f.schedule.empty() ? "1f1b" : f.schedule);
  const int layers = static_cast<int>(profile.layers.size());
  if (!f.pp_split.empty()) {
    l.split = pipeline::parse_split(f.pp_split, layers, l.pp * l.chunks);
  } else {
    l.split = pipeline::balance_partition(plan::layer_costs(profile, l.micro_batch_size), l.pp * l.chunks);  // what train's --pp-balance time does
  }
  l.ranks = plan::ranks_in_file_order(cluster, world);
  return l;
}

void print_candidate(const plan::Candidate& c, const plan::Cluster& cluster) {
  const plan::Layout& l = c.layout;
  const plan::Estimate& e = c.estimate;
  std::printf("  predicted step %s (%.1f samples/s), pipeline %s, bubble %.0f%%, tp comm %s\n", ms(e.step_s).c_str(),
              e.samples_per_s(l.global_batch()), ms(e.makespan_s).c_str(), e.bubble_fraction * 100,
              ms(e.tp_comm_s).c_str());
  std::printf("  %-5s %-12s %-16s %6s %10s %10s %10s %10s %12s\n", "stage", "group", "layers", "speed", "compute",
              "grad sync", "exposed", "optimizer", "memory/dev");
  for (int s = 0; s < l.pp; ++s) {
    const plan::StageCost& sc = e.stages[s];
    std::string layers;
    for (int v = 0; v < l.chunks; ++v) {
      const auto& r = l.split[v * l.pp + s];
      layers += (v ? "," : "") + std::to_string(r.begin) + ":" + std::to_string(r.end);
    }
    std::string group;  // the groups its replicas run on
    for (int r = 0; r < l.dp; ++r) {
      const std::string& name = cluster.groups[l.ranks[l.rank_of(s, r, 0)].group].name;
      if (("+" + group + "+").find("+" + name + "+") == std::string::npos) group += (group.empty() ? "" : "+") + name;
    }
    std::printf("  %-5d %-12s %-16s %6.2f %10s %10s %10s %10s %12s\n", s, group.c_str(), layers.c_str(), sc.speed,
                ms(sc.compute_s).c_str(), ms(sc.sync_total_s).c_str(), ms(sc.sync_exposed_s).c_str(),
                ms(sc.optimizer_s).c_str(), mib(sc.memory_bytes()).c_str());
  }
}

struct MeasuredChoice {
  double step_s = 0;
  int candidates = 0;
};

// --measure-top: runs K layouts on this machine (the search's best, the best runner-up of
// each other shape, then the next runners-up) and replaces *chosen by the fastest measured.
MeasuredChoice choose_by_trials(const plan::SearchResult& r, const plan::Profile& profile,
                                const plan::Cluster& cluster, const TrialOptions& options, plan::Candidate* chosen) {
  // The model's errors are largest between shapes (a pipeline of one-sequence micro-batches
  // against data parallelism, say), so the trials first take the best of each other
  // dp x tp x pp shape, then the next families in the model's order.
  std::vector<plan::Candidate> candidates{r.best};
  auto shape = [](const plan::Layout& l) { return std::make_tuple(l.dp, l.tp, l.pp); };
  std::vector<bool> taken(r.runners_up.size(), false);
  for (size_t i = 0; i < r.runners_up.size() && static_cast<int>(candidates.size()) < options.candidates; ++i) {
    const plan::Layout& l = r.runners_up[i].first.layout;
    if (std::none_of(candidates.begin(), candidates.end(),
                     [&](const plan::Candidate& c) { return shape(c.layout) == shape(l); })) {
      candidates.push_back(r.runners_up[i].first);
      taken[i] = true;
    }
  }
  for (size_t i = 0; i < r.runners_up.size() && static_cast<int>(candidates.size()) < options.candidates; ++i)
    if (!taken[i]) candidates.push_back(r.runners_up[i].first);
  std::printf("measuring %zu layouts on this machine (%d round(s) of %d steps each) ...\n",
              candidates.size(), options.rounds, options.steps);
  const std::vector<TrialResult> results = measure_candidates(candidates, profile, cluster, options);
  const TrialResult* best = nullptr;
  for (const auto& t : results)
    if (t.measured_step_s > 0 && (!best || t.measured_step_s < best->measured_step_s)) best = &t;
  std::printf("measured (median step, the first 2 steps of each run not counted):\n");
  std::printf("  %10s %10s  %s\n", "predicted", "measured", "layout");
  for (const auto& t : results)
    std::printf("  %10s %10s  %s%s\n", ms(t.candidate.estimate.step_s).c_str(),
                t.measured_step_s > 0 ? ms(t.measured_step_s).c_str() : "failed",
                plan::describe(t.candidate.layout).c_str(), &t == best ? "  <- fastest measured" : "");
  *chosen = best->candidate;
  std::printf("measured choice: %s\n", plan::describe(chosen->layout).c_str());
  // Say when the lead is smaller than the machine's own run-to-run spread.
  const TrialResult* second = nullptr;
  double spread = 0;
  for (const auto& t : results) {
    if (t.measured_step_s <= 0) continue;
    if (&t != best && (!second || t.measured_step_s < second->measured_step_s)) second = &t;
    if (t.round_s.size() >= 2)
      spread = std::max(spread, *std::max_element(t.round_s.begin(), t.round_s.end()) /
                                    *std::min_element(t.round_s.begin(), t.round_s.end()) - 1);
  }
  if (second && second->measured_step_s / best->measured_step_s - 1 < spread)
    std::printf("  note: the runner-up measured only %.1f%% slower, less than the %.1f%% one layout's rounds varied "
                "by here; the two are not told apart on this machine (more --measure-rounds or --measure-steps)\n",
                (second->measured_step_s / best->measured_step_s - 1) * 100, spread * 100);
  if (&results.front() != best && results.front().measured_step_s > 0)
    std::printf("  the cost model's choice measured %s, %.1f%% slower\n", ms(results.front().measured_step_s).c_str(),
                (results.front().measured_step_s / best->measured_step_s - 1) * 100);
  return {best->measured_step_s, static_cast<int>(candidates.size())};
}

}  // namespace

int plan_main(const std::vector<std::string>& args) {
  PlanFlags f;
  FlagParser parser("trireme plan");
  add_profile_flags(parser, &f.source);
  parser.add_switch("compare-symmetric", &f.compare_symmetric,
                    "also plan as symmetric Megatron-style planning would and print the speed-up over it");
  parser.add("cluster", &f.cluster, "cluster description (JSON; see docs/design-notes.md \"Planner\")");
  parser.add("local", &f.local, "plan for N ranks of this machine instead of a cluster file");
  parser.add("global-batch", &f.global_batch, "global batch in sequences");
  parser.add("out", &f.out, "write the chosen plan here (run it: trireme train gpt --plan FILE)");
  parser.add("runners-up", &f.runners_up, "how many other layouts to show");
  parser.add_switch("symmetric", &f.symmetric,
                    "plan as Megatron-style symmetric planning would: devices in file order, even split");
  parser.add("overlap", &f.overlap,
             "share of gradient sync hidden under compute (default: the profile's measurement, else 1)");
  parser.add_switch("evaluate", &f.evaluate, "predict the layout given by the flags below instead of searching");
  parser.add("dp", &f.dp, "with --evaluate: data-parallel size (default: the rest)");
  parser.add("tp", &f.tp, "with --evaluate: tensor-parallel size");
  parser.add("pp", &f.pp, "with --evaluate: pipeline stages");
  parser.add("schedule", &f.schedule, "with --evaluate: gpipe, 1f1b, interleaved, zb-h1");
  parser.add("chunks", &f.chunks, "with --evaluate: chunks per stage (interleaved)");
  parser.add("micro-batches", &f.micro_batches, "with --evaluate: micro-batches per replica");
  parser.add("zero", &f.zero, "with --evaluate: ZeRO stage");
  parser.add("pp-split", &f.pp_split, "with --evaluate: layer split (default: balanced by profiled time)");
  parser.add("replica-batches", &f.replica_batches,
             "with --evaluate: sequences of each data-parallel replica, e.g. 12,4 (default: even)");
  parser.add("measure-top", &f.trials.candidates,
             "run K layouts on this machine (trireme train --plan): the model's choice and the best of other "
             "dp x tp x pp shapes; choose the fastest measured (--local N or \"cpu\" groups only)");
  parser.add("measure-steps", &f.trials.steps, "with --measure-top: steps per trial run (the first 2 not counted)");
  parser.add("measure-rounds", &f.trials.rounds,
             "with --measure-top: runs of each candidate, in a rotated order each round");
  parser.add("measure-dir", &f.trials.dir, "with --measure-top: keep the trial plans, runs and logs here");
  const auto rest = parser.parse(args);
  if (parser.help_requested()) {
    std::fputs("usage: trireme plan --profile profile.json (--cluster cluster.json | --local N)\n"
               "                    [--global-batch B] [--out plan.json] [--evaluate LAYOUT FLAGS]\n"
               "                    [--measure-top K [--measure-steps S] [--measure-rounds R]]\n",
               stdout);
    std::fputs(parser.usage().c_str(), stdout);
    return 0;
  }
  TRIREME_CHECK(rest.empty(), "unexpected argument '", rest.front(), "' for 'trireme plan'; see trireme plan --help");
  TRIREME_CHECK(!parser.given("local") || (f.local >= 1 && f.local <= kMaxProcPerNode), "--local must be in 1..",
                kMaxProcPerNode, " (ranks of this machine, as trireme train --nproc-per-node), got ", f.local);
  TRIREME_CHECK(f.cluster.empty() != !parser.given("local"),
                "give exactly one of --cluster FILE and --local N (N ranks of this machine)");
  TRIREME_CHECK(f.runners_up >= 0, "--runners-up must be >= 0");
  TRIREME_CHECK(f.global_batch >= 1 && f.global_batch <= plan::kMaxGlobalBatch, "--global-batch must be from 1 to ",
                plan::kMaxGlobalBatch, " sequences, got ", f.global_batch);
  TRIREME_CHECK(f.trials.candidates >= 0, "--measure-top must be >= 0 (0: choose by the cost model alone)");
  TRIREME_CHECK(f.trials.candidates == 0 || !f.evaluate,
                "--measure-top chooses among searched layouts; it does not combine with --evaluate");
  // A flag outside its mode would be ignored: refused (given at its default value too).
  if (!f.evaluate) {
    for (const char* flag : {"dp", "tp", "pp", "schedule", "chunks", "micro-batches", "zero", "pp-split",
                             "replica-batches"})
      TRIREME_CHECK(!parser.given(flag), "--", flag, " applies only with --evaluate; add --evaluate or drop --", flag);
  } else {
    for (const char* flag : {"symmetric", "compare-symmetric", "runners-up"})
      TRIREME_CHECK(!parser.given(flag), "--", flag, " applies only to a search, not to --evaluate; drop --", flag,
                    " or --evaluate");
    check_evaluate_flags(f);
  }
  if (f.trials.candidates == 0) {
    for (const char* flag : {"measure-steps", "measure-rounds", "measure-dir"})
      TRIREME_CHECK(!parser.given(flag), "--", flag, " applies only with --measure-top K; add --measure-top or drop --",
                    flag);
  } else {
    // (Checked again by the trials, which come after the search has printed.)
    TRIREME_CHECK(f.trials.steps > 2, "--measure-steps must be more than 2 (the first 2 steps of a trial run are "
                  "not counted), got ", f.trials.steps);
    TRIREME_CHECK(f.trials.rounds >= 1, "--measure-rounds must be at least 1, got ", f.trials.rounds);
    if (!f.trials.dir.empty()) check_measure_dir(f.trials.dir);
  }
  check_profile_flags(f.source);
  const plan::Profile profile = load_profile(f.source);
  const plan::Cluster cluster = f.cluster.empty() ? plan::local_cluster(f.local) : plan::read_cluster(f.cluster);
  if (f.trials.candidates > 0) check_measurable(cluster);

  plan::SearchOptions options;
  options.global_batch = f.global_batch;
  options.aware = !f.symmetric;
  // Trial runs pick among more families than are shown (see choose_by_trials).
  options.runners_up = std::max(f.runners_up, f.trials.candidates > 0 ? 8 * f.trials.candidates : 0);
  options.cost = cost_options_for(profile);
  TRIREME_CHECK(f.overlap == -1 || (f.overlap >= 0 && f.overlap <= 1), "--overlap must be in [0, 1] (the share of "
                "communication hidden behind compute), got ", f.overlap);
  if (f.overlap >= 0) options.cost.overlap = f.overlap;
  // A long search says how far it is, every 5 s (on stderr: stdout stays the plan's report).
  const auto search_start = std::chrono::steady_clock::now();
  auto last_said = search_start;
  options.progress = [&](const std::string& how_far) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_said < std::chrono::seconds(5)) return;
    last_said = now;
    std::fprintf(stderr, "trireme plan: %s (%.0f s)\n", how_far.c_str(),
                 std::chrono::duration<double>(now - search_start).count());
  };
  // (Before anything is printed: a refused layout is one line.)
  const plan::Layout evaluated = f.evaluate ? layout_from_flags(f, profile, cluster) : plan::Layout{};

  std::printf("cluster '%s': %d devices in %zu group(s); profile: %s (%s)\n", cluster.name.c_str(),
              cluster.devices(), cluster.groups.size(), profile.source.c_str(), profile.device.c_str());
  if (!profile.calibration.empty())
    std::printf("calibrated by the profile's measured steps: compute x%.2f without a pipeline, x%.2f in pipelines "
                "(--no-calibration: the layer times alone)\n",
                profile.calibration_factor, profile.pipeline_calibration_factor);
  plan::Candidate chosen;
  MeasuredChoice measured;
  if (f.evaluate) {
    chosen.layout = evaluated;
    chosen.estimate = plan::estimate(profile, cluster, chosen.layout, options.cost);
    std::printf("layout: %s\n", plan::describe(chosen.layout).c_str());
    print_candidate(chosen, cluster);
    TRIREME_CHECK(chosen.estimate.fits, "this layout does not fit: ", chosen.estimate.reason);
  } else {
    const plan::SearchResult r = plan::search(profile, cluster, options);
    chosen = r.best;
    std::printf("searched %lld layouts (%lld more pruned by their lower bound) in %.3f s\n",
                static_cast<long long>(r.evaluated), static_cast<long long>(r.pruned), r.search_s);
    if (r.idle_devices > 0)
      std::printf("no layout runs on all %d devices; the fastest on fewer uses %d and leaves %d idle\n",
                  cluster.devices(), cluster.devices() - r.idle_devices, r.idle_devices);
    std::printf("chosen: %s\n", plan::describe(chosen.layout).c_str());
    print_candidate(chosen, cluster);
    if (!r.runners_up.empty() && f.runners_up > 0) {
      std::printf("runners-up (the best of each other family):\n");
      for (size_t i = 0; i < r.runners_up.size() && static_cast<int>(i) < f.runners_up; ++i) {
        const auto& [c, why] = r.runners_up[i];
        std::printf("  %10s  %-58s  %s\n", ms(c.estimate.step_s).c_str(), plan::describe(c.layout).c_str(),
                    why.c_str());
      }
    }
    if (f.compare_symmetric) {
      plan::SearchOptions symmetric = options;
      symmetric.aware = false;
      try {
        const plan::SearchResult sym = plan::search(profile, cluster, symmetric);
        std::printf("best symmetric layout (devices in file order, even split): %s%s\n",
                    plan::describe(sym.best.layout).c_str(),
                    sym.idle_devices > 0 ? (" (" + std::to_string(sym.idle_devices) + " devices idle)").c_str() : "");
        std::printf("  predicted step %s; the chosen layout is %.2fx faster\n", ms(sym.best.estimate.step_s).c_str(),
                    sym.best.estimate.step_s / chosen.estimate.step_s);
      } catch (const InvalidArgument& e) {
        std::printf("no symmetric layout fits: %s\n", e.what());
      }
    }
    if (!r.rejected.empty()) {
      std::printf("do not fit:\n");
      for (size_t i = 0; i < r.rejected.size() && i < 5; ++i)
        std::printf("  %-40s %s\n", r.rejected[i].first.c_str(), r.rejected[i].second.c_str());
      if (r.rejected.size() > 5) std::printf("  ... and %zu more families\n", r.rejected.size() - 5);
    }
    if (f.trials.candidates > 0) measured = choose_by_trials(r, profile, cluster, f.trials, &chosen);
  }
  if (!f.out.empty()) {
    plan::Plan p = plan::make_plan(profile, cluster, chosen);
    if (measured.step_s > 0) {
      p.measured_step_s = measured.step_s;
      p.measured_candidates = measured.candidates;
    }
    // What the trainer would refuse is not written (--evaluate takes any layout).
    TrainOptions run_as;
    apply_plan(p, f.out, &run_as);
    validate_train_options(&run_as, p.world());
    obs::write_text_file(f.out, plan::to_json(p));
    std::printf("wrote %s; run it: trireme train gpt --nproc-per-node %d --plan %s\n", f.out.c_str(),
                p.world(), f.out.c_str());
  }
  return 0;
}

}  // namespace trireme::cli
