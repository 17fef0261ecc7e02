#include "trireme/optim/clip.h"

#include <cmath>

#include "trireme/common/error.h"

namespace trireme::optim {

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm,
                      const NormSharing& sharing) {
  at::NoGradGuard no_grad;
  TRIREME_CHECK(sharing.counted.empty() || sharing.counted.size() == params.size(),
                "clip_grad_norm: ", sharing.counted.size(), " counted flags for ", params.size(),
                " parameters");
  std::vector<at::Tensor> grads, norm_terms;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].grad().defined()) continue;
    grads.push_back(params[i].grad());
    if (sharing.counted.empty() || sharing.counted[i]) norm_terms.push_back(params[i].grad());
  }
  if (grads.empty() && sharing.groups.empty()) return 0.0;
  // One pass over each gradient (multi-tensor norm), then the norm of the norms.
  at::Tensor total = norm_terms.empty()
                         ? at::zeros({}, at::TensorOptions(at::kDouble).device(
                                              grads.empty() ? at::Device(at::kCPU) : grads[0].device()))
                         : at::stack(at::_foreach_norm(norm_terms, 2)).to(at::kDouble).pow(2).sum();
  for (const dist::Group& group : sharing.groups) {
    if (!group || group->getSize() == 1) continue;
    std::vector<at::Tensor> buffer{total};
    dist::run_collective("gradient-norm all-reduce", [&] { return group->allreduce(buffer); });
  }
  const double norm = std::sqrt(total.item<double>());
  if (max_norm > 0 && norm > max_norm && !grads.empty()) {
    const double scale = max_norm / (norm + 1e-6);
    at::_foreach_mul_(grads, scale);
  }
  return norm;
}

}  // namespace trireme::optim
