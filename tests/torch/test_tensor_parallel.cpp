// Tensor-parallel operators with two ranks as threads of this process, over real Gloo
// groups on loopback sharing an in-memory store: every split layer and the
// vocabulary-parallel loss against the same computation on whole tensors (values and
// gradients, max abs diff printed), shards and gathers with blocks, and the refusals.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

#include "ranks.h"
#include "trireme/common/error.h"
#include "trireme/parallel/tensor/tensor_parallel.h"

using trireme::tensor::ShardSpec;
using trireme::tensor::TensorParallel;

namespace {

void run_ranks(int world, const std::function<void(const TensorParallel&)>& fn) {
  trireme::testing::run_ranks(world, [&](int rank, const trireme::dist::Group& group) {
    TensorParallel tp;
    tp.rank = rank;
    tp.size = world;
    tp.group = group;
    fn(tp);
  });
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

at::Tensor seeded(std::vector<int64_t> shape, uint64_t seed) {
  return at::randn(shape, at::detail::createCPUGenerator(seed));
}

}  // namespace

TEST(TensorParallel, ShardAndGatherWithBlocksRoundTrip) {
  // A fused q/k/v weight (3 blocks of 4 rows): rank r holds rows 2r..2r+1 of each block.
  const at::Tensor full = at::arange(12 * 3, at::kFloat).view({12, 3});
  const ShardSpec spec{0, 3};
  const at::Tensor r1 = trireme::tensor::shard_of(full, spec, 1, 2);
  EXPECT_TRUE(at::equal(r1, at::cat({full.slice(0, 2, 4), full.slice(0, 6, 8), full.slice(0, 10, 12)})));
  run_ranks(2, [&](const TensorParallel& tp) {
    const at::Tensor mine = trireme::tensor::shard_of(full, spec, tp.rank, tp.size);
    EXPECT_TRUE(at::equal(trireme::tensor::gather_shards(mine, spec, tp), full));
  });
  EXPECT_EQ(trireme::tensor::full_shape({6, 3}, spec, 2), (std::vector<int64_t>{12, 3}));
  EXPECT_THROW(trireme::tensor::shard_of(full, ShardSpec{0, 5}, 0, 2), trireme::InvalidArgument);
}

TEST(TensorParallel, MlpOfColumnThenRowParallelEqualsTheWholeLayers) {
  // y = gelu(x A1ᵀ + b1) A2ᵀ + b2 on whole tensors, and split 2 ways; forward and the
  // gradients of x and of every weight slice.
  // Weights of the usual initialisation scale, so values and gradients are of order one.
  const at::Tensor x0 = seeded({5, 8}, 1), a1 = seeded({16, 8}, 2) * 0.3, b1 = seeded({16}, 3) * 0.1,
                   a2 = seeded({8, 16}, 4) * 0.3, b2 = seeded({8}, 5) * 0.1;
  at::Tensor x = x0.clone().requires_grad_(true), w1 = a1.clone().requires_grad_(true),
             c1 = b1.clone().requires_grad_(true), w2 = a2.clone().requires_grad_(true);
  at::Tensor y = at::linear(at::gelu(at::linear(x, w1, c1)), w2, b2);
  (y * y).mean().backward();
  run_ranks(2, [&](const TensorParallel& tp) {
    trireme::tensor::ColumnParallelLinear fc(8, 16, true, tp);
    trireme::tensor::RowParallelLinear proj(16, 8, true, tp);
    {
      at::NoGradGuard no_grad;
      fc->weight.copy_(trireme::tensor::shard_of(a1, {0, 1}, tp.rank, 2));
      fc->bias.copy_(trireme::tensor::shard_of(b1, {0, 1}, tp.rank, 2));
      proj->weight.copy_(trireme::tensor::shard_of(a2, {1, 1}, tp.rank, 2));
      proj->bias.copy_(b2);
    }
    at::Tensor xs = x0.clone().requires_grad_(true);
    at::Tensor ys = proj->forward(at::gelu(fc->forward(xs)));
    (ys * ys).mean().backward();
    const double dy = max_diff(ys, y), dx = max_diff(xs.grad(), x.grad());
    const double dw1 = max_diff(fc->weight.grad(), trireme::tensor::shard_of(w1.grad(), {0, 1}, tp.rank, 2));
    const double dw2 = max_diff(proj->weight.grad(), trireme::tensor::shard_of(w2.grad(), {1, 1}, tp.rank, 2));
    std::printf("rank %d: max abs diff output %.3g, dx %.3g, dA1 %.3g, dA2 %.3g\n", tp.rank, dy, dx, dw1, dw2);
    EXPECT_LE(dy, 1e-5);
    EXPECT_LE(dx, 1e-5);
    EXPECT_LE(dw1, 1e-5);
    EXPECT_LE(dw2, 1e-5);
  });
}

TEST(TensorParallel, VocabParallelEmbeddingAndCrossEntropyEqualTheWholeVocabulary) {
  const int64_t vocab = 10, dim = 4, rows = 7;
  const at::Tensor table = seeded({vocab, dim}, 6), logits0 = seeded({rows, vocab}, 7);
  const at::Tensor ids = at::tensor(std::vector<int64_t>{0, 9, 4, 5, 3, 7, 5});
  at::Tensor logits = logits0.clone().requires_grad_(true);
  at::Tensor loss = at::cross_entropy_loss(logits, ids);
  loss.backward();
  run_ranks(2, [&](const TensorParallel& tp) {
    trireme::tensor::VocabParallelEmbedding wte(vocab, dim, tp);
    {
      at::NoGradGuard no_grad;
      wte->weight.copy_(trireme::tensor::shard_of(table, {0, 1}, tp.rank, 2));
    }
    EXPECT_LE(max_diff(wte->forward(ids), at::embedding(table, ids)), 0.0);  // exact: zeros added
    at::Tensor mine = trireme::tensor::shard_of(logits0, {1, 1}, tp.rank, 2).requires_grad_(true);
    at::Tensor l = trireme::tensor::vocab_parallel_cross_entropy(mine, ids, tp);
    l.backward();
    const double dl = std::abs(l.item<double>() - loss.item<double>());
    const double dg = max_diff(mine.grad(), trireme::tensor::shard_of(logits.grad(), {1, 1}, tp.rank, 2));
    std::printf("rank %d: vocab-parallel cross-entropy max abs diff loss %.3g, dlogits %.3g\n", tp.rank, dl, dg);
    EXPECT_LE(dl, 1e-6);
    EXPECT_LE(dg, 1e-6);
  });
}

TEST(TensorParallel, RefusesSizesThatDoNotSplit) {
  TensorParallel two;
  two.size = 2;  // no group needed to be refused at construction
  EXPECT_THROW(trireme::tensor::ColumnParallelLinear(8, 9, true, two), trireme::InvalidArgument);
  EXPECT_THROW(trireme::tensor::ColumnParallelLinear(8, 6, true, two, 2), trireme::InvalidArgument);  // 3 per block
  EXPECT_THROW(trireme::tensor::RowParallelLinear(7, 8, true, two), trireme::InvalidArgument);
  EXPECT_THROW(trireme::tensor::VocabParallelEmbedding(255, 8, two), trireme::InvalidArgument);
}

TEST(TensorParallel, VocabParallelCrossEntropyRefusesTargetsNoRankHolds) {
  // A target outside the vocabulary (or -100, which at::cross_entropy_loss ignores) is
  // held by no rank's slice: refused, instead of a loss computed as if its logit were 0.
  TensorParallel two;
  two.size = 2;  // refused before any exchange: no group needed
  const at::Tensor logits = at::zeros({3, 5});  // V = 10
  for (const int64_t bad : {-100, -1, 10}) {
    try {
      trireme::tensor::vocab_parallel_cross_entropy(logits, at::tensor(std::vector<int64_t>{0, bad, 9}), two);
      ADD_FAILURE() << "target " << bad << " accepted";
    } catch (const trireme::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("every target in [0, 10)"), std::string::npos) << e.what();
    }
  }
}

