// Launched by tests/integration/test_resumable.py under `trireme run`: a data-parallel
// program written against the library, made fault tolerant with ft::Resumable in the
// few lines a user would write, trains a small MLP with a BatchNorm1d for STEPS steps, and
// each rank R writes its final parameters, then its buffers, raw and in order, to OUT.R:
// the BatchNorm's running mean and variance (float32) and num_batches_tracked (int64, the
// steps it ran). The running statistics are each rank's own (its rows differ, and
// DataParallel broadcasts buffers only at the start), so a resume must restore them per
// rank. With KILL_AT > 0, rank 1 of the first generation SIGKILLs itself after that many
// steps, once every rank's snapshot of that step is complete (so a restart resumes exactly
// there). Each rank says on stderr where it started: "resumable_probe: restart R: resumed
// at step N" (N 0 when it started afresh), which the test checks, since a run restarted
// from step 0 would end bitwise equal too.
//   resumable_probe STEPS KILL_AT OUT
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

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
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16), torch::nn::Functional(at::tanh),
                              torch::nn::Linear(16, 4));
  trireme::parallel::DataParallel dp(model.ptr(), world.group());
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));

  trireme::ft::Resumable resumable(world, *model, optimizer);  // snapshots every step under --max-restarts
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const int64_t first = resumable.resume();
  std::fprintf(stderr, "resumable_probe: restart %s: resumed at step %lld\n", restart ? restart : "?",
               static_cast<long long>(first));
  for (int64_t step = first; step < steps; ++step) {
    // This rank's rows of the step's batch: a function of the step alone.
    const at::Tensor x = at::arange(64, at::kFloat).reshape({8, 8}).mul(0.1 * (step + 1) + world.rank()).sin();
    model->forward(x).square().mean().backward();
    optimizer.step();
    optimizer.zero_grad();
    resumable.step_done(step + 1);
    if (kill_at > 0 && step + 1 == kill_at && restart && std::atoi(restart) == 0) {
      // Every rank's snapshot of this step is complete (each waits for its own, then they
      // meet): only what follows is lost.
      resumable.wait();
      world.gather_on_leader("probe/killed-after", std::to_string(kill_at));
      if (world.rank() == 1) std::raise(SIGKILL);
    }
  }
  resumable.wait();
  std::ofstream out(std::string(argv[3]) + "." + std::to_string(world.rank()), std::ios::binary);
  for (const auto& tensors : {model->parameters(), model->buffers()})
    for (const auto& t : tensors)
      out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  return 0;
}
