// DataParallel and ZeRO with a shared (tied) weight: one tensor registered in two
// submodules, which libtorch's Module::parameters() lists twice. DataParallel must take
// part in it once (one slot, one hook, its gradient sent once), so that AdamW over
// dp.parameters(), ZeRO-1 and ZeRO-2 each update it as one process updates the
// deduplicated parameter list. Ranks are threads over real Gloo groups (STYLE 9); the
// weights after two steps are compared with one-process AdamW (max abs diff printed); and a
// ZeRO-1 checkpoint keeps the shared weight's moments under both of its names.
#include <gtest/gtest.h>

#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <set>

#include "ranks.h"
#include "trireme/ft/resume.h"
#include "trireme/parallel/data/data_parallel.h"
#include "trireme/parallel/data/zero.h"
#include "worlds.h"

using trireme::parallel::DataParallel;
using trireme::parallel::DataParallelOptions;
using trireme::parallel::ZeroOptimizer;
using trireme::testing::run_ranks;

namespace {

// Holds a weight it is given, registered under its own name (the tied copy).
struct TiedImpl : torch::nn::Module {
  explicit TiedImpl(const at::Tensor& shared) { weight = register_parameter("weight", shared); }
  at::Tensor weight;
};
TORCH_MODULE(Tied);

// x (B,6) -> embed (B,4) -> tanh -> mid (B,4) -> tanh -> back through embed's weight (B,6).
struct TiedNetImpl : torch::nn::Module {
  TiedNetImpl() {
    embed = register_module("embed", torch::nn::Linear(6, 4));
    mid = register_module("mid", torch::nn::Linear(4, 4));
    head = register_module("head", Tied(embed->weight));
  }
  at::Tensor forward(const at::Tensor& x) {
    return at::matmul(at::tanh(mid->forward(at::tanh(embed->forward(x)))), head->weight);
  }
  torch::nn::Linear embed{nullptr}, mid{nullptr};
  Tied head{nullptr};
};
TORCH_MODULE(TiedNet);

TiedNet make_tied_net() {
  static std::mutex mutex;  // ranks are threads sharing libtorch's global generator
  std::lock_guard<std::mutex> lock(mutex);
  at::manual_seed(5);
  return TiedNet();
}

// The parameters once each, in first-registration order.
std::vector<at::Tensor> unique_parameters(torch::nn::Module& net) {
  std::vector<at::Tensor> out;
  std::set<const void*> seen;
  for (const auto& p : net.parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

constexpr int64_t kRows = 8;  // global batch
constexpr int kSteps = 2;
constexpr int kWorld = 2;

at::Tensor batch(int step) {
  return at::arange(kRows * 6, at::kFloat).reshape({kRows, 6}).mul(0.07 * (step + 1)).sin();
}

torch::optim::AdamWOptions adamw_options() { return torch::optim::AdamWOptions(0.05).weight_decay(0.1); }

// One process: kSteps on the whole batch, `adamw` over the deduplicated parameters.
void train_whole_batch(TiedNet& net, torch::optim::AdamW& adamw) {
  for (int step = 0; step < kSteps; ++step) {
    net->forward(batch(step)).square().mean().backward();
    adamw.step();
    adamw.zero_grad();
  }
}

// The parameters one process ends with (train_whole_batch).
std::vector<at::Tensor> reference_parameters() {
  TiedNet net = make_tied_net();
  torch::optim::AdamW adamw(unique_parameters(*net), adamw_options());
  train_whole_batch(net, adamw);
  std::vector<at::Tensor> out;
  for (const auto& p : unique_parameters(*net)) out.push_back(p.detach().clone());
  return out;
}

// The parameters by name, as libtorch lists them (the tied weight twice).
std::vector<std::pair<std::string, at::Tensor>> named(torch::nn::Module& net) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : net.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

// zero_stage 0: plain DataParallel and libtorch's AdamW over dp.parameters().
void check_shared(int zero_stage) {
  const std::vector<at::Tensor> reference = reference_parameters();
  std::vector<double> diffs(kWorld);
  run_ranks(kWorld, [&](int rank, const trireme::dist::Group& group) {
    TiedNet net = make_tied_net();
    ASSERT_EQ(net->parameters().size(), 5u) << "libtorch lists the tied weight twice";
    DataParallelOptions options;
    options.buckets.cap_bytes = options.buckets.first_cap_bytes = 40;  // several buckets
    options.rebuild_buckets = zero_stage == 0;
    if (zero_stage == 2) options.reduction = DataParallelOptions::Reduction::kReduceScatter;
    DataParallel dp(net.ptr(), group, options);
    EXPECT_EQ(dp.parameters().size(), unique_parameters(*net).size());
    std::unique_ptr<ZeroOptimizer> zero;
    std::unique_ptr<torch::optim::AdamW> adamw;
    if (zero_stage > 0)
      zero = std::make_unique<ZeroOptimizer>(dp, zero_stage, adamw_options());
    else
      adamw = std::make_unique<torch::optim::AdamW>(dp.parameters(), adamw_options());
    const int64_t rows = kRows / kWorld;
    for (int step = 0; step < kSteps; ++step) {
      net->forward(batch(step).narrow(0, rank * rows, rows)).square().mean().backward();
      if (zero) {
        zero->attach_gradients();
        zero->step();
        zero->zero_grad();
      } else {
        adamw->step();
        adamw->zero_grad();
      }
    }
    const auto params = unique_parameters(*net);
    double worst = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const double d = (params[i] - reference[i]).abs().max().item<double>();
      worst = std::isnan(d) ? d : std::max(worst, d);  // a NaN stays (std::max would drop it)
    }
    diffs[rank] = worst;
  });
  for (int r = 0; r < kWorld; ++r) {
    std::printf("shared weight, %s, d=%d rank %d: max abs diff vs one-process AdamW %.3g\n",
                zero_stage == 0 ? "DataParallel" : zero_stage == 1 ? "ZeRO-1" : "ZeRO-2", kWorld, r, diffs[r]);
    EXPECT_LE(diffs[r], 1e-6);
  }
}

}  // namespace

TEST(DataParallelShared, TiedWeightMatchesAdamW) { check_shared(0); }

TEST(DataParallelShared, TiedWeightMatchesAdamWUnderZero1) { check_shared(1); }

TEST(DataParallelShared, TiedWeightMatchesAdamWUnderZero2) { check_shared(2); }

// A ZeRO-1 checkpoint at d=2 holds the tied weight's optimizer state under both its names,
// whose shares fall to different replicas (shares go largest first to the lighter replica:
// embed.weight to replica 0, head.weight to 1). One process that loads it has the moments
// of one-process AdamW (before, replica 0 gathered none, as the last name's share was
// replica 1's, and wrote embed.weight's share without them).
TEST(DataParallelShared, AZeroCheckpointKeepsTheTiedWeightsMomentsUnderBothNames) {
  const std::string root = "/tmp/trireme-test-tied-checkpoint-" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  TiedNet reference = make_tied_net();
  torch::optim::AdamW reference_adamw(unique_parameters(*reference), adamw_options());
  train_whole_batch(reference, reference_adamw);
  trireme::testing::run_worlds(kWorld, [&](trireme::dist::World& world) {
    TiedNet net = make_tied_net();
    DataParallelOptions options;
    options.rebuild_buckets = false;
    DataParallel dp(net.ptr(), world.group(), options);
    ZeroOptimizer zero(dp, 1, adamw_options());
    const int64_t rows = kRows / kWorld;
    for (int step = 0; step < kSteps; ++step) {
      net->forward(batch(step).narrow(0, world.rank() * rows, rows)).square().mean().backward();
      zero.attach_gradients();
      zero.step();
      zero.zero_grad();
    }
    trireme::ft::TrainingState state;
    state.world = &world;
    state.parameters = named(*net);
    state.dp = kWorld;
    state.dp_rank = world.rank();
    state.dp_group = world.group();
    state.data_parallel = &dp;
    state.zero = &zero;
    state.layout = {"dp=2", kWorld, 1, 1, 1, -1, ""};
    trireme::ft::save_checkpoint(state, root, kSteps, 1);
  });
  const auto checkpoint = trireme::ft::Checkpoint::open(root + "/" + std::to_string(kSteps), /*verify_data=*/true);
  for (const std::string name : {"embed.weight", "head.weight"})
    for (const std::string kind : {"exp_avg/", "exp_avg_sq/", "step/"})
      EXPECT_TRUE(checkpoint.has(kind + name)) << "the checkpoint has no " << kind << name;
  trireme::testing::run_worlds(1, [&](trireme::dist::World& world) {
    TiedNet net = make_tied_net();
    torch::optim::AdamW adamw(unique_parameters(*net), adamw_options());
    trireme::ft::TrainingState state;
    state.world = &world;
    state.parameters = named(*net);
    state.adamw = &adamw;
    state.layout = {"dp=1", 1, 1, 1, 0, -1, ""};
    ASSERT_EQ(trireme::ft::load_checkpoint(state, root), kSteps);
    const auto tied = unique_parameters(*net)[0];  // embed.weight, head.weight
    const auto got = trireme::parallel::adamw_state(adamw, tied.unsafeGetTensorImpl());
    const auto want =
        trireme::parallel::adamw_state(reference_adamw, unique_parameters(*reference)[0].unsafeGetTensorImpl());
    ASSERT_EQ(got.step, kSteps);
    const double d_avg = (got.exp_avg - want.exp_avg).abs().max().item<double>();
    const double d_sq = (got.exp_avg_sq - want.exp_avg_sq).abs().max().item<double>() /
                        want.exp_avg_sq.abs().max().item<double>();
    std::printf("tied weight's moments from a ZeRO-1 d=2 checkpoint vs one-process AdamW: exp_avg max abs diff "
                "%.3g, exp_avg_sq max relative diff %.3g\n", d_avg, d_sq);
    EXPECT_LE(d_avg, 1e-6);
    EXPECT_LE(d_sq, 1e-5);
  });
  std::filesystem::remove_all(root);
}
