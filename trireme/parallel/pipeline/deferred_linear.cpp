// deferred_linear as a custom autograd function; see deferred_linear.h.
#include "trireme/parallel/pipeline/deferred_linear.h"

#include <torch/csrc/autograd/custom_function.h>

#include <map>

namespace trireme::pipeline {
namespace {

// The queue of the innermost DeferWeightGrads scope on this thread, or null.
thread_local WeightGradQueue* current_queue = nullptr;

// Adds `value` to the gradient of the leaf `param`, as AccumulateGrad would.
void accumulate(const at::Tensor& param, const at::Tensor& value) {
  at::Tensor& grad = const_cast<at::Tensor&>(param).mutable_grad();
  if (grad.defined())
    grad.add_(value);
  else
    grad = value;
}

// The backward of x W^T (+ b): the input gradient now; the weight (and bias) gradients now,
// or queued when a DeferWeightGrads scope is active. A frozen weight or bias (requires_grad
// false: fine-tuning) gets none, and is not reported to the queue.
torch::autograd::variable_list linear_backward(const at::Tensor& x, const at::Tensor& weight,
                                               const at::Tensor& bias, const at::Tensor& grad_out) {
  const at::Tensor grad_x = at::matmul(grad_out, weight);  // (..., in)
  const bool want_weight = weight.requires_grad(), want_bias = bias.defined() && bias.requires_grad();
  if (!want_weight && !want_bias) return {grad_x, at::Tensor(), at::Tensor()};
  // Weight gradients from the flattened batch: (out, N) x (N, in). The values only: with
  // its autograd history, x would keep everything behind it (on a pipeline stage, the
  // received activation and its gradient) alive until the queue runs.
  auto weight_grads = [x = x.detach(), grad_out = grad_out.detach(), want_weight, want_bias] {
    at::NoGradGuard no_grad;
    const at::Tensor g2 = grad_out.reshape({-1, grad_out.size(-1)});
    return std::make_pair(want_weight ? g2.t().mm(x.reshape({-1, x.size(-1)})) : at::Tensor(),
                          want_bias ? g2.sum(0) : at::Tensor());
  };
  if (current_queue) {
    std::vector<at::Tensor> params;
    if (want_weight) params.push_back(weight);
    if (want_bias) params.push_back(bias);
    current_queue->push(
        [weight_grads, weight, bias] {
          const auto [grad_weight, grad_bias] = weight_grads();
          if (grad_weight.defined()) accumulate(weight, grad_weight);
          if (grad_bias.defined()) accumulate(bias, grad_bias);
        },
        std::move(params));
    return {grad_x, at::Tensor(), at::Tensor()};
  }
  const auto [grad_weight, grad_bias] = weight_grads();
  return {grad_x, grad_weight, grad_bias};
}

struct DeferredLinear : torch::autograd::Function<DeferredLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, const at::Tensor& bias) {
    ctx->saved_data["x"] = x;
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["bias"] = bias;
    return at::linear(x, weight, bias);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return linear_backward(ctx->saved_data["x"].toTensor(), ctx->saved_data["weight"].toTensor(),
                           ctx->saved_data["bias"].toTensor(), grads[0]);
  }
};

// The same without a bias (autograd functions take no undefined tensor inputs).
struct DeferredLinearNoBias : torch::autograd::Function<DeferredLinearNoBias> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight) {
    ctx->saved_data["x"] = x;
    ctx->saved_data["weight"] = weight;
    return at::linear(x, weight);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto out = linear_backward(ctx->saved_data["x"].toTensor(), ctx->saved_data["weight"].toTensor(),
                               at::Tensor(), grads[0]);
    out.pop_back();
    return out;
  }
};

}  // namespace

void WeightGradQueue::push(std::function<void()> work, std::vector<at::Tensor> params) {
  work_.push_back({std::move(work), std::move(params)});
}

void WeightGradQueue::run_all(const std::function<void(const at::Tensor&)>& on_accumulated) {
  auto items = std::move(work_);
  work_.clear();
  std::map<const void*, size_t> last_use;  // parameter -> the last item accumulating into it
  for (size_t i = 0; i < items.size(); ++i)
    for (const auto& p : items[i].params) last_use[p.unsafeGetTensorImpl()] = i;
  for (size_t i = 0; i < items.size(); ++i) {
    items[i].work();
    if (!on_accumulated) continue;
    for (const auto& p : items[i].params) {
      auto it = last_use.find(p.unsafeGetTensorImpl());
      if (it == last_use.end() || it->second != i) continue;
      last_use.erase(it);  // (also when one item lists it twice)
      on_accumulated(p);
    }
  }
}

DeferWeightGrads::DeferWeightGrads(WeightGradQueue& queue) : previous_(current_queue) {
  current_queue = &queue;
}

DeferWeightGrads::~DeferWeightGrads() { current_queue = previous_; }

at::Tensor deferred_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return bias.defined() ? DeferredLinear::apply(x, weight, bias)
                        : DeferredLinearNoBias::apply(x, weight);
}

}  // namespace trireme::pipeline
