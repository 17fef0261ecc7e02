// Megatron-style tensor parallelism on the `tp` axis of the mesh.
//
// A tensor-parallel group of t ranks holds one copy of the model between them: the large
// matrices are split, the rest (LayerNorms, position embeddings, the biases that follow a
// reduction) is replicated. With X (N, in) the input rows and a linear layer Y = X Aᵀ + b,
// A (out, in) as torch stores it:
//
//   column-parallel  A split by rows (the output dimension, dim 0 of the weight):
//                    rank r holds A_r (out/t, in) and b_r (out/t) and computes
//                    Y_r = X A_rᵀ + b_r, its slice of the output columns. The input X
//                    must be the same on every rank: copy_to_tensor_parallel (identity
//                    forward, all-reduce of dX backward, since each rank's dX is only
//                    the part coming through its slice).
//   row-parallel     A split by columns (the input dimension, dim 1 of the weight):
//                    rank r holds A_r (out, in/t) and gets X_r (N, in/t), the matching
//                    slice of the input, so X Aᵀ = Σ_r X_r A_rᵀ:
//                    reduce_from_tensor_parallel (all-reduce forward, identity backward),
//                    then the replicated bias b (out) is added once.
//
// An MLP is column-parallel then row-parallel, so the hidden activations stay split and
// there is one all-reduce forward and one backward. Attention splits the heads: the fused
// q/k/v projection is column-parallel with three blocks (rank r holds the rows of its
// heads in each of q, k and v: ShardSpec{dim 0, blocks 3}), attention runs on the local
// heads, and the output projection is row-parallel.
//
// The vocabulary is split too. The token embedding E (V, C) is split by rows: rank r owns
// ids [rV/t, (r+1)V/t), looks up only those (zeros elsewhere), and an all-reduce sums
// the t partial results. The output head (C -> V) is column-parallel, so rank r has the
// logits of its vocabulary slice only, and vocab_parallel_cross_entropy computes the loss
// without ever gathering the full (N, V) logits: with z the logits,
//   m = max_v z_v (all-reduce max),  S = Σ_v exp(z_v - m) (all-reduce sum),
//   z_y = the target's logit (all-reduce sum of the one rank that owns it),
//   loss = log S - (z_y - m);  dloss/dz_v = softmax_v - [v == y], each rank its slice.
//
// Which slice a rank holds is a ShardSpec: dim (or -1 for replicated) and blocks. The full
// tensor viewed along dim is `blocks` equal blocks; each block is cut into t equal pieces
// and rank r holds piece r of every block, concatenated. shard_of() takes a full tensor to
// a rank's shard, gather_shards() the reverse; a TP=t model initialised from the full
// TP=1 tensors is therefore the TP=1 model, slice for slice.
//
// With t = 1 every function here is the plain operation and no group is needed.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trireme/dist/backend.h"

namespace trireme::tensor {

// Dropout under tensor parallelism. Where activations are replicated (after an
// all-reduce: the residual stream, the embeddings) every rank must draw the same mask, and
// does, from the device's default generator: all ranks of a group draw from it in the
// same order. Where activations are split (attention probabilities of the local heads) the
// ranks must draw different masks, or the t slices would share one pattern: fork() runs
// such a region with the default generator of the tracker's device (the CPU's, or a
// GPU's, whose dropout draws from it) set to this rank's own stream (seeded by the seed
// and the rank), then puts the default stream back where it was, so the replicated
// regions stay identical across the group. The split stream is part of the training
// state: snapshots save it (split_generator()) so that a resume draws the masks the
// uninterrupted run would have.
class RngTracker {
 public:
  RngTracker(uint64_t seed, int rank, at::Device device = at::kCPU);
  template <class F>
  auto fork(F&& region) {
    at::Generator global = default_generator();
    const at::Tensor saved = global.get_state();
    global.set_state(split_.get_state());
    auto result = region();
    split_.set_state(global.get_state());
    global.set_state(saved);
    return result;
  }
  // This rank's split stream (its state is what a snapshot saves and restores).
  at::Generator& split_generator() { return split_; }

