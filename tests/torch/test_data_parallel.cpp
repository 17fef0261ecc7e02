// DataParallel with several ranks as threads of this process, over real Gloo groups on
// loopback sharing an in-memory store (STYLE 9). Checks the averaged gradients against a
// closed-form reference, gradient accumulation with no_sync, parameters without gradients,
// the initial broadcast (also when left to the caller) and the bucket rebuild.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>

#include "ranks.h"
#include "trireme/common/error.h"
#include "trireme/dist/backend.h"
#include "trireme/parallel/data/data_parallel.h"

using trireme::parallel::DataParallel;
using trireme::parallel::DataParallelOptions;

namespace {

using trireme::testing::run_ranks;

// Four layers so that a small bucket cap gives several buckets.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    for (int i = 0; i < 4; ++i) layers.push_back(register_module("l" + std::to_string(i), torch::nn::Linear(8, 8)));
    unused = register_module("unused", torch::nn::Linear(8, 8));
  }
  at::Tensor forward(at::Tensor x, bool use_extra = false) {
    for (auto& l : layers) x = at::tanh(l->forward(x));
    if (use_extra) x = x + unused->forward(x);
    return x;
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear unused{nullptr};
};
TORCH_MODULE(Net);

at::Tensor input_for(int rank, int64_t rows) {
  return at::arange(rows * 8, at::kFloat).reshape({rows, 8}).mul(0.01 * (rank + 1)).sin();
}

// The ranks are threads sharing libtorch's global generator: seed and draw under a lock,
// or their initialisations would interleave.
Net make_net(uint64_t seed) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  at::manual_seed(seed);
  return Net();
}

DataParallelOptions small_buckets() {
  DataParallelOptions options;
  // A layer is 8 + 8x8 floats = 32 + 256 bytes; in reverse order the bias comes first and
  // the weight fills the bucket past the cap: one bucket per layer.
  options.buckets.cap_bytes = 200;
  options.buckets.first_cap_bytes = 200;
  return options;
}

double max_abs_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = (a[i] - b[i]).abs().max().item<double>();
    worst = std::isnan(d) ? d : std::max(worst, d);  // a NaN stays (std::max would drop it)
  }
  return worst;
}

// The module's gradients, with zeros standing in for undefined ones.
std::vector<at::Tensor> grads_or_zeros(torch::nn::Module& net) {
  std::vector<at::Tensor> grads;
  for (auto& p : net.parameters()) grads.push_back(p.grad().defined() ? p.grad() : at::zeros_like(p));
  return grads;
}

// Gradients of one process on the concatenation of every rank's input (mean loss).
std::vector<at::Tensor> reference_grads(int world, int64_t rows) {
  Net net = make_net(7);
  std::vector<at::Tensor> inputs;
  for (int r = 0; r < world; ++r) inputs.push_back(input_for(r, rows));
  net->forward(at::cat(inputs)).pow(2).mean().backward();
  return grads_or_zeros(*net);
}

}  // namespace

class DataParallelWorld : public ::testing::TestWithParam<int> {};

TEST_P(DataParallelWorld, AveragedGradientsMatchOneProcess) {
  const int world = GetParam();
  const auto expected = reference_grads(world, 4);
  run_ranks(world, [&](int rank, const trireme::dist::Group& group) {
    // Every rank starts from a different initialisation: the broadcast must fix it.
    Net net = make_net(rank == 0 ? 7 : 100 + rank);
    DataParallel dp(net.ptr(), group, small_buckets());
    ASSERT_GE(dp.buckets().size(), 4u);
    for (int step = 0; step < 2; ++step) {  // the second step runs on rebuilt buckets
      net->zero_grad();
      net->forward(input_for(rank, 4)).pow(2).mean().backward();
      EXPECT_FALSE(net->unused->weight.grad().defined());  // unused everywhere, as in one process
      const double diff = max_abs_diff(grads_or_zeros(*net), expected);
      std::printf("world %d rank %d step %d: max abs diff vs one process %.3g\n", world, rank, step, diff);
      EXPECT_LE(diff, 1e-6);
    }
    EXPECT_EQ(dp.steps(), 2);
  });
}

