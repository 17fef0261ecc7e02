// Global gradient-norm clipping; see clip.h.
#include "trireme/optim/clip.h"

#include <cmath>

#include "trireme/common/error.h"

namespace trireme::optim {
namespace {

// Where the squared norm is summed when this rank holds no gradient to go by (a ZeRO rank
// that owns no piece): the device a NCCL group is bound to, or the current CUDA device for
// an unbound one; the CPU for Gloo. A CPU tensor would make a NCCL all-reduce fail.
at::Device norm_device(const std::vector<at::Tensor>& grads, const NormSharing& sharing) {
  if (!grads.empty()) return grads[0].device();
  for (const dist::Group& group : sharing.groups) {
    if (!group || group->getBackendName() != "nccl") continue;
    if (const auto bound = group->getBoundDeviceId()) return *bound;
    return at::Device(at::kCUDA);
  }
  return at::Device(at::kCPU);
}

}  // namespace

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
                         ? at::zeros({}, at::TensorOptions(at::kDouble).device(norm_device(grads, sharing)))
                         : at::stack(at::_foreach_norm(norm_terms, 2)).to(at::kDouble).pow(2).sum();
  for (const dist::Group& group : sharing.groups) {
    if (!group || group->getSize() == 1) continue;
    std::vector<at::Tensor> buffer{total};
    dist::run_collective("gradient-norm all-reduce", [&] { return group->allreduce(buffer); });
  }
  const double norm = std::sqrt(total.item<double>());
  // Every rank of the groups sees the same sum, so all of them throw, none waits on another.
  if (!std::isfinite(norm))
    TRIREME_THROW(Unrecoverable, "the global gradient norm is ", norm,
                  " (a gradient holds NaN or inf): training diverged and this step is not applied; "
                  "lower --lr or lengthen --warmup and resume from the last checkpoint");
  if (max_norm > 0 && norm > max_norm && !grads.empty()) {
    const double scale = max_norm / (norm + 1e-6);
    at::_foreach_mul_(grads, scale);
  }
  return norm;
}

}  // namespace trireme::optim
