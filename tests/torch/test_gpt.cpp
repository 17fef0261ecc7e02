// The reference GPT: shapes, seeded initialisation, size, causality, learning, sampling;
// and make_batch over a corpus.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <cmath>

#include "trireme/common/error.h"
#include "trireme/data/batch.h"
#include "trireme/data/corpus.h"
#include "trireme/data/sampler.h"
#include "trireme/dist/backend.h"
#include "trireme/models/gpt.h"

using trireme::InvalidArgument;
using trireme::models::Gpt;
using trireme::models::GptConfig;

namespace {

GptConfig tiny() {
  GptConfig c;
  c.seq_len = 16;
  c.layers = 2;
  c.dim = 32;
  c.heads = 4;
  return c;
}

at::Tensor random_tokens(int64_t B, int64_t T, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randint(0, 256, {B, T}, gen, at::kLong);
}

}  // namespace

TEST(GptTest, ForwardShapes) {
  Gpt model(tiny(), 1);
  EXPECT_EQ(model->forward(random_tokens(3, 16, 0)).sizes(), (at::IntArrayRef{3, 16, 256}));
  EXPECT_EQ(model->forward(random_tokens(2, 5, 0)).sizes(), (at::IntArrayRef{2, 5, 256}));
  EXPECT_EQ(model->loss(random_tokens(2, 5, 0), random_tokens(2, 5, 1)).dim(), 0);
  EXPECT_THROW(model->forward(random_tokens(1, 17, 0)), InvalidArgument);
}

TEST(GptTest, ParameterNamesMatchThePythonPeer) {
  Gpt model(tiny(), 1);
  const auto params = model->named_parameters();
  EXPECT_TRUE(params.contains("wte.weight"));
  EXPECT_TRUE(params.contains("wpe.weight"));
  EXPECT_TRUE(params.contains("h.1.attn.qkv.weight"));
  EXPECT_TRUE(params.contains("h.1.attn.proj.bias"));
  EXPECT_TRUE(params.contains("h.0.mlp.fc.weight"));
  EXPECT_TRUE(params.contains("h.0.mlp.proj.weight"));
  EXPECT_TRUE(params.contains("h.0.ln_2.bias"));
  EXPECT_TRUE(params.contains("ln_f.weight"));
  EXPECT_TRUE(params.contains("head.weight"));
  EXPECT_FALSE(params.contains("head.bias"));
  EXPECT_EQ(params["h.0.attn.qkv.weight"].sizes(), (at::IntArrayRef{96, 32}));
  EXPECT_EQ(params["h.0.mlp.fc.weight"].sizes(), (at::IntArrayRef{128, 32}));
  EXPECT_EQ(params["wpe.weight"].sizes(), (at::IntArrayRef{16, 32}));
}

TEST(GptTest, SeedAloneDeterminesParameters) {
  Gpt a(tiny(), 7);
  at::manual_seed(123);  // the global RNG must not matter
  at::rand({10});
  Gpt b(tiny(), 7);
  Gpt c(tiny(), 8);
  const auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  bool any_differs = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(at::equal(pa[i], pb[i])) << "parameter " << i;
    if (pa[i].numel() > 1 && !at::equal(pa[i], pc[i])) any_differs = true;
  }
  EXPECT_TRUE(any_differs);
}

// gpt.h's promise: a TP=t model is the TP=1 model of the same seed, slice for slice (each
// parameter drawn whole, then this rank's shard kept). No group is needed to build one.
TEST(GptTest, ATensorParallelModelIsTheWholeModelSliceForSlice) {
  Gpt whole(tiny(), 7);
  const auto full = whole->named_parameters();
  for (int rank = 0; rank < 2; ++rank) {
    trireme::tensor::TensorParallel tp;
    tp.rank = rank;
    tp.size = 2;
    Gpt part(tiny(), 7, tp);
    const auto& specs = part->shard_specs();
    size_t split = 0;
    for (const auto& item : part->named_parameters()) {
      const trireme::tensor::ShardSpec& spec = specs.at(item.key());
      const at::Tensor want = trireme::tensor::shard_of(full[item.key()], spec, rank, 2);
      ASSERT_EQ(item.value().sizes(), want.sizes()) << item.key();
      EXPECT_TRUE(at::equal(item.value(), want)) << "rank " << rank << " " << item.key();
      if (!spec.replicated()) ++split;
    }
    EXPECT_GT(split, 0u);  // (the test would say nothing of a model that split nothing)
  }
}

