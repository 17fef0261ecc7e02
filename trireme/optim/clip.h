// Gradient clipping by the global L2 norm.
//
// With plain data parallelism every rank holds the same averaged gradients, so the local
// norm is the global one. When the model is split (tensor or pipeline parallel, ZeRO),
// each rank holds part of it: the squared norms are summed across the groups that split
// it (NormSharing::groups, e.g. the tensor-parallel then the pipeline group). A parameter
// replicated inside such a group (a LayerNorm under tensor parallelism) must be counted
// once: `counted` is false for it on every rank but one.
#pragma once

#include <vector>

#include "trireme/dist/backend.h"

namespace trireme::optim {

struct NormSharing {
  std::vector<dist::Group> groups;  // the squared norm is summed across each, in turn
  std::vector<bool> counted;        // per parameter; empty: every parameter counts
};

// Scales gradients in place so their global norm is at most max_norm (no-op when
// max_norm <= 0). Returns the norm before clipping. Throws Unrecoverable, whatever
// max_norm, when that norm is NaN or infinite, before touching any gradient: the step must
// not reach the optimizer, whose state (and every later snapshot) it would fill with NaN,
// and a restart would replay the same step.
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm,
                      const NormSharing& sharing = {});

}  // namespace trireme::optim
