// The reference GPT; see gpt.h for the layout and the shape legend.
#include "trireme/models/gpt.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <vector>

#include "trireme/common/error.h"

namespace trireme::models {
namespace {

// Standard deviation of the normal initialisation (GPT-2).
constexpr double kInitStd = 0.02;

const GptConfig& validated(const GptConfig& config) {
  config.validate();
  return config;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The last dotted component before the parameter name, e.g. "ln_1" in "h.0.ln_1.weight".
std::string owner_of(const std::string& name) {
  const size_t last = name.rfind('.');
  if (last == std::string::npos) return "";
  const size_t prev = name.rfind('.', last - 1);
  return name.substr(prev == std::string::npos ? 0 : prev + 1,
                     last - (prev == std::string::npos ? 0 : prev + 1));
}

// Puts a module in eval mode for a scope and restores its training flag, even on a throw.
class EvalScope {
 public:
  explicit EvalScope(torch::nn::Module& module)
      : module_(module), was_training_(module.is_training()) {
    module_.eval();
  }
  ~EvalScope() { module_.train(was_training_); }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_training_;
};

// Token ids outside [0, vocab) would read another row (or, split by vocabulary, silently
// none); checked on the CPU, where it costs one pass (on a GPU it would add a sync).
void check_token_ids(const at::Tensor& ids, int64_t vocab, const char* what) {
  if (!ids.device().is_cpu() || ids.numel() == 0) return;
  const int64_t low = ids.min().item<int64_t>(), high = ids.max().item<int64_t>();
  TRIREME_CHECK(low >= 0 && high < vocab, "GPT ", what, " hold token ids in [", low, ", ", high,
                "], outside the vocabulary [0, ", vocab, "); give ids below --vocab");
}

at::Tensor maybe_dropout(const at::Tensor& x, double p, bool training) {
  return p > 0.0 ? at::dropout(x, p, training) : x;
}

}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& config,
                                                 const tensor::TensorParallel& tp)
    : heads_(config.heads / tp.size), tp_(tp), dropout_(config.dropout) {
  qkv = register_module("qkv", tensor::ColumnParallelLinear(config.dim, 3 * config.dim, true, tp, 3));
  proj = register_module("proj", tensor::RowParallelLinear(config.dim, config.dim, true, tp));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  // C here is this rank's share of the width: its heads_ heads of D each.
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t C = qkv->weight.size(0) / 3, D = C / heads_;
  std::vector<at::Tensor> parts = qkv->forward(x).split(C, /*dim=*/2);  // 3 x (B,T,C)
  at::Tensor q = parts[0].view({B, T, heads_, D}).transpose(1, 2);    // (B,H,T,D)
  at::Tensor k = parts[1].view({B, T, heads_, D}).transpose(1, 2);    // (B,H,T,D)
  at::Tensor v = parts[2].view({B, T, heads_, D}).transpose(1, 2);    // (B,H,T,D)
  const double p = is_training() ? dropout_ : 0.0;
  auto attend = [&] { return at::scaled_dot_product_attention(q, k, v, {}, p, /*is_causal=*/true); };
  // The local heads are split across the tensor-parallel group: their dropout masks must
  // differ from the other ranks' (RngTracker).
  at::Tensor y = p > 0 && tp_.active() && tp_.rng ? tp_.rng->fork(attend) : attend();  // (B,H,T,D)
  y = y.transpose(1, 2).contiguous().view({B, T, C});                   // (B,T,C)
  return maybe_dropout(proj->forward(y), dropout_, is_training());
}

MlpImpl::MlpImpl(const GptConfig& config, const tensor::TensorParallel& tp) : dropout_(config.dropout) {
  const int64_t hidden = config.mlp_ratio * config.dim;
  fc = register_module("fc", tensor::ColumnParallelLinear(config.dim, hidden, true, tp));
  proj = register_module("proj", tensor::RowParallelLinear(hidden, config.dim, true, tp));
}

at::Tensor MlpImpl::forward(const at::Tensor& x) {
  at::Tensor hidden = at::gelu(fc->forward(x), "tanh");                 // (B,T,R*C/t)
  return maybe_dropout(proj->forward(hidden), dropout_, is_training());  // (B,T,C)
}

BlockImpl::BlockImpl(const GptConfig& config, const tensor::TensorParallel& tp) {
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.dim})));
  attn = register_module("attn", CausalSelfAttention(config, tp));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.dim})));
  mlp = register_module("mlp", Mlp(config, tp));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  at::Tensor y = x + attn->forward(ln_1->forward(x));  // (B,T,C)
  return y + mlp->forward(ln_2->forward(y));           // (B,T,C)
}