// Building a model, initialised or not, draws nothing from the global generator (which
// dropout uses): before, wpe's own initialisation drew seq_len*dim numbers from it.
TEST(GptTest, BuildingAModelLeavesTheGlobalGeneratorAlone) {
  for (const bool initialize : {true, false}) {
    at::manual_seed(5);
    const at::Tensor expected = at::rand({4});
    at::manual_seed(5);
    Gpt model(tiny(), 7, trireme::tensor::TensorParallel{}, initialize);
    EXPECT_TRUE(at::equal(at::rand({4}), expected)) << "initialize " << initialize;
  }
}

TEST(GptTest, InitialisationFollowsTheScheme) {
  GptConfig cfg = tiny();
  cfg.dim = 64;
  Gpt model(cfg, 3);
  auto p = model->named_parameters();
  EXPECT_TRUE(at::equal(p["h.0.ln_1.weight"], at::ones({64})));
  EXPECT_TRUE(at::equal(p["h.0.attn.qkv.bias"], at::zeros({192})));
  EXPECT_NEAR(p["h.0.mlp.fc.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(p["h.1.mlp.proj.weight"].std().item<double>(), 0.02 / std::sqrt(4.0), 0.001);
  EXPECT_NEAR(p["head.weight"].std().item<double>(), 0.02, 0.002);
}

TEST(GptTest, ParameterCountMatchesClosedForm) {
  for (GptConfig c : {tiny(), GptConfig{}}) {
    const int64_t C = c.dim, V = c.vocab, T = c.seq_len, L = c.layers;
    const int64_t per_block = 4 * C + 3 * C * C + 3 * C + C * C + C + 8 * C * C + 4 * C + C;
    const int64_t expected = V * C + T * C + L * per_block + 2 * C + C * V;
    Gpt model(c, 0);
    EXPECT_EQ(model->num_parameters(), expected);
    EXPECT_EQ(c.num_parameters(), expected);
  }
  EXPECT_EQ(GptConfig{}.num_parameters(), 875264);  // also what bench/py/gpt.py prints
}

TEST(GptTest, AttentionIsCausal) {
  Gpt model(tiny(), 2);
  at::Tensor idx = random_tokens(2, 16, 5);
  at::Tensor changed = idx.clone();
  changed.index_put_({at::indexing::Slice(), 10}, (idx.select(1, 10) + 1) % 256);
  at::NoGradGuard no_grad;
  at::Tensor a = model->forward(idx), b = model->forward(changed);
  using at::indexing::Slice;
  EXPECT_TRUE(at::equal(a.index({Slice(), Slice(0, 10)}), b.index({Slice(), Slice(0, 10)})));
  EXPECT_FALSE(at::allclose(a.index({Slice(), 10}), b.index({Slice(), 10})));
}

TEST(GptTest, InitialLossIsNearUniform) {
  Gpt model(tiny(), 4);
  const double loss = model->loss(random_tokens(4, 16, 1), random_tokens(4, 16, 2)).item<double>();
  EXPECT_NEAR(loss, std::log(256.0), 0.1);
}

TEST(GptTest, AdamWStepsReduceLossOnAFixedBatch) {
  Gpt model(tiny(), 5);
  at::Tensor idx = random_tokens(4, 16, 3), targets = random_tokens(4, 16, 4);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));
  const double first = model->loss(idx, targets).item<double>();
  double last = first;
  for (int step = 0; step < 10; ++step) {
    opt.zero_grad();
    at::Tensor loss = model->loss(idx, targets);
    loss.backward();
    opt.step();
    last = loss.item<double>();
  }
  EXPECT_LT(last, first - 0.3);
}

