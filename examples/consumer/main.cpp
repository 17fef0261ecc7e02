// Data-parallel training of a small regression model with an installed Trireme, made fault
// tolerant with ft::Resumable. Run it directly (one process) or on several ranks:
//   trireme run --nproc-per-node 2 --max-restarts 1 -- ./consumer [CHECKPOINT_DIR]
// Under --max-restarts a killed worker's restart continues from the agent's in-memory
// snapshot; with CHECKPOINT_DIR it also writes a checkpoint every 50 steps there, and a
// later run continues from the newest (one that finished trains nothing more).
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <cstdio>

#include "trireme/dist/world.h"
#include "trireme/ft/resume.h"
#include "trireme/launch/standby.h"
#include "trireme/parallel/data/data_parallel.h"

int main(int argc, char** argv) {
  trireme::launch::await_activation();  // before the World: needed with `trireme run --standby 1`
  trireme::dist::World world = trireme::dist::World::from_env();
  at::manual_seed(0);
  torch::nn::Linear model(4, 1);
  trireme::parallel::DataParallel dp(model.ptr(), world.group());
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0));

  // Each rank fits its own slice of y = 2*x0 - x1; the averaged gradient fits all of it.
  // (Drawn before resume(), which restores the generator as the run it continues left it.)
  const at::Tensor x = at::rand({64, 4}).add(world.rank());
  const at::Tensor y = (2 * x.select(1, 0) - x.select(1, 1)).unsqueeze(1);

  trireme::ft::ResumableOptions options;
  if (argc > 1) {
    options.checkpoint_dir = argv[1];
    options.checkpoint_every = 50;
  }
  trireme::ft::Resumable resumable(world, *model, optimizer, options);
  const int64_t steps = 200, first = resumable.resume();
  for (int64_t step = first; step < steps; ++step) {
    optimizer.zero_grad();
    (model->forward(x) - y).pow(2).mean().backward();
    optimizer.step();
    resumable.step_done(step + 1);  // snapshot (and checkpoint) when due
  }
  resumable.wait();  // the last checkpoint is written, or its failure thrown

  at::NoGradGuard no_grad;
  const double loss = (model->forward(x) - y).pow(2).mean().item<double>();
  if (world.rank() == 0)
    std::printf("consumer: rank 0 of %d, resumed at step %lld, final loss %.6f, %zu buckets\n", world.size(),
                static_cast<long long>(first), loss, dp.buckets().size());
  return loss < 0.05 ? 0 : 1;
}
