// `trireme profile gpt [model flags] --out profile.json`: measures what the planner needs
// (plan/profile.h) on this machine and writes it as JSON.
//
// The command checks its flags, then launches --nproc-per-node ranks (default 2) through
// the launcher, each running `trireme __profile-worker gpt ARGS` with the same arguments.
// Every rank measures, in step (a barrier before each measurement), so that all cores are
// busy as in multi-rank training:
//   1. a 512^3 fp32 matmul: the device's achieved throughput (reference_tflops)
//   2. point-to-point (ranks 0 and 1) and all-reduce (all ranks) over message sizes from
//      4 bytes to 16 MiB, fitted to latency + bytes / bandwidth
//   3. the overlap of all-reduces with compute: one block's forward and backward at the
//      largest micro-batch alone, 4 MiB all-reduces alone, and both at once
//   4. every layer of the reference GPT at each micro-batch size: F, B, W, activation and
//      output bytes, and the optimizer phase over its parameters (gradient clipping, an
//      AdamW step, zero_grad)
//   5. with exactly 2 ranks, and heads and vocabulary even: every layer again split over
//      the two ranks as a tensor-parallel group (tp 2), the same figures but the optimizer
// (plan/torch/profiler.h says how each is measured.) The layer figures, the overlap and
// the matmul throughput written are the medians over the ranks of each rank's figures
// (with 2 ranks: the mean of the two); the links are rank 0's measurement. Rank 0 prints
// progress on stderr while it goes (a line per timing round, per layer, for the overlap and
// per tensor-parallel layer), a table on stdout at the end, and writes the file.
#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <type_traits>

#include "trireme/cli/commands.h"
#include "trireme/cli/launch_flags.h"
#include "trireme/cli/profile_source.h"
#include "trireme/cli/train_options.h"
#include "trireme/common/error.h"
#include "trireme/dist/world.h"
#include "trireme/obs/clock.h"
#include "trireme/obs/plot.h"
#include "trireme/parallel/tensor/tensor_parallel.h"
#include "trireme/plan/profile.h"
#include "trireme/plan/torch/profiler.h"

