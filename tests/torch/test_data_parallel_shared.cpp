// DataParallel and ZeRO with a shared (tied) weight: one tensor registered in two
// submodules, which libtorch's Module::parameters() lists twice. DataParallel must take
// part in it once (one slot, one hook, its gradient sent once), so that AdamW over
// dp.parameters(), ZeRO-1 and ZeRO-2 each update it as one process updates the
// deduplicated parameter list. Ranks are threads over real Gloo groups (STYLE 9); the
// weights after two steps are compared with one-process AdamW (max abs diff printed).
#include <gtest/gtest.h>

#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <set>

#include "ranks.h"
#include "trireme/parallel/data/data_parallel.h"
#include "trireme/parallel/data/zero.h"

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

// One process, the whole batch, AdamW over the deduplicated parameters.
std::vector<at::Tensor> reference_parameters() {
  TiedNet net = make_tied_net();
  torch::optim::AdamW adamw(unique_parameters(*net), adamw_options());
  for (int step = 0; step < kSteps; ++step) {
    net->forward(batch(step)).square().mean().backward();
    adamw.step();
    adamw.zero_grad();
  }
  std::vector<at::Tensor> out;
  for (const auto& p : unique_parameters(*net)) out.push_back(p.detach().clone());
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
