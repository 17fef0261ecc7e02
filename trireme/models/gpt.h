// The reference GPT: a byte-level decoder-only transformer (GPT-2 layout, pre-LayerNorm).
//
//   idx (B,T) -> wte + wpe -> h.0 .. h.{L-1} -> ln_f -> head -> logits (B,T,V)
//   block:  x = x + attn.proj(SDPA_causal(attn.qkv(ln_1(x))))
//           x = x + mlp.proj(gelu_tanh(mlp.fc(ln_2(x))))
//
// B batch, T sequence length (<= seq_len), C = dim, H heads, D = C/H head size, V vocab.
// Parameter names and shapes match bench/py/gpt.py exactly, so the Python peer has the
// same parameter count. Initialisation depends on the seed only: a local CPU generator
// fills every parameter in registration order; the global RNG is never touched.
//
// Tensor parallelism (parallel/tensor/tensor_parallel.h) over t ranks: the attention heads,
// the MLP's hidden features and the vocabulary are split t ways (qkv and mlp.fc
// column-parallel, attn.proj and mlp.proj row-parallel, wte and head split by vocabulary),
// the LayerNorms, wpe and the row-parallel biases are replicated. Parameter names stay
// those of the whole model; shapes are the local shards. Each parameter is initialised by
// drawing the whole TP=1 tensor from the generator and keeping this rank's slice, so a
// TP=t model is the TP=1 model of the same seed, slice for slice.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>

#include "trireme/models/gpt_config.h"
#include "trireme/parallel/pipeline/stage.h"
#include "trireme/parallel/tensor/tensor_parallel.h"

namespace trireme::models {

// Causal multi-head self-attention with a fused q/k/v projection.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const GptConfig& config, const tensor::TensorParallel& tp);
  at::Tensor forward(const at::Tensor& x);  // (B,T,C) -> (B,T,C)

  tensor::ColumnParallelLinear qkv{nullptr};  // C -> 3C (q, k, v blocks; local heads' rows)
  tensor::RowParallelLinear proj{nullptr};    // C -> C, residual projection

 private:
  int64_t heads_;  // on this rank: H / t
  tensor::TensorParallel tp_;
  double dropout_;
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const GptConfig& config, const tensor::TensorParallel& tp);
  at::Tensor forward(const at::Tensor& x);  // (B,T,C) -> (B,T,C)

  tensor::ColumnParallelLinear fc{nullptr};  // C -> R*C
  tensor::RowParallelLinear proj{nullptr};   // R*C -> C, residual projection

 private:
  double dropout_;
};
TORCH_MODULE(Mlp);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const GptConfig& config, const tensor::TensorParallel& tp);
  at::Tensor forward(const at::Tensor& x);  // (B,T,C) -> (B,T,C)

  torch::nn::LayerNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  // Throws InvalidArgument when config.validate() does, or when the heads or the
  // vocabulary are not divisible by the tensor-parallel size. With `initialize` false the
  // parameters are zeros (for a caller about to restore them, who calls
  // init_parameters(seed) if it cannot).
  GptImpl(const GptConfig& config, uint64_t seed, tensor::TensorParallel tp = {}, bool initialize = true);

  // Sets every parameter to its seeded initial value, on whatever device the model is
  // (what construction does).
  void init_parameters(uint64_t seed);

  // idx (B,T) int64 with T <= seq_len and values in [0, vocab) -> logits (B,T,V). Under
  // tensor parallelism the logits are gathered (a collective: every rank of the group
  // must call it); training uses loss(), which never gathers them.
  at::Tensor forward(const at::Tensor& idx);

  // Mean cross-entropy over all B*T positions; targets (B,T) int64. Vocabulary-parallel
  // under tensor parallelism.
  at::Tensor loss(const at::Tensor& idx, const at::Tensor& targets);
  // The same loss from this rank's logits (B,T,V/t), e.g. a pipeline's last stage.
  at::Tensor loss_of_logits(const at::Tensor& logits, const at::Tensor& targets) const;

  // Samples new_tokens bytes after `prompt` (softmax at `temperature`, multinomial from a
  // local generator seeded with `seed`; temperature 0 means greedy), cropping the context
  // to the last seq_len tokens. Returns only the new bytes, which need not be UTF-8. An
  // empty prompt starts from "\n". Runs in eval mode under NoGradGuard and restores the
  // training flag afterwards. Needs vocab == 256 (the byte tokenizer).
  std::string generate(const std::string& prompt, int64_t new_tokens, double temperature,
                       uint64_t seed);

  // The model as a layer list for pipeline parallelism (L + 2 layers):
  //   0 "embeddings"  idx (B,T) -> wte + wpe (B,T,C)      modules wte, wpe
  //   1..L "h.l"      block l (B,T,C) -> (B,T,C)          module h.l
  //   L+1 "head"      ln_f, head (B,T,C) -> logits (B,T,V/t) modules ln_f, head
  // The layers hold the submodules, not the model, so the model may be dropped once a
  // stage has kept its layers.
  pipeline::LayerList layers();

  int64_t num_parameters() const;
  const GptConfig& config() const { return config_; }
  const tensor::TensorParallel& tensor_parallel() const { return tp_; }
  // How each parameter is split across the tensor-parallel group, by name.
  const std::map<std::string, tensor::ShardSpec>& shard_specs() const { return specs_; }
  // Routes every linear layer through pipeline::deferred_linear, so that a zero-bubble
  // schedule can run the weight-gradient half of backward later. Off by default: then the
  // layers are plain at::linear.
  void set_split_backward(bool split);

  tensor::VocabParallelEmbedding wte{nullptr};  // (V/t,C)
  torch::nn::Embedding wpe{nullptr};            // (seq_len,C)
  torch::nn::ModuleList h{nullptr};             // L Blocks
  torch::nn::LayerNorm ln_f{nullptr};
  tensor::ColumnParallelLinear head{nullptr};   // C -> V/t, no bias

 private:
  at::Tensor local_logits(const at::Tensor& idx);  // (B,T,V/t)

  GptConfig config_;
  tensor::TensorParallel tp_;
  std::map<std::string, tensor::ShardSpec> specs_;
};
TORCH_MODULE(Gpt);

}  // namespace trireme::models
