// Launched by tests/integration/test_resumable.py under `trireme run`: a data-parallel
// program written against the library, made fault tolerant with ft::Resumable in the
// few lines a user would write, trains a small MLP for STEPS steps and rank 0 writes the
// final parameters (raw float32, in order) to OUT. With KILL_AT > 0, rank 1 of the first
// generation SIGKILLs itself after that many steps.
//   resumable_probe STEPS KILL_AT OUT
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "trireme/dist/world.h"
#include "trireme/ft/resume.h"
#include "trireme/launch/standby.h"
#include "trireme/parallel/data/data_parallel.h"

int main(int argc, char** argv) {
  trireme::launch::await_activation();  // returns at once unless started as a standby (--standby 1)
  if (argc != 4) {
    std::fprintf(stderr, "usage: resumable_probe STEPS KILL_AT OUT\n");
    return 2;
  }
  const int64_t steps = std::atoll(argv[1]), kill_at = std::atoll(argv[2]);
  at::set_num_threads(1);
  trireme::dist::World world = trireme::dist::World::from_env();
  at::manual_seed(5);
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Functional(at::tanh), torch::nn::Linear(16, 4));
  trireme::parallel::DataParallel dp(model.ptr(), world.group());
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));

  trireme::ft::Resumable resumable(world, *model, optimizer);  // snapshots every step under --max-restarts
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  for (int64_t step = resumable.resume(); step < steps; ++step) {
    // This rank's rows of the step's batch: a function of the step alone.
    const at::Tensor x = at::arange(64, at::kFloat).reshape({8, 8}).mul(0.1 * (step + 1) + world.rank()).sin();
    model->forward(x).square().mean().backward();
    optimizer.step();
    optimizer.zero_grad();
    resumable.step_done(step + 1);
    if (kill_at > 0 && step + 1 == kill_at && world.rank() == 1 && restart && std::atoi(restart) == 0) {
      resumable.wait();  // the snapshot of this step is complete: only what follows is lost
      std::raise(SIGKILL);
    }
  }
  resumable.wait();
  if (world.rank() == 0) {
    std::ofstream out(argv[3], std::ios::binary);
    for (const auto& p : model->parameters())
      out.write(static_cast<const char*>(p.data_ptr()), static_cast<std::streamsize>(p.nbytes()));
  }
  return 0;
}
