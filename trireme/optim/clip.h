// Gradient clipping by the global L2 norm.
//
// With plain data parallelism every rank holds the same averaged gradients, so the local
// norm is the global one. When gradients are sharded (tensor/pipeline parallel, ZeRO), each
// rank holds a disjoint part: the squared norms are summed across `group` first. Pass the
// group only for sharded gradients; otherwise pass nullptr.
#pragma once

#include <vector>

#include "trireme/dist/backend.h"

namespace trireme::optim {

// Scales gradients in place so their global norm is at most max_norm (no-op when
// max_norm <= 0). Returns the norm before clipping.
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm,
                      const dist::Group& shard_group = {});

}  // namespace trireme::optim
