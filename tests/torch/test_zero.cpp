// ZeRO (parallel/data/zero.h) and the ring reduce-scatter behind stage 2
// (comm/reduce_scatter.h), with ranks as threads over real Gloo groups: the ring's result
// against the closed-form sum, and ZeRO-1/2 training against libtorch's AdamW on the whole
// batch in one process (parameters after 3 steps, max abs diff printed), including a
// parameter that never gets a gradient (AdamW must skip it, so must ZeRO).
#include <gtest/gtest.h>

#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <future>
#include <mutex>
#include <thread>

#include "ranks.h"
#include "trireme/comm/reduce_scatter.h"
#include "trireme/comm/shard.h"
#include "trireme/common/error.h"
#include "trireme/parallel/data/zero.h"

using trireme::parallel::DataParallel;
using trireme::parallel::DataParallelOptions;
using trireme::parallel::ZeroOptimizer;
using trireme::testing::run_ranks;

namespace {

// Integer-valued floats, so that sums are exact in any order.
at::Tensor ring_input(int rank, int64_t numel) {
  return at::arange(numel, at::kFloat).mul(3).add(17 * rank).remainder(101);
}

}  // namespace

TEST(RingReduceScatter, EachRankGetsTheSumOfItsChunk) {
  for (int d : {1, 2, 3, 4})
    for (int64_t stride : {1, 7, 1000}) {
      run_ranks(d, [&](int rank, const trireme::dist::Group& group) {
        trireme::comm::ReduceScatter rs(group);
        EXPECT_TRUE(rs.uses_ring());
        // Three buffers in flight at once, waited for in launch order.
        std::vector<at::Tensor> buffers;
        std::vector<c10::intrusive_ptr<c10d::Work>> works;
        for (int k = 0; k < 3; ++k) {
          buffers.push_back(ring_input(rank + k, d * stride));
          works.push_back(rs.launch(buffers.back()));
        }
        for (int k = 0; k < 3; ++k) {
          trireme::dist::wait_work(works[k], "ring");
          at::Tensor expected = at::zeros({stride});
          for (int q = 0; q < d; ++q) expected += ring_input(q + k, d * stride).narrow(0, rank * stride, stride);
          EXPECT_TRUE(at::equal(buffers[k].narrow(0, rank * stride, stride), expected))
              << "d=" << d << " stride=" << stride << " rank " << rank << " buffer " << k;
        }
      });
    }
}

// A ring that fails (here a peer that never joins it, so the receive times out) fails its
// work's wait() with a CommError, and every later launch fails too: before, wait()
// returned as if the ring had finished, and ZeRO-2 stepped on partial sums.
TEST(RingReduceScatter, AFailedRingFailsItsWait) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::promise<void> done;
  std::shared_future<void> finished = done.get_future().share();
  std::exception_ptr error;
  std::thread absent([&] {  // rank 1 joins the group but never the ring
    try {
      trireme::dist::GroupOptions options;
      options.timeout = std::chrono::seconds(1);
      auto group = trireme::dist::create_gloo_group(store, 1, 2, options);
      finished.wait();
    } catch (...) {
      error = std::current_exception();
    }
  });
  trireme::dist::GroupOptions options;
  options.timeout = std::chrono::seconds(1);
  auto group = trireme::dist::create_gloo_group(store, 0, 2, options);
  {
    trireme::comm::ReduceScatter rs(group);
    auto work = rs.launch(ring_input(0, 8));
    EXPECT_THROW(trireme::dist::wait_work(work, "ring"), trireme::CommError);
    EXPECT_FALSE(work->isSuccess());
    auto later = rs.launch(ring_input(0, 8));
    try {
      trireme::dist::wait_work(later, "ring");
      ADD_FAILURE() << "a launch after the ring failed passed";
    } catch (const trireme::CommError& e) {
      EXPECT_NE(std::string(e.what()).find("ring reduce-scatter failed"), std::string::npos) << e.what();
    }
  }
  done.set_value();
  absent.join();
  if (error) std::rethrow_exception(error);
}