 private:
  at::Generator default_generator() const;
  at::Device device_;
  at::Generator split_;
};

// The seed a tensor-parallel group gives its RngTracker at data-parallel replica `replica`
// and pipeline stage `stage`: replicas see different samples and stages hold different
// layers, so their split regions draw different masks too (one process on the whole batch
// would draw them all from one stream), while the ranks of one group share it.
uint64_t split_stream_seed(uint64_t seed, int replica, int stage);

// This rank's place in its tensor-parallel group.
struct TensorParallel {
  dist::Group group;  // null when size == 1
  int rank = 0;
  int size = 1;
  std::shared_ptr<RngTracker> rng;  // for split-region dropout; null: no fork
  bool active() const { return size > 1; }
};

struct ShardSpec {
  int64_t dim = -1;    // -1: replicated on every rank of the group
  int64_t blocks = 1;  // the full tensor is this many blocks along dim, each split t ways
  bool replicated() const { return dim < 0; }
};

// The full shape of a tensor whose rank-local shape is `local` under `spec` with t ranks.
std::vector<int64_t> full_shape(at::IntArrayRef local, const ShardSpec& spec, int size);
// Rank `rank`'s shard of the full tensor (a contiguous copy). Throws InvalidArgument when
// the full size along dim is not divisible by blocks * size.
at::Tensor shard_of(const at::Tensor& full, const ShardSpec& spec, int rank, int size);
// The full tensor from every rank's shard (all-gather over the group; every rank gets it).
at::Tensor gather_shards(const at::Tensor& local, const ShardSpec& spec, const TensorParallel& tp);

// The conjugate pair of autograd operators. Both are the identity when tp is inactive.
at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const TensorParallel& tp);      // fwd id, bwd all-reduce
at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, const TensorParallel& tp);  // fwd all-reduce, bwd id

// Mean over rows of the cross-entropy of logits (N, V/t), this rank's vocabulary slice
// [rank*V/t, (rank+1)*V/t), for targets (N) int64 in [0, V). Equal to
// at::cross_entropy_loss on the gathered logits; the full logits never exist.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                                        const TensorParallel& tp);

// A module whose parameters may be split across the tensor-parallel group.
class ShardedModule : public torch::nn::Module {
 public:
  // ShardSpec of each of this module's own parameters, by name ("weight", "bias").
  const std::map<std::string, ShardSpec>& shard_specs() const { return specs_; }

 protected:
  at::Tensor register_sharded(const std::string& name, at::Tensor local, ShardSpec spec);

 private:
  std::map<std::string, ShardSpec> specs_;
};

// Y_r = X A_rᵀ + b_r, the output split in `blocks` blocks (see above). The output is
// this rank's slice; the input must be replicated. Parameters "weight" (out/t, in) and
// "bias" (out/t), named like torch::nn::Linear's.
class ColumnParallelLinearImpl : public ShardedModule {
 public:
  ColumnParallelLinearImpl(int64_t in, int64_t out, bool bias, TensorParallel tp, int64_t blocks = 1);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;
  bool split_backward = false;  // weight gradient deferrable (pipeline/deferred_linear.h)

 private:
  TensorParallel tp_;
};
TORCH_MODULE(ColumnParallelLinear);

// Y = Σ_r X_r A_rᵀ + b: the input is this rank's slice of the features, the output is
// replicated. Parameters "weight" (out, in/t) and "bias" (out, replicated).
class RowParallelLinearImpl : public ShardedModule {
 public:
  RowParallelLinearImpl(int64_t in, int64_t out, bool bias, TensorParallel tp);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;
  bool split_backward = false;

 private:
  TensorParallel tp_;
};
TORCH_MODULE(RowParallelLinear);

// Token embedding with the vocabulary split by rows: "weight" (V/t, C). Output replicated.
class VocabParallelEmbeddingImpl : public ShardedModule {
 public:
  VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, TensorParallel tp);
  at::Tensor forward(const at::Tensor& ids);
  at::Tensor weight;

 private:
  TensorParallel tp_;
  int64_t first_ = 0, count_ = 0;  // this rank's ids: [first_, first_ + count_)
};
TORCH_MODULE(VocabParallelEmbedding);

// ShardSpec of every parameter of `module` (recursively), by its full dotted name;
// parameters of ordinary modules are replicated.
std::map<std::string, ShardSpec> shard_specs(const torch::nn::Module& module);

}  // namespace trireme::tensor
