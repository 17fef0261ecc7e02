// Tensor-parallel operators and layers; see parallel/tensor/tensor_parallel.h for the math.
#include "trireme/parallel/tensor/tensor_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>

#include "trireme/common/error.h"
#include "trireme/parallel/pipeline/deferred_linear.h"

namespace trireme::tensor {
namespace {

void all_reduce(at::Tensor& t, const TensorParallel& tp, c10d::ReduceOp op, const char* what) {
  std::vector<at::Tensor> buffer{t};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  dist::run_collective(what, [&] { return tp.group->allreduce(buffer, options); });
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, bool split) {
  return split ? pipeline::deferred_linear(x, weight, bias) : at::linear(x, weight, bias);
}

// Forward: the sum over the group; backward: the gradient unchanged (every rank's output
// gets the same gradient, and each rank's input contributed with weight one).
struct ReduceFrom : torch::autograd::Function<ReduceFrom> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x,
                            const TensorParallel* tp) {
    at::Tensor sum = x.contiguous().clone();
    all_reduce(sum, *tp, c10d::ReduceOp::SUM, "tensor-parallel all-reduce (forward)");
    return sum;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grad) {
    return {grad[0], at::Tensor()};
  }
};

// The loss over this rank's vocabulary slice; the header has the formula. Backward needs
// no communication: each rank's slice of softmax - onehot is local.
struct VocabCrossEntropy : torch::autograd::Function<VocabCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, const TensorParallel* tp) {
    const int64_t rows = logits.size(0), width = logits.size(1), first = tp->rank * width;
    at::Tensor max = std::get<0>(logits.max(1));  // (N)
    all_reduce(max, *tp, c10d::ReduceOp::MAX, "vocab-parallel cross-entropy max");
    at::Tensor shifted = logits - max.unsqueeze(1);  // (N, V/t)
    at::Tensor exp = shifted.exp();
    const at::Tensor mine = (targets >= first) & (targets < first + width);  // (N) bool
    const at::Tensor local = (targets - first).masked_fill(~mine, 0);         // (N)
    at::Tensor target_logit = shifted.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(~mine, 0);
    at::Tensor sums = at::stack({exp.sum(1), target_logit}, 1).contiguous();  // (N, 2): S, z_y - m
    all_reduce(sums, *tp, c10d::ReduceOp::SUM, "vocab-parallel cross-entropy sums");
    const at::Tensor total = sums.select(1, 0);
    at::Tensor softmax = exp / total.unsqueeze(1);
    ctx->save_for_backward({softmax, local, mine});
    ctx->saved_data["rows"] = rows;
    return (total.log() - sums.select(1, 1)).mean();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor g = saved[0].clone();  // softmax (N, V/t)
    g.scatter_add_(1, saved[1].unsqueeze(1), -saved[2].to(g.scalar_type()).unsqueeze(1));
    g.mul_(grad[0] / static_cast<double>(ctx->saved_data["rows"].toInt()));
    return {g, at::Tensor(), at::Tensor()};
  }
};

void check_divisible(int64_t n, int64_t by, const char* what) {
  TRIREME_CHECK(by > 0 && n % by == 0, what, " ", n, " is not divisible by ", by,
                " (tensor-parallel size x blocks); choose --tp dividing it");
}

}  // namespace

// The offset keeps the split stream apart from the seed's other uses (Megatron uses one too).
// A GPU's stream is a clone of that GPU's default generator (same kind), then reseeded.
uint64_t split_stream_seed(uint64_t seed, int replica, int stage) {
  return seed + 15485863 * static_cast<uint64_t>(replica) + 104729 * static_cast<uint64_t>(stage);
}

RngTracker::RngTracker(uint64_t seed, int rank, at::Device device) : device_(device) {
  const uint64_t split_seed = seed + 2718 + 7919 * static_cast<uint64_t>(rank);
  if (device.is_cpu()) {
    split_ = at::detail::createCPUGenerator(split_seed);
  } else {
    split_ = default_generator().clone();
    std::lock_guard<std::mutex> lock(split_.mutex());
    split_.set_current_seed(split_seed);
  }
}

at::Generator RngTracker::default_generator() const {
  return device_.is_cpu() ? at::detail::getDefaultCPUGenerator() : at::globalContext().defaultGenerator(device_);
}

std::vector<int64_t> full_shape(at::IntArrayRef local, const ShardSpec& spec, int size) {
  std::vector<int64_t> shape(local.begin(), local.end());
  if (!spec.replicated()) shape[static_cast<size_t>(spec.dim)] *= size;
  return shape;
}

at::Tensor shard_of(const at::Tensor& full, const ShardSpec& spec, int rank, int size) {
  if (spec.replicated() || size == 1) return full.clone();
  check_divisible(full.size(spec.dim), spec.blocks * size, "tensor dimension");
  std::vector<at::Tensor> pieces;
  for (const at::Tensor& block : full.chunk(spec.blocks, spec.dim))
    pieces.push_back(block.chunk(size, spec.dim)[static_cast<size_t>(rank)]);
  return at::cat(pieces, spec.dim).contiguous();
}