TEST(RingReduceScatter, RefusesABufferThatDoesNotSplit) {
  run_ranks(2, [](int, const trireme::dist::Group& group) {
    trireme::comm::ReduceScatter rs(group);
    EXPECT_THROW(rs.launch(at::zeros({5})), trireme::InvalidArgument);
  });
}

namespace {

// Odd sizes, so that chunks cut through parameters; `unused` never gets a gradient.
struct SmallNetImpl : torch::nn::Module {
  SmallNetImpl() {
    a = register_module("a", torch::nn::Linear(7, 5));
    b = register_module("b", torch::nn::Linear(5, 3));
    c = register_module("c", torch::nn::Linear(3, 11));
    unused = register_module("unused", torch::nn::Linear(3, 2));
  }
  at::Tensor forward(const at::Tensor& x) { return c->forward(at::tanh(b->forward(at::tanh(a->forward(x))))); }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr}, unused{nullptr};
};
TORCH_MODULE(SmallNet);

SmallNet make_small_net() {
  static std::mutex mutex;  // ranks are threads sharing libtorch's global generator
  std::lock_guard<std::mutex> lock(mutex);
  at::manual_seed(11);
  return SmallNet();
}

constexpr int64_t kRows = 12;  // global batch, divisible by 1..4
constexpr int kSteps = 3;

at::Tensor batch(int step) { return at::arange(kRows * 7, at::kFloat).reshape({kRows, 7}).mul(0.05 * (step + 1)).cos(); }

torch::optim::AdamWOptions adamw_options() { return torch::optim::AdamWOptions(0.05).weight_decay(0.1); }

// The reference: one process, the whole batch, libtorch's AdamW.
std::vector<at::Tensor> reference_parameters() {
  SmallNet net = make_small_net();
  torch::optim::AdamW adamw(net->parameters(), adamw_options());
  for (int step = 0; step < kSteps; ++step) {
    net->forward(batch(step)).square().mean().backward();
    adamw.step();
    adamw.zero_grad();
  }
  std::vector<at::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

void check_zero(int stage, int d) {
  const std::vector<at::Tensor> reference = reference_parameters();
  std::vector<int64_t> state_bytes(d);
  std::vector<double> diffs(d);
  run_ranks(d, [&](int rank, const trireme::dist::Group& group) {
    SmallNet net = make_small_net();
    const at::Tensor unused_before = net->unused->weight.detach().clone();
    DataParallelOptions options;
    options.buckets.cap_bytes = options.buckets.first_cap_bytes = 40;  // several buckets
    options.rebuild_buckets = false;
    if (stage == 2) options.reduction = DataParallelOptions::Reduction::kReduceScatter;
    DataParallel dp(net.ptr(), group, options);
    ASSERT_GE(dp.buckets().size(), 3u);
    ZeroOptimizer zero(dp, stage, adamw_options());
    const int64_t rows = kRows / d;
    for (int step = 0; step < kSteps; ++step) {
      net->forward(batch(step).narrow(0, rank * rows, rows)).square().mean().backward();
      if (stage == 2)
        for (const auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined()) << "ZeRO-2 keeps only shards";
      zero.attach_gradients();
      zero.step();
      zero.zero_grad();
    }
    double worst = 0;
    const auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const double d = (params[i] - reference[i]).abs().max().item<double>();
      worst = std::isnan(d) ? d : std::max(worst, d);  // a NaN stays (std::max would drop it)
    }
    diffs[rank] = worst;
    EXPECT_TRUE(at::equal(net->unused->weight, unused_before)) << "a parameter without gradient was updated";
    state_bytes[rank] = zero.optimizer_state_bytes();
  });
  int64_t total = 0, unsharded = 0;
  for (const auto& p : reference) unsharded += 2 * static_cast<int64_t>(p.nbytes());
  unsharded -= 2 * (2 * 3 + 2) * 4;  // the unused layer has no AdamW state in either
  for (int r = 0; r < d; ++r) {
    std::printf("ZeRO-%d d=%d rank %d: max abs diff vs one-process AdamW %.3g, optimizer state %lld bytes\n",
                stage, d, r, diffs[r], static_cast<long long>(state_bytes[r]));
    EXPECT_LE(diffs[r], 1e-6);
    total += state_bytes[r];
  }
  EXPECT_EQ(total, unsharded) << "the shards together hold exactly the unsharded state";
}

}  // namespace