GptImpl::GptImpl(const GptConfig& config, uint64_t seed, tensor::TensorParallel tp, bool initialize)
    : config_(validated(config)), tp_(std::move(tp)) {
  TRIREME_CHECK(tp_.size >= 1 && config_.heads % tp_.size == 0, "--heads ", config_.heads,
                " is not divisible by --tp ", tp_.size, "; choose --tp dividing the heads");
  TRIREME_CHECK(config_.vocab % tp_.size == 0, "--vocab ", config_.vocab, " is not divisible by --tp ",
                tp_.size, "; choose --tp dividing the vocabulary");
  const int64_t C = config_.dim;
  wte = register_module("wte", tensor::VocabParallelEmbedding(config_.vocab, C, tp_));
  // Given its (uninitialised) weight, Embedding skips its own N(0, 1) draw, which would
  // take seq_len*C numbers from the global generator (and move every later dropout mask).
  wpe = register_module(
      "wpe", torch::nn::Embedding(torch::nn::EmbeddingOptions(config_.seq_len, C)._weight(at::empty({config_.seq_len, C}))));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t l = 0; l < config_.layers; ++l) h->push_back(Block(config_, tp_));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({C})));
  head = register_module("head", tensor::ColumnParallelLinear(C, config_.vocab, false, tp_));
  specs_ = tensor::shard_specs(*this);
  if (initialize) {
    init_parameters(seed);
  } else {
    at::NoGradGuard no_grad;  // some layers allocate without initialising: make it defined
    for (auto& p : parameters()) p.zero_();
  }
}

void GptImpl::init_parameters(uint64_t seed) {
  // GPT-2 scheme: weights N(0, 0.02); residual projections N(0, 0.02/sqrt(2L)) so the
  // residual stream's variance does not grow with depth; biases 0; LayerNorm (1, 0).
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(config_.layers));
  at::NoGradGuard no_grad;
  // Each tensor is drawn whole (the TP=1 shape), then this rank keeps its slice.
  for (const auto& item : named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    at::Tensor p = item.value();
    const tensor::ShardSpec& spec = specs_.at(name);
    // Drawn on the CPU (the generator's device) whatever device the model is on by now.
    at::Tensor full = at::empty(tensor::full_shape(p.sizes(), spec, tp_.size), p.options().device(at::kCPU));
    const std::string owner = owner_of(name);
    if (ends_with(name, ".bias")) {
      full.zero_();
    } else if (owner.rfind("ln_", 0) == 0) {
      full.fill_(1.0);
    } else if (ends_with(name, "attn.proj.weight") || ends_with(name, "mlp.proj.weight")) {
      full.normal_(0.0, residual_std, gen);
    } else {
      full.normal_(0.0, kInitStd, gen);
    }
    p.copy_(tp_.active() ? tensor::shard_of(full, spec, tp_.rank, tp_.size) : full);
  }
}

at::Tensor GptImpl::forward(const at::Tensor& idx) {
  at::Tensor logits = local_logits(idx);
  if (!tp_.active()) return logits;
  return tensor::gather_shards(logits.detach(), tensor::ShardSpec{2, 1}, tp_);
}

at::Tensor GptImpl::local_logits(const at::Tensor& idx) {
  TRIREME_CHECK(idx.dim() == 2, "GPT input must be (B,T), got ", idx.dim(), " dimensions");
  TRIREME_CHECK(idx.scalar_type() == at::kLong, "GPT input must be int64 token ids");
  const int64_t T = idx.size(1);
  TRIREME_CHECK(T >= 1 && T <= config_.seq_len, "GPT input length ", T,
                " is outside 1..--seq ", config_.seq_len);
  check_token_ids(idx, config_.vocab, "inputs");
  at::Tensor pos = at::arange(T, idx.options());                                  // (T)
  at::Tensor x = wte->forward(idx) + wpe->forward(pos);                          // (B,T,C)
  x = maybe_dropout(x, config_.dropout, is_training());
  for (const auto& block : *h) x = block->as<BlockImpl>()->forward(x);           // (B,T,C)
  return head->forward(ln_f->forward(x));  // (B,T,V/t)
}

