// A linear layer whose backward can leave its weight gradient for later: the split of
// backward into B (input gradient, needed now by the previous stage) and W (weight
// gradient, needed only by the optimizer) that zero-bubble schedules (zb-h1) move into
// pipeline bubbles.
//
// deferred_linear(x, weight, bias) computes x W^T + b like at::linear. Its backward always
// returns the input gradient. Outside a DeferWeightGrads scope it also returns the weight
// and bias gradients (an ordinary linear layer). Inside one, it returns none for them and
// instead appends to the scope's queue the work that computes them from the saved input
// and output gradient, accumulating into weight.grad() and bias.grad() when the queue runs
// (the W instruction). Other parameters (LayerNorm, embeddings) keep their gradients in B.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace trireme::pipeline {

class WeightGradQueue {
 public:
  // `work` accumulates into the gradients of `params`.
  void push(std::function<void()> work, std::vector<at::Tensor> params);
  // Runs and clears the queued work, in the order it was queued; calls on_accumulated (if
  // given) once for every parameter whose gradient the work accumulated into, after the
  // last item that touched it (a weight used twice is one contribution, complete then).
  void run_all(const std::function<void(const at::Tensor&)>& on_accumulated = {});
  size_t size() const { return work_.size(); }

 private:
  struct Item {
    std::function<void()> work;
    std::vector<at::Tensor> params;
  };
  std::vector<Item> work_;
};

// While alive, deferred_linear backward passes on this thread queue their weight gradients
// into `queue`. Scopes nest; the innermost wins. (CPU autograd runs backward on the calling
// thread, which is what makes a thread-local scope the right seam.)
class DeferWeightGrads {
 public:
  explicit DeferWeightGrads(WeightGradQueue& queue);
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;

 private:
  WeightGradQueue* previous_;
};

// x (..., in), weight (out, in), bias (out) or undefined -> (..., out)
at::Tensor deferred_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace trireme::pipeline