TEST(Zero, Stage1MatchesAdamW) {
  for (int d : {1, 2, 3, 4}) check_zero(1, d);
}

TEST(Zero, Stage2MatchesAdamW) {
  for (int d : {1, 2, 3, 4}) check_zero(2, d);
}

TEST(Zero, RefusesAMismatchedDataParallel) {
  run_ranks(1, [](int, const trireme::dist::Group& group) {
    SmallNet net = make_small_net();
    DataParallel rebuilding(net.ptr(), group);  // rebuild_buckets on by default
    EXPECT_THROW(ZeroOptimizer(rebuilding, 1, adamw_options()), trireme::InvalidArgument);
  });
  run_ranks(1, [](int, const trireme::dist::Group& group) {
    SmallNet net = make_small_net();
    DataParallelOptions options;
    options.rebuild_buckets = false;
    DataParallel all_reduce(net.ptr(), group, options);
    EXPECT_THROW(ZeroOptimizer(all_reduce, 2, adamw_options()), trireme::InvalidArgument);
    EXPECT_THROW(ZeroOptimizer(all_reduce, 3, adamw_options()), trireme::InvalidArgument);
  });
}

// gather_state(wanted), as a checkpoint that each replica saves a share of calls it: the
// wanted parameters' state is the full gather's, bit for bit, and the others are left
// without state (step 0, undefined moments), never allocated.
TEST(Zero, GatherStateOfAShareMatchesTheFullGather) {
  for (int stage : {1, 2})
    for (int d : {1, 2, 3}) {
      run_ranks(d, [&](int rank, const trireme::dist::Group& group) {
        SmallNet net = make_small_net();
        DataParallelOptions options;
        options.buckets.cap_bytes = options.buckets.first_cap_bytes = 40;  // several buckets
        options.rebuild_buckets = false;
        if (stage == 2) options.reduction = DataParallelOptions::Reduction::kReduceScatter;
        DataParallel dp(net.ptr(), group, options);
        ZeroOptimizer zero(dp, stage, adamw_options());
        const int64_t rows = kRows / d;
        for (int step = 0; step < 2; ++step) {
          net->forward(batch(step).narrow(0, rank * rows, rows)).square().mean().backward();
          zero.attach_gradients();
          zero.step();
          zero.zero_grad();
        }
        const auto wanted = [&](size_t p) { return static_cast<int>(p % static_cast<size_t>(d)) == rank; };
        const auto full = zero.gather_state();
        const auto share = zero.gather_state(wanted);
        ASSERT_EQ(share.size(), full.size());
        size_t with_state = 0;
        for (size_t p = 0; p < full.size(); ++p) {
          with_state += full[p].step > 0;
          if (!wanted(p)) {
            EXPECT_EQ(share[p].step, 0) << "parameter " << p << " is not wanted";
            EXPECT_FALSE(share[p].exp_avg.defined() || share[p].exp_avg_sq.defined()) << "parameter " << p;
            continue;
          }
          EXPECT_EQ(share[p].step, full[p].step) << "parameter " << p;
          if (full[p].step == 0) {
            EXPECT_FALSE(share[p].exp_avg.defined()) << "parameter " << p << " has no state";
            continue;
          }
          EXPECT_TRUE(at::equal(share[p].exp_avg, full[p].exp_avg)) << "stage " << stage << " d=" << d << " p " << p;
          EXPECT_TRUE(at::equal(share[p].exp_avg_sq, full[p].exp_avg_sq)) << "stage " << stage << " d=" << d;
        }
        EXPECT_EQ(with_state, full.size() - 2) << "all but the unused layer's weight and bias have state";
      });
    }
}