TEST(TensorParallel, RngTrackerSplitsMasksAndLeavesTheReplicatedStreamAlone) {
  // Two ranks of one group: inside fork() their dropout masks differ; outside, the default
  // generator continues exactly as if fork() had not been called, so the replicated masks
  // of the ranks agree.
  trireme::tensor::RngTracker rank0(7, 0), rank1(7, 1);
  const at::Tensor ones = at::ones({4096});
  auto mask = [&] { return at::dropout(ones, 0.5, /*train=*/true); };
  at::manual_seed(3);
  const at::Tensor split0 = rank0.fork(mask), replicated0 = mask();
  at::manual_seed(3);
  const at::Tensor split1 = rank1.fork(mask), replicated1 = mask();
  at::manual_seed(3);
  const at::Tensor unforked = mask();
  EXPECT_FALSE(at::equal(split0, split1));
  EXPECT_TRUE(at::equal(replicated0, replicated1));
  EXPECT_TRUE(at::equal(replicated0, unforked));
  // A tracker's stream moves on: its next region draws a new mask.
  EXPECT_FALSE(at::equal(rank0.fork(mask), split0));
}

TEST(TensorParallel, SplitStreamsDifferAcrossReplicasStagesAndRanks) {
  // dp 2 x pp 2 x tp 2: each of the 8 ranks draws its own split-region mask. (With the
  // seed taken from the stage alone, the two replicas drew the same masks.)
  const at::Tensor ones = at::ones({4096});
  auto mask = [&] { return at::dropout(ones, 0.5, /*train=*/true); };
  std::vector<at::Tensor> masks;
  for (int replica = 0; replica < 2; ++replica)
    for (int stage = 0; stage < 2; ++stage)
      for (int rank = 0; rank < 2; ++rank) {
        trireme::tensor::RngTracker tracker(trireme::tensor::split_stream_seed(7, replica, stage), rank);
        masks.push_back(tracker.fork(mask));
      }
  for (size_t a = 0; a < masks.size(); ++a)
    for (size_t b = a + 1; b < masks.size(); ++b) EXPECT_FALSE(at::equal(masks[a], masks[b])) << a << " vs " << b;
}

TEST(TensorParallel, RngTrackerStreamRestoresFromItsSavedState) {
  // What a snapshot saves (split_generator's state) is all a resumed rank needs to draw
  // the masks the uninterrupted run would have drawn next; a fresh tracker draws others.
  trireme::tensor::RngTracker tracker(7, 1);
  const at::Tensor ones = at::ones({4096});
  auto mask = [&] { return at::dropout(ones, 0.5, /*train=*/true); };
  tracker.fork(mask);
  const at::Tensor saved = tracker.split_generator().get_state();
  const at::Tensor next = tracker.fork(mask);
  trireme::tensor::RngTracker resumed(7, 1);
  EXPECT_FALSE(at::equal(resumed.fork(mask), next));
  resumed.split_generator().set_state(saved);
  EXPECT_TRUE(at::equal(resumed.fork(mask), next));
}