TEST(GptTest, GenerateIsDeterministicForASeed) {
  Gpt model(tiny(), 6);
  model->train();
  const std::string a = model->generate("In the beginning", 40, 1.0, 11);
  const std::string b = model->generate("In the beginning", 40, 1.0, 11);
  const std::string c = model->generate("In the beginning", 40, 1.0, 12);
  EXPECT_EQ(a.size(), 40u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_TRUE(model->is_training());  // restored
  EXPECT_EQ(model->generate("", 3, 0.0, 0).size(), 3u);
  EXPECT_EQ(model->generate("x", 0, 1.0, 0), "");
  EXPECT_THROW(model->generate("x", 1, -1.0, 0), InvalidArgument);
}

// The end-of-training sample on a GPU: the context goes to the model's device, and the
// sampling (a CPU generator) to the CPU. (Not compared with the CPU's: at initialisation
// the logits are close enough for rounding to change an argmax.)
TEST(GptTest, GenerateRunsWhereTheModelIs) {
  try {
    trireme::dist::require_cuda_devices(1);
  } catch (const trireme::Error&) {
    GTEST_SKIP() << "no CUDA device";
  }
  Gpt gpu(tiny(), 6);
  gpu->to(at::Device(at::kCUDA, 0));
  EXPECT_EQ(gpu->generate("In the", 8, 0.0, 1).size(), 8u);
  EXPECT_EQ(gpu->generate("In the", 8, 0.8, 1), gpu->generate("In the", 8, 0.8, 1));
}

TEST(GptTest, TokenIdsOutsideTheVocabularyAreRefused) {
  Gpt model(tiny(), 6);
  const int64_t V = tiny().vocab, T = tiny().seq_len;
  const at::Tensor good = at::zeros({1, T}, at::kLong);
  at::Tensor bad = good.clone();
  bad[0][1] = V;
  EXPECT_THROW(model->loss(bad, good), InvalidArgument);
  EXPECT_THROW(model->loss(good, bad), InvalidArgument);
  EXPECT_THROW(model->loss(good - 1, good), InvalidArgument);
  auto layers = model->layers();
  EXPECT_THROW(layers[0].forward(bad), InvalidArgument);
  EXPECT_NO_THROW(model->loss(good, good));
}

// (GptConfig's own checks: tests/unit/test_train_settings.cpp.)
TEST(GptTest, TheModelRefusesAnInvalidConfig) {
  GptConfig c;
  c.heads = 0;
  EXPECT_THROW(Gpt(c, 0), InvalidArgument);
}

TEST(CorpusBatchTest, WindowsAreInputsAndShiftedTargets) {
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 50; ++i) bytes.push_back(static_cast<uint8_t>('a' + i % 26));
  const auto corpus = trireme::data::Corpus::from_bytes(bytes);
  const auto batch = trireme::data::make_batch(corpus, {0, 3, 42}, 7);
  ASSERT_EQ(batch.inputs.sizes(), (at::IntArrayRef{3, 7}));
  ASSERT_EQ(batch.targets.sizes(), (at::IntArrayRef{3, 7}));
  EXPECT_EQ(batch.inputs.scalar_type(), at::kLong);
  for (int64_t t = 0; t < 7; ++t) {
    EXPECT_EQ(batch.inputs[1][t].item<int64_t>(), bytes[3 + t]);
    EXPECT_EQ(batch.targets[1][t].item<int64_t>(), bytes[4 + t]);
    EXPECT_EQ(batch.targets[2][t].item<int64_t>(), bytes[43 + t]);
  }
  EXPECT_THROW(trireme::data::make_batch(corpus, {43}, 7), InvalidArgument);
  EXPECT_EQ(trireme::data::make_batch(corpus, {}, 7).inputs.sizes(), (at::IntArrayRef{0, 7}));
}

TEST(CorpusBatchTest, SamplerShardsBuildTheGlobalBatch) {
  std::vector<uint8_t> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(32 + i % 90);
  const auto corpus = trireme::data::Corpus::from_bytes(bytes);
  trireme::data::BatchSampler sampler(corpus.size(), 16, 8, 1);
  const auto global = trireme::data::make_batch(corpus, sampler.global_offsets(4), 16);
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < 4; ++r)
    parts.push_back(trireme::data::make_batch(corpus, sampler.shard(4, r, 4), 16).inputs);
  EXPECT_TRUE(at::equal(at::cat(parts, 0), global.inputs));
}
