// Data-parallel training of a small regression model with an installed Trireme.
// Run it directly (one process) or on several ranks:
//   trireme run --nproc-per-node 2 -- ./consumer
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdio>

#include "trireme/dist/world.h"
#include "trireme/parallel/data/data_parallel.h"

int main() {
  trireme::dist::World world = trireme::dist::World::from_env();
  at::manual_seed(0);
  torch::nn::Linear model(4, 1);
  trireme::parallel::DataParallel dp(model.ptr(), world.group());
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));

  // Each rank fits its own slice of y = 2*x0 - x1; the averaged gradient fits all of it.
  const at::Tensor x = at::rand({64, 4}).add(world.rank());
  const at::Tensor y = (2 * x.select(1, 0) - x.select(1, 1)).unsqueeze(1);
  double loss = 0;
  for (int step = 0; step < 200; ++step) {
    optimizer.zero_grad();
    at::Tensor l = (model->forward(x) - y).pow(2).mean();
    l.backward();
    optimizer.step();
    loss = l.item<double>();
  }
  if (world.rank() == 0)
    std::printf("consumer: rank 0 of %d, final loss %.6f, %zu buckets\n", world.size(), loss,
                dp.buckets().size());
  return loss < 0.05 ? 0 : 1;
}