TEST_P(DataParallelWorld, NoSyncAccumulationMatchesOneProcess) {
  const int world = GetParam();
  const auto expected = reference_grads(world, 4);
  run_ranks(world, [&](int rank, const trireme::dist::Group& group) {
    Net net = make_net(7);
    DataParallel dp(net.ptr(), group, small_buckets());
    const at::Tensor x = input_for(rank, 4);
    {
      auto guard = dp.no_sync();
      net->forward(x.narrow(0, 0, 2)).pow(2).mean().div(2).backward();
    }
    EXPECT_EQ(dp.steps(), 0);  // nothing synchronised yet
    net->forward(x.narrow(0, 2, 2)).pow(2).mean().div(2).backward();
    EXPECT_EQ(dp.steps(), 1);
    const double diff = max_abs_diff(grads_or_zeros(*net), expected);
    std::printf("no_sync world %d rank %d: max abs diff %.3g\n", world, rank, diff);
    EXPECT_LE(diff, 1e-6);
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, DataParallelWorld, ::testing::Values(1, 2, 4));

// A caller about to restore every replica (trireme train on a restart) skips the
// broadcast at construction; the replicas keep their own values until it asks for one.
TEST(DataParallel, InitialBroadcastCanBeLeftToTheCaller) {
  run_ranks(2, [&](int rank, const trireme::dist::Group& group) {
    Net net = make_net(rank == 0 ? 7 : 101);
    const at::Tensor before = net->layers[0]->weight.detach().clone();
    DataParallelOptions options = small_buckets();
    options.broadcast_parameters = false;
    DataParallel dp(net.ptr(), group, options);
    EXPECT_TRUE(at::equal(net->layers[0]->weight, before));  // untouched on every rank
    dp.broadcast_initial_state();
    const double diff = max_abs_diff(net->parameters(), make_net(7)->parameters());
    std::printf("rank %d: after broadcast_initial_state, max abs diff vs rank 0's values %.3g\n", rank, diff);
    EXPECT_EQ(diff, 0.0);
  });
}

// A module with nothing to train (every parameter frozen, or none: a parameter-free
// pipeline stage) is refused at construction, not left to fail at its first step.
TEST(DataParallel, RefusesAModuleWithNothingToReduce) {
  run_ranks(1, [&](int, const trireme::dist::Group& group) {
    torch::nn::Linear frozen(4, 4);
    for (auto& p : frozen->parameters()) p.requires_grad_(false);
    const std::vector<std::shared_ptr<torch::nn::Module>> modules{frozen.ptr(), std::make_shared<torch::nn::Module>()};
    for (const auto& module : modules) {
      try {
        DataParallel dp(module, group, small_buckets());
        ADD_FAILURE() << "a module without trainable parameters was accepted";
      } catch (const trireme::InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("at least one parameter that requires a gradient"), std::string::npos)
            << e.what();
      }
    }
  });
}

TEST(DataParallel, ParameterUsedOnOneRankOnlyDoesNotHang) {
  run_ranks(2, [&](int rank, const trireme::dist::Group& group) {
    Net net = make_net(7);
    DataParallel dp(net.ptr(), group, small_buckets());
    for (int step = 0; step < 3; ++step) {
      net->zero_grad();
      // Rank 1 uses the extra layer, rank 0 does not; on step 2 neither does.
      net->forward(input_for(rank, 2), rank == 1 && step < 2).sum().backward();
      if (step == 2) {
        // No rank used it: no gradient at all, as in one process (the optimizer skips it).
        EXPECT_FALSE(net->unused->weight.grad().defined());
        EXPECT_TRUE(net->layers[0]->weight.grad().defined());
        continue;
      }
      ASSERT_TRUE(net->unused->weight.grad().defined());
      // Rank 0 contributed zeros: the average is half of rank 1's gradient, same everywhere.
      std::vector<at::Tensor> gathered{net->unused->weight.grad().clone()};
      std::vector<std::vector<at::Tensor>> out(1, std::vector<at::Tensor>{at::empty_like(gathered[0]), at::empty_like(gathered[0])});
      group->allgather(out, gathered)->wait();
      EXPECT_TRUE(at::equal(out[0][0], out[0][1]));
      EXPECT_GT(net->unused->weight.grad().abs().sum().item<double>(), 0.0);
    }
    EXPECT_EQ(dp.steps(), 3);
  });
}

TEST(DataParallel, OverlapsCommunicationWithBackward) {
  run_ranks(2, [&](int rank, const trireme::dist::Group& group) {
    Net net = make_net(7);
    DataParallel dp(net.ptr(), group, small_buckets());
    // The first step runs on buckets in reverse registration order, where the bucket of
    // the never-used layer comes first and holds the others back; the second runs on the
    // buckets rebuilt from the observed order, with that layer last.
    for (int step = 0; step < 2; ++step) {
      net->zero_grad();
      net->forward(input_for(rank, 64)).pow(2).mean().backward();
    }
    const auto& stats = dp.last_step();
    ASSERT_EQ(stats.buckets.size(), dp.buckets().size());
    // Buckets are launched from hooks during backward: all but the last must start before
    // autograd finishes.
    EXPECT_GE(stats.buckets_overlapped(), static_cast<int>(stats.buckets.size()) - 1);
    for (const auto& b : stats.buckets) EXPECT_GE(b.done_us, b.launch_us);
    EXPECT_GE(stats.sync_end_us, stats.backward_end_us);
  });
}

TEST(DataParallel, RebuildsBucketsFromObservedOrderAndAgrees) {
  run_ranks(2, [&](int rank, const trireme::dist::Group& group) {
    Net net = make_net(7);
    DataParallel dp(net.ptr(), group, small_buckets());
    net->forward(input_for(rank, 2)).sum().backward();
    // Observed order: last layer first; the unused layer (no gradient) goes last.
    const auto& buckets = dp.buckets();
    std::vector<size_t> flat;
    for (const auto& b : buckets) flat.insert(flat.end(), b.begin(), b.end());
    ASSERT_EQ(flat.size(), net->parameters().size());
    EXPECT_EQ(flat.back() / 2, 4u);  // a parameter of `unused` (indices 8, 9)
  });
}

TEST(DataParallel, BucketStateRestoresTheRebuiltLayoutBeforeTheFirstStep) {
  // What a snapshot keeps of the buckets: a restarted replica builds the rebuilt layout
  // before its first step, as the uninterrupted run had it (with 3 ranks the ring's sum
  // order follows each element's place in its bucket).
  run_ranks(3, [&](int rank, const trireme::dist::Group& group) {
    Net net = make_net(7);
    DataParallel dp(net.ptr(), group, small_buckets());
    const auto initial = dp.buckets();
    EXPECT_EQ(dp.bucket_state()[-1].item<int64_t>(), 0);  // not yet rebuilt
    net->forward(input_for(rank, 2)).sum().backward();
    const auto rebuilt = dp.buckets();
    ASSERT_NE(rebuilt, initial);  // the unused layer moved last
    const at::Tensor state = dp.bucket_state();
    EXPECT_EQ(state[-1].item<int64_t>(), 1);

    Net restarted = make_net(7);
    DataParallel again(restarted.ptr(), group, small_buckets());
    EXPECT_EQ(again.buckets(), initial);
    EXPECT_TRUE(again.restore_bucket_state(state));
    EXPECT_EQ(again.buckets(), rebuilt);
    // It stays: the first step does not rebuild from its own observation.
    restarted->forward(input_for(rank, 2), /*use_extra=*/true).sum().backward();
    EXPECT_EQ(again.buckets(), rebuilt);
    // A state of another parameter list (a stage cut elsewhere) is ignored; one that is not
    // an order is refused.
    Net fresh = make_net(7);
    DataParallel third(fresh.ptr(), group, small_buckets());
    EXPECT_FALSE(third.restore_bucket_state(state.slice(0, 1)));
    EXPECT_EQ(third.buckets(), initial);
    at::Tensor repeated = state.clone();
    repeated[0] = repeated[1].item<int64_t>();
    EXPECT_THROW(again.restore_bucket_state(repeated), trireme::InvalidArgument);
  });
}

TEST(DataParallel, InterruptedBackwardFailsLaterStepsLoudly) {
  run_ranks(2, [&](int rank, const trireme::dist::Group& group) {
    Net net = make_net(7);
    DataParallel dp(net.ptr(), group, small_buckets());
    auto forward = [&](bool fail) {
      at::Tensor h = at::tanh(net->layers[0]->forward(input_for(rank, 2)));
      // Fires after the gradients of layers 3..1 are in (and their buckets launched),
      // before layer 0's: the step is interrupted halfway, on both ranks alike.
      if (fail) h.register_hook([](const at::Tensor&) -> at::Tensor { throw std::runtime_error("injected"); });
      for (int i = 1; i < 4; ++i) h = at::tanh(net->layers[i]->forward(h));
      return h.sum();
    };
    EXPECT_THROW(forward(true).backward(), std::exception);
    EXPECT_EQ(dp.steps(), 0);
    // Every later backward refuses instead of drifting apart silently.
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        forward(false).backward();
        ADD_FAILURE() << "backward after an interrupted step did not throw";
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("previous backward did not finish"), std::string::npos)
            << e.what();
      }
    }
  });
}
