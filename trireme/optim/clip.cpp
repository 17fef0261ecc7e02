#include "trireme/optim/clip.h"

#include <cmath>

namespace trireme::optim {

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm,
                      const dist::Group& shard_group) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return 0.0;
  // One pass over each gradient (multi-tensor norm), then the norm of the norms.
  at::Tensor total = at::stack(at::_foreach_norm(grads, 2)).to(at::kDouble).pow(2).sum();
  if (shard_group) {
    std::vector<at::Tensor> buffer{total};
    dist::run_collective("gradient-norm all-reduce", [&] { return shard_group->allreduce(buffer); });
  }
  const double norm = std::sqrt(total.item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    at::_foreach_mul_(grads, scale);
  }
  return norm;
}

}  // namespace trireme::optim
