// deferred_linear as a custom autograd function; see deferred_linear.h.
#include "trireme/parallel/pipeline/deferred_linear.h"

#include <torch/csrc/autograd/custom_function.h>

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
    const at::Tensor x = ctx->saved_data["x"].toTensor();
    const at::Tensor weight = ctx->saved_data["weight"].toTensor();
    const at::Tensor bias = ctx->saved_data["bias"].toOptional<at::Tensor>().value_or(at::Tensor());
    const at::Tensor grad_out = grads[0];
    const at::Tensor grad_x = at::matmul(grad_out, weight);  // (..., in)
    // Weight gradients from the flattened batch: (out, N) x (N, in).
    auto weight_grads = [x, grad_out, weight, bias] {
      at::NoGradGuard no_grad;
      const at::Tensor g2 = grad_out.reshape({-1, grad_out.size(-1)});
      const at::Tensor x2 = x.reshape({-1, x.size(-1)});
      std::vector<at::Tensor> out{g2.t().mm(x2), bias.defined() ? g2.sum(0) : at::Tensor()};
      return out;
    };
    if (current_queue) {
      current_queue->push([weight_grads, weight, bias] {
        const auto g = weight_grads();
        accumulate(weight, g[0]);
        if (bias.defined()) accumulate(bias, g[1]);
      });
      return {grad_x, at::Tensor(), at::Tensor()};
    }
    const auto g = weight_grads();
    return {grad_x, g[0], g[1]};
  }
};

}  // namespace

void WeightGradQueue::run_all() {
  auto work = std::move(work_);
  work_.clear();
  for (auto& w : work) w();
}

DeferWeightGrads::DeferWeightGrads(WeightGradQueue& queue) : previous_(current_queue) {
  current_queue = &queue;
}

DeferWeightGrads::~DeferWeightGrads() { current_queue = previous_; }

at::Tensor deferred_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return DeferredLinear::apply(x, weight, bias);
}

}  // namespace trireme::pipeline