at::Tensor gather_shards(const at::Tensor& local, const ShardSpec& spec, const TensorParallel& tp) {
  if (spec.replicated() || !tp.active()) return local.clone();
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < tp.size; ++r) outputs[0].push_back(at::empty_like(local));
  std::vector<at::Tensor> inputs{local.contiguous()};
  dist::run_collective("tensor-parallel all-gather", [&] { return tp.group->allgather(outputs, inputs); });
  // Rank r's shard is piece r of each block: regroup as block 0's pieces, block 1's, ...
  std::vector<at::Tensor> ordered;
  for (int64_t b = 0; b < spec.blocks; ++b)
    for (const at::Tensor& shard : outputs[0]) ordered.push_back(shard.chunk(spec.blocks, spec.dim)[b]);
  return at::cat(ordered, spec.dim);
}

at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const TensorParallel& tp) {
  if (!tp.active() || !x.requires_grad()) return x;
  // An alias whose gradient hook sums the ranks' input gradients before they flow on.
  at::Tensor y = x.view_as(x);
  y.register_hook([tp](const at::Tensor& grad) {
    at::Tensor sum = grad.contiguous().clone();
    all_reduce(sum, tp, c10d::ReduceOp::SUM, "tensor-parallel all-reduce (backward)");
    return sum;
  });
  return y;
}

at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, const TensorParallel& tp) {
  if (!tp.active()) return x;
  return ReduceFrom::apply(x, &tp);
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                                        const TensorParallel& tp) {
  TRIREME_CHECK(logits.dim() == 2 && targets.dim() == 1 && logits.size(0) == targets.size(0),
                "vocab-parallel cross-entropy needs logits (N, V/t) and targets (N)");
  if (!tp.active()) return at::cross_entropy_loss(logits, targets);
  // A target that no rank's slice holds would count as a logit of 0 on every rank: a wrong
  // loss without an error (-100, the usual ignored target, included). One host sync.
  const int64_t vocab = logits.size(1) * tp.size;
  TRIREME_CHECK(!((targets < 0) | (targets >= vocab)).any().item<bool>(),
                "vocab-parallel cross-entropy needs every target in [0, ", vocab,
                "); ignored targets (-100) are not supported under tensor parallelism");
  return VocabCrossEntropy::apply(logits, targets, &tp);
}

at::Tensor ShardedModule::register_sharded(const std::string& name, at::Tensor local, ShardSpec spec) {
  specs_[name] = spec;
  return register_parameter(name, std::move(local));
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in, int64_t out, bool with_bias,
                                                   TensorParallel tp, int64_t blocks)
    : tp_(std::move(tp)) {
  check_divisible(out, blocks * tp_.size, "output features");
  weight = register_sharded("weight", at::empty({out / tp_.size, in}), {0, blocks});
  if (with_bias) bias = register_sharded("bias", at::empty({out / tp_.size}), {0, blocks});
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  return linear(copy_to_tensor_parallel(x, tp_), weight, bias, split_backward);
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in, int64_t out, bool with_bias, TensorParallel tp)
    : tp_(std::move(tp)) {
  check_divisible(in, tp_.size, "input features");
  weight = register_sharded("weight", at::empty({out, in / tp_.size}), {1, 1});
  if (with_bias) bias = register_sharded("bias", at::empty({out}), {});
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x) {
  if (!tp_.active()) return linear(x, weight, bias, split_backward);
  at::Tensor y = reduce_from_tensor_parallel(linear(x, weight, at::Tensor(), split_backward), tp_);
  return bias.defined() ? y + bias : y;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, TensorParallel tp)
    : tp_(std::move(tp)) {
  check_divisible(vocab, tp_.size, "vocabulary size");
  count_ = vocab / tp_.size;
  first_ = tp_.rank * count_;
  weight = register_sharded("weight", at::empty({count_, dim}), {0, 1});
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  if (!tp_.active()) return at::embedding(weight, ids);
  const at::Tensor other = (ids < first_) | (ids >= first_ + count_);
  at::Tensor out = at::embedding(weight, (ids - first_).masked_fill(other, 0));
  return reduce_from_tensor_parallel(out.masked_fill(other.unsqueeze(-1), 0.0), tp_);
}

std::map<std::string, ShardSpec> shard_specs(const torch::nn::Module& module) {
  std::map<std::string, ShardSpec> specs;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) specs[item.key()] = ShardSpec{};
  auto add = [&](const std::string& prefix, const torch::nn::Module* m) {
    if (const auto* sharded = dynamic_cast<const ShardedModule*>(m))
      for (const auto& [name, spec] : sharded->shard_specs())
        specs[prefix.empty() ? name : prefix + "." + name] = spec;
  };
  add("", &module);  // (named_modules cannot include a module that is not in a shared_ptr)
  for (const auto& item : module.named_modules("", /*include_self=*/false)) add(item.key(), item.value().get());
  return specs;
}

}  // namespace trireme::tensor