at::Tensor GptImpl::loss(const at::Tensor& idx, const at::Tensor& targets) {
  TRIREME_CHECK(targets.sizes() == idx.sizes(), "GPT targets must have the shape of the inputs");
  check_token_ids(targets, config_.vocab, "targets");
  return loss_of_logits(local_logits(idx), targets);
}

at::Tensor GptImpl::loss_of_logits(const at::Tensor& logits, const at::Tensor& targets) const {
  return tensor::vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}), tp_);
}

std::string GptImpl::generate(const std::string& prompt, int64_t new_tokens, double temperature,
                              uint64_t seed) {
  TRIREME_CHECK(config_.vocab == 256, "text generation needs --vocab 256 (bytes), got ",
                config_.vocab);
  TRIREME_CHECK(new_tokens >= 0, "number of tokens to generate must be non-negative, got ",
                new_tokens);
  TRIREME_CHECK(temperature >= 0.0, "--temperature must be non-negative, got ", temperature);
  at::NoGradGuard no_grad;
  EvalScope eval_scope(*this);

  std::vector<int64_t> tokens;
  for (unsigned char c : (prompt.empty() ? std::string("\n") : prompt)) tokens.push_back(c);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const at::Device device = wte->weight.device();  // the context goes where the model is
  std::string out;
  out.reserve(static_cast<size_t>(new_tokens));
  for (int64_t i = 0; i < new_tokens; ++i) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(tokens.size()), config_.seq_len);
    at::Tensor ctx = at::tensor(std::vector<int64_t>(tokens.end() - T, tokens.end()), at::kLong)
                         .view({1, T})
                         .to(device);                              // (1,T)
    at::Tensor last = forward(ctx).select(1, T - 1)[0].to(at::kCPU);  // (V), sampled on the CPU
    int64_t next;
    if (temperature == 0.0) {
      next = last.argmax().item<int64_t>();
    } else {
      at::Tensor probs = at::softmax(last.to(at::kDouble) / temperature, -1);  // (V)
      next = at::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
    }
    tokens.push_back(next);
    out.push_back(static_cast<char>(static_cast<unsigned char>(next)));
  }
  return out;
}

pipeline::LayerList GptImpl::layers() {
  pipeline::LayerList list;
  const double dropout = config_.dropout;
  const int64_t seq_len = config_.seq_len, vocab = config_.vocab;
  list.push_back({"embeddings",
                  {{"wte", wte.ptr()}, {"wpe", wpe.ptr()}},
                  [wte = wte, wpe = wpe, dropout, seq_len, vocab](const at::Tensor& idx) mutable {
                    TRIREME_CHECK(idx.dim() == 2 && idx.size(1) >= 1 && idx.size(1) <= seq_len,
                                  "GPT input must be (B,T) with 1 <= T <= --seq ", seq_len);
                    check_token_ids(idx, vocab, "inputs");
                    at::Tensor pos = at::arange(idx.size(1), idx.options());
                    at::Tensor x = wte->forward(idx) + wpe->forward(pos);
                    return maybe_dropout(x, dropout, wte->is_training());
                  }});
  for (size_t l = 0; l < h->size(); ++l) {
    auto block = h->ptr<BlockImpl>(l);
    list.push_back({"h." + std::to_string(l),
                    {{"h." + std::to_string(l), block}},
                    [block](const at::Tensor& x) { return block->forward(x); }});
  }
  list.push_back({"head",
                  {{"ln_f", ln_f.ptr()}, {"head", head.ptr()}},
                  [ln_f = ln_f, head = head](const at::Tensor& x) mutable {
                    return head->forward(ln_f->forward(x));
                  }});
  return list;
}

int64_t GptImpl::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters(/*recurse=*/true)) n += p.numel();
  return n;
}

void GptImpl::set_split_backward(bool split) {
  head->split_backward = split;
  for (const auto& block : *h) {
    auto* b = block->as<BlockImpl>();
    b->attn->qkv->split_backward = split;
    b->attn->proj->split_backward = split;
    b->mlp->fc->split_backward = split;
    b->mlp->proj->split_backward = split;
  }
}

}  // namespace trireme::models