namespace trireme::cli {
namespace {

constexpr const char* kProfileHelp =
    "usage: trireme profile gpt [--vocab V --seq T --layers L --dim C --heads H --mlp-ratio R]\n"
    "                           [--micro-batch-sizes 1,2,4,8 --repeats N --nproc-per-node P]\n"
    "                           [--out profile.json]\n"
    "Measures the reference GPT on this machine for the planner: per layer and micro-batch\n"
    "size the forward (F), input-gradient (B) and weight-gradient (W) times, activation and\n"
    "output bytes and the optimizer phase (clip, AdamW step, zero_grad); with P = 2 the\n"
    "same per layer split over both ranks (tensor parallel, tp 2); point-to-point and\n"
    "all-reduce latency and bandwidth between P local ranks (one intra-op thread each), and\n"
    "how much of an all-reduce hides under compute; the achieved matmul throughput.\n"
    "Writes the profile as JSON (read by trireme plan).\n";

// Seed of the model and the random inputs on every rank: the tensor-parallel ranks must
// build the same model and see the same tokens.
constexpr uint64_t kSeed = 1234;

struct ProfileOptions {
  models::GptConfig model;
  std::string micro_batch_sizes = "1,2,4,8";
  int repeats = 5;
  std::string out = "profile.json";
  std::vector<int64_t> micro_batches;  // parsed from micro_batch_sizes, ascending
};

// The model flags carry the names of `trireme train gpt`'s (cli/train_options.cpp), plus
// --vocab and --mlp-ratio, which change the cost of a layer.
void add_profile_command_flags(FlagParser& p, ProfileOptions* o) {
  add_model_flags(p, &o->model);
  p.add("vocab", &o->model.vocab, "vocabulary size (256: the byte tokenizer)");
  p.add("mlp-ratio", &o->model.mlp_ratio, "MLP hidden width as a multiple of --dim");
  p.add("micro-batch-sizes", &o->micro_batch_sizes,
        "micro-batch sizes (sequences) to time each layer at, comma-separated");
  p.add("repeats", &o->repeats, "timed runs per median (after one warm-up)");
  p.add("out", &o->out, "where to write the profile (JSON)");
}

std::vector<int64_t> parse_micro_batches(const std::string& text) {
  const std::string hint =
      "--micro-batch-sizes takes positive integers up to 999999 separated by commas (e.g. 1,2,4,8), got '" + text +
      "'";
  std::vector<int64_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const bool digits = item.find_first_not_of("0123456789") == std::string::npos;
    TRIREME_CHECK(!item.empty() && item.size() <= 6 && digits, hint);
    const int64_t b = std::stoll(item);
    TRIREME_CHECK(b >= 1, hint);
    sizes.push_back(b);
  }
  TRIREME_CHECK(!sizes.empty() && text.back() != ',', hint);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

void finish_profile_options(ProfileOptions* o) {
  o->model.validate();
  o->micro_batches = parse_micro_batches(o->micro_batch_sizes);
  TRIREME_CHECK(o->repeats >= 1 && o->repeats <= 1000, "--repeats must be in 1..1000, got ", o->repeats);
  TRIREME_CHECK(!o->out.empty(), "--out needs a file name, e.g. --out profile.json");
}

// --out names a file in a directory that exists and is writable.
void check_output_file(const std::string& out) {
  namespace fs = std::filesystem;
  TRIREME_CHECK(!fs::is_directory(out), "--out ", out, " is a directory; name a file, e.g. --out ", out,
                "/profile.json");
  const fs::path dir = fs::absolute(out).parent_path();
  TRIREME_CHECK(fs::is_directory(dir), "--out ", out, ": directory ", dir.string(),
                " does not exist; create it or choose another path");
  TRIREME_CHECK(::access(dir.c_str(), W_OK) == 0, "--out ", out, ": directory ", dir.string(),
                " is not writable; choose another path");
}

// What each rank measured that is combined across ranks.
struct RankFigures {
  std::vector<plan::LayerProfile> layers;
  std::vector<plan::WholeModelTiming> whole_model;
  std::vector<plan::TrainingStepTiming> training_step;
  std::vector<plan::PipelineStepTiming> pipeline_step;
  double tflops = 0;
  double overlap = 0;
};

// Applies `f` to every figure of `r` (a RankFigures, const or not), in a fixed order: the
// same on every rank, since all ranks measure the same rows.
template <class Figures, class F>
void for_each_figure(Figures& r, F&& f) {
  const auto row = [&](auto& t) {
    f(t.forward_s);
    f(t.backward_input_s);
    f(t.backward_weight_s);
    f(t.activation_bytes);
    f(t.output_bytes);
  };
  for (auto& layer : r.layers) {
    f(layer.optimizer_s);
    for (auto& t : layer.timings) row(t);
    for (auto& tp : layer.tensor_parallel)
      for (auto& t : tp.timings) row(t);
  }
  for (auto& w : r.whole_model) f(w.forward_backward_s);
  for (auto& t : r.training_step) f(t.step_s);
  for (auto& t : r.pipeline_step) f(t.step_s);
  f(r.tflops);
  f(r.overlap);
}

std::vector<double> figures(const RankFigures& r) {
  std::vector<double> v;
  for_each_figure(r, [&](const auto& x) { v.push_back(static_cast<double>(x)); });
  return v;
}

std::string figures_text(const std::vector<double>& values) {
  std::string text;
  char buf[32];
  for (const double x : values) {
    std::snprintf(buf, sizeof(buf), "%.17g ", x);
    text += buf;
  }
  return text;
}

// Replaces each figure of `r` by its median over the ranks' texts.
void take_rank_medians(const std::vector<std::string>& texts, RankFigures* r) {
  const size_t count = figures(*r).size();
  std::vector<std::vector<double>> per_figure(count);
  for (const std::string& text : texts) {
    std::istringstream in(text);
    for (size_t i = 0; i < count; ++i) {
      double x = 0;
      TRIREME_ENFORCE_EQ(static_cast<bool>(in >> x), true, "(a rank sent fewer profile figures)");
      per_figure[i].push_back(x);
    }
  }
  std::vector<double> m;
  for (auto& values : per_figure) m.push_back(plan::median(std::move(values)));
  size_t at = 0;
  for_each_figure(*r, [&](auto& x) {
    if constexpr (std::is_integral_v<std::decay_t<decltype(x)>>)
      x = std::llround(m[at++]);
    else
      x = m[at++];
  });
}

std::string format(const char* fmt, double a, double b = 0, double c = 0, double d = 0) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), fmt, a, b, c, d);
  return buf;
}

std::string link_line(const char* what, const plan::LinkMeasurement& m) {
  return std::string(what) +
         format(" latency %.1f us, bandwidth %.2f GB/s (fitted over %.0f sizes: ", m.link.latency_s * 1e6,
                m.link.bandwidth_Bps / 1e9, static_cast<double>(m.bytes.size())) +
         format("%.0f B in %.1f us ... %.1f MiB in %.2f ms)", m.bytes.front(), m.seconds.front() * 1e6,
                m.bytes.back() / (1 << 20), m.seconds.back() * 1e3);
}

