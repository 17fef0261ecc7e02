#include "trireme/optim/clip.h"

#include <cmath>

namespace trireme::optim {

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm,
                      const dist::Group& shard_group) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  for (const auto& p : params)
    if (p.grad().defined()) norms.push_back(p.grad().detach().to(at::kFloat).pow(2).sum());
  if (norms.empty()) return 0.0;
  at::Tensor total = at::stack(norms).sum().to(at::kDouble);
  if (shard_group) {
    std::vector<at::Tensor> buffer{total};
    shard_group->allreduce(buffer)->wait();
  }
  const double norm = std::sqrt(total.item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (const auto& p : params)
      if (p.grad().defined()) p.grad().mul_(scale);
  }
  return norm;
}

}  // namespace trireme::optim