std::string timing_text(const plan::LayerTiming& t) {
  return "b=" + std::to_string(t.micro_batch) +
         format(" F %.3f B %.3f W %.3f ms", t.forward_s * 1e3, t.backward_input_s * 1e3,
                t.backward_weight_s * 1e3);
}

std::string layer_line(const plan::LayerProfile& layer, size_t index, size_t count) {
  std::string line = "[" + std::to_string(index) + "/" + std::to_string(count) + "] " + layer.name +
                     format(": %.0f params, ", static_cast<double>(layer.parameters)) +
                     timing_text(layer.timings.front());
  if (layer.timings.size() > 1) line += ", " + timing_text(layer.timings.back());
  line += format(", activations %.1f KiB at b=%.0f, optimizer %.3f ms",
                 static_cast<double>(layer.timings.front().activation_bytes) / 1024,
                 static_cast<double>(layer.timings.front().micro_batch), layer.optimizer_s * 1e3);
  return line;
}

std::string overlap_line(const plan::OverlapMeasurement& m) {
  return format("overlap %.2f: compute %.1f ms alone (%.0f block steps), ", m.overlap, m.compute_s * 1e3,
                m.compute_runs) +
         format("%.0f all-reduces of %.0f MiB %.1f ms alone, ", m.allreduces,
                static_cast<double>(m.allreduce_bytes) / (1 << 20), m.communication_s * 1e3) +
         format("both %.1f ms", m.both_s * 1e3);
}

std::string tensor_parallel_line(const plan::LayerProfile& layer) {
  const std::vector<plan::LayerTiming>& rows = layer.tensor_parallel.front().timings;
  std::string line = layer.name + " at tp=" + std::to_string(layer.tensor_parallel.front().tp) + ": " +
                     timing_text(rows.front());
  if (rows.size() > 1) line += ", " + timing_text(rows.back());
  return line;
}

// One row per layer, micro-batch size and tensor-parallel size.
std::string summary_table(const plan::Profile& p) {
  std::string text = "layer         tp      b      F ms      B ms      W ms  activ. KiB  output KiB\n";
  const auto rows = [&](const std::string& name, int tp, const std::vector<plan::LayerTiming>& timings) {
    for (const auto& t : timings) {
      char row[160];
      std::snprintf(row, sizeof(row), "%-12s %3d %6lld %9.3f %9.3f %9.3f %11.1f %11.1f\n", name.c_str(), tp,
                    static_cast<long long>(t.micro_batch), t.forward_s * 1e3, t.backward_input_s * 1e3,
                    t.backward_weight_s * 1e3, static_cast<double>(t.activation_bytes) / 1024,
                    static_cast<double>(t.output_bytes) / 1024);
      text += row;
    }
  };
  for (const auto& layer : p.layers) {
    rows(layer.name, 1, layer.timings);
    for (const auto& tp : layer.tensor_parallel) rows(layer.name, tp.tp, tp.timings);
  }
  return text;
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "this machine";
  return name;
}

}  // namespace

int profile_main(const std::vector<std::string>& args) {
  ProfileOptions opt;
  LaunchFlags launch_flags;
  launch_flags.options.nproc_per_node = 2;  // communication needs two ranks
  FlagParser parser("trireme profile");
  add_launch_flags(parser, &launch_flags, LaunchFlagSet::kPlacement);
  add_profile_command_flags(parser, &opt);
  const auto positional = parser.parse(args);
  if (parser.help_requested()) {
    std::fputs(kProfileHelp, stdout);
    std::fputs(parser.usage().c_str(), stdout);
    return 0;
  }
  TRIREME_CHECK(!positional.empty(), "name the model to profile: trireme profile gpt ...");
  TRIREME_CHECK(positional[0] == "gpt", "unknown model '", positional[0], "'; the available model is: gpt");
  TRIREME_CHECK(positional.size() == 1, "unexpected argument '", positional[1], "' after 'trireme profile gpt'; run "
                "'trireme profile --help' for the flags");
  // (Before the launcher's own checks, which would ask an elastic job for --max-restarts.)
  TRIREME_CHECK(launch_flags.nnodes.find(':') == std::string::npos,
                "--nnodes MIN:MAX: a profile needs a fixed set of ranks; give --nnodes N");
  finish_profile_options(&opt);
  check_output_file(opt.out);

  std::vector<std::string> command = {self_executable(), "__profile-worker"};
  command.insert(command.end(), args.begin(), args.end());
  // The workers write the file: give them the path as this process sees it.
  command.insert(command.end(), {"--out", std::filesystem::absolute(opt.out).string()});
  const launch::LaunchOptions launch_options = finish_launch_flags(launch_flags, command);
  TRIREME_CHECK(launch_options.nproc_per_node * launch_options.nnodes >= 2, "--nproc-per-node ",
                launch_options.nproc_per_node,
                ": trireme profile measures communication between ranks and needs at least 2; use "
                "--nproc-per-node 2 (the default)");

  const launch::LaunchResult result = launch::launch(launch_options);
  if (!result.failure.empty()) std::fprintf(stderr, "trireme profile: %s\n", result.failure.c_str());
  return result.exit_code;
}

int profile_worker_main(const std::vector<std::string>& args) {
  const double start_us = obs::now_us();
  ProfileOptions opt;
  FlagParser parser("trireme profile");
  add_profile_command_flags(parser, &opt);
  parser.parse(args, /*allow_unknown=*/true);  // the launcher's flags are in args too
  finish_profile_options(&opt);

  dist::WorldOptions world_options;
  world_options.on_store_retry = report_store_retry;
  dist::World world = dist::World::from_env(world_options);
  const int rank = world.rank();
  const bool leader = rank == 0;
  // One intra-op thread per rank unless the launcher says otherwise, as the trainer does.
  const char* threads_env = std::getenv("OMP_NUM_THREADS");
  at::set_num_threads(threads_env ? std::max(1, std::atoi(threads_env)) : 1);
  const int threads = at::get_num_threads();
  world.announce_role("profiler rank " + std::to_string(rank) + " of " + std::to_string(world.size()));
  const dist::Group& group = world.group();
  const auto in_step = [&] { dist::run_collective("profile barrier", [&] { return group->barrier(); }); };
  const auto say = [&](const std::string& line) {
    if (leader) std::fprintf(stderr, "profile: %s\n", line.c_str());
  };

  say("measuring on " + std::to_string(world.size()) + " ranks, " + std::to_string(threads) +
      " thread(s) each, " + std::to_string(opt.repeats) + " repeats per median");
  // A matmul takes milliseconds: many samples cost little and steady the median.
  const double tflops = plan::measure_matmul_tflops(std::max(10 * opt.repeats, 50), in_step);
  say(format("fp32 matmul 512^3: %.1f GFLOP/s", tflops * 1e3));
  const std::vector<int64_t> sizes = plan::message_sizes();
  const plan::LinkMeasurement p2p = plan::measure_p2p(group, sizes, opt.repeats);
  say(link_line("point-to-point", p2p));
  const plan::LinkMeasurement allreduce = plan::measure_allreduce(group, sizes, opt.repeats);
  say(link_line("all-reduce (bus)", allreduce));
  const plan::OverlapMeasurement overlap = plan::measure_overlap(
      group, plan::block_step_job(opt.model, opt.micro_batches.back(), kSeed), opt.repeats);
  say(overlap_line(overlap) + " (rank 0)");

  plan::LayerMeasureOptions layer_options;
  layer_options.model = opt.model;
  layer_options.micro_batches = opt.micro_batches;
  layer_options.repeats = opt.repeats;
  layer_options.seed = kSeed;
  layer_options.in_step = in_step;
  const size_t layer_count = static_cast<size_t>(opt.model.layers) + 2;
  size_t measured = 0;
  std::string what = "layers";
  layer_options.on_round = [&](int done, int rounds, double seconds) {
    const int per_size = opt.repeats + 1;  // a warm-up round and the timed ones
    if (done % per_size == 0)
      say(what + " timed at b=" + std::to_string(opt.micro_batches[done / per_size - 1]) +
          format(" (%.0f of %.0f rounds, %.1f s)", done, rounds, seconds));
  };
  layer_options.on_layer = [&](const plan::LayerProfile& layer) {
    say(layer_line(layer, ++measured, layer_count));
  };
  RankFigures mine{plan::measure_layers(layer_options), {}, {}, {}, tflops, overlap.overlap};
  layer_options.on_round = nullptr;
  mine.whole_model = plan::measure_whole_model(layer_options);
  say("whole model timed in place at every b");
  mine.training_step = plan::measure_training_step(layer_options, group);
  say("data-parallel training steps timed at every b");
  if (world.size() >= 2 && static_cast<size_t>(world.size()) <= layer_count) {
    mine.pipeline_step = plan::measure_pipeline_step(layer_options, group);
    say("pipeline (1F1B) training steps timed at every b");
  }

  // Tensor parallel over both ranks: the group is the whole world, as with --tp 2.
  constexpr int kTensorParallel = 2;
  if (world.size() == kTensorParallel && opt.model.heads % kTensorParallel == 0 &&
      opt.model.vocab % kTensorParallel == 0) {
    tensor::TensorParallel tp;
    tp.group = group;
    tp.rank = rank;
    tp.size = kTensorParallel;
    tp.rng = std::make_shared<tensor::RngTracker>(kSeed, rank);
    what = "tensor-parallel (tp=2) layers";
    layer_options.on_layer = nullptr;
    std::vector<plan::TensorParallelTimings> split = plan::measure_tensor_parallel_layers(layer_options, tp);
    for (size_t l = 0; l < split.size(); ++l) {
      mine.layers[l].tensor_parallel.push_back(std::move(split[l]));
      say(tensor_parallel_line(mine.layers[l]));
    }
  } else {
    say("no tensor-parallel timings: they need exactly 2 ranks and an even number of heads and vocabulary");
  }

  const std::vector<std::string> texts = world.gather_on_leader("profile-figures", figures_text(figures(mine)));
  if (!leader) return 0;
  take_rank_medians(texts, &mine);

  plan::Profile profile;
  profile.source = "measured by trireme profile on " + hostname();
  profile.device = "cpu, " + std::to_string(threads) + (threads == 1 ? " thread" : " threads") + " per rank";
  profile.reference_tflops = mine.tflops;
  profile.threads = threads;
  profile.model = opt.model;
  profile.state = plan::StateBytes{4, 4, 8};  // fp32 parameters and gradients, AdamW's two moments
  profile.p2p = p2p.link;
  profile.allreduce = allreduce.link;
  profile.allreduce_world = world.size();
  profile.overlap = mine.overlap;
  profile.repeats = opt.repeats;
  profile.layers = std::move(mine.layers);
  profile.whole_model = std::move(mine.whole_model);
  profile.training_step = std::move(mine.training_step);
  profile.pipeline_step = std::move(mine.pipeline_step);
  obs::write_text_file(opt.out, plan::to_json(profile));

  std::fputs(summary_table(profile).c_str(), stdout);
  std::printf("%s\n%s\noverlap %.2f (median over ranks; rank 0: %s)\n"
              "reference throughput %.4f TFLOPS (fp32 matmul, %d thread(s))\n",
              link_line("point-to-point", p2p).c_str(), link_line("all-reduce (bus)", allreduce).c_str(),
              profile.overlap, overlap_line(overlap).c_str(), profile.reference_tflops, threads);
  for (const plan::WholeModelTiming& w : profile.whole_model)
    std::printf("whole model at b=%lld: forward+backward %.2f ms in place, %.2fx the sum of its layers' parts\n",
                static_cast<long long>(w.micro_batch), w.forward_backward_s * 1e3,
                plan::in_place_factor(profile, static_cast<double>(w.micro_batch)));
  plan::Profile calibrated = profile;
  plan::calibrate(&calibrated, cost_options_for(profile));
  for (size_t i = 0; i < profile.training_step.size(); ++i)
    std::printf("data-parallel step (dp %d) at b=%lld: %.2f ms measured; compute in training %.2fx as profiled\n",
                profile.training_step[i].data_parallel, static_cast<long long>(profile.training_step[i].micro_batch),
                profile.training_step[i].step_s * 1e3, calibrated.calibration[i].factor);
  for (size_t i = 0; i < profile.pipeline_step.size(); ++i) {
    const plan::PipelineStepTiming& t = profile.pipeline_step[i];
    std::printf("pipeline step (1f1b, %d stages %s, m %d) at b=%lld: %.2f ms measured; compute in training %.2fx "
                "as profiled\n", t.stages, t.split.c_str(), t.micro_batches, static_cast<long long>(t.micro_batch),
                t.step_s * 1e3, calibrated.calibration[profile.training_step.size() + i].factor);
  }
  if (!profile.training_step.empty())
    std::printf("calibration: compute in training %.2fx as profiled without a pipeline, %.2fx in pipelines "
                "(the medians; trireme plan applies them, --no-calibration does not)\n",
                calibrated.calibration_factor, calibrated.pipeline_calibration_factor);
  std::printf("profile: %s (%.1f s)\n", opt.out.c_str(), (obs::now_us() - start_us) / 1e6);
  std::fflush(stdout);
  return 0;
}

}  // namespace trireme::cli
