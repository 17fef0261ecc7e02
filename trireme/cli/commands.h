// Entry points of the `trireme` subcommands. Each returns the process exit code and may
// throw trireme::Error; main() turns errors into one line on stderr and a non-zero exit.
#pragma once

#include <string>
#include <vector>

namespace trireme::cli {

// trireme run --nproc-per-node N [--nnodes K --node-rank R --rdzv HOST:PORT] -- PROG ARGS
int run_main(const std::vector<std::string>& args);

// trireme train gpt ...: validates flags, then launches its own ranks (re-executing this
// binary as `trireme __train-worker gpt ...`) through the launcher.
int train_main(const std::vector<std::string>& args);

// trireme schedule --schedule S --pp P --micro-batches M [--chunks V] [--out FILE.svg]
int schedule_main(const std::vector<std::string>& args);

// trireme report RUN_DIR [--step N] [--replica R]: draws RUN_DIR/pipeline.svg and prints
// the measured and theoretical pipeline bubble of a `trireme train gpt` run.
int report_main(const std::vector<std::string>& args);

// trireme checkpoint inspect DIR: verifies a checkpoint (DIR/<step>, or the newest good
// one under DIR) and prints its step, layout and tensors.
int checkpoint_main(const std::vector<std::string>& args);

// trireme store --port P: the rendezvous store on its own (for --rdzv-external jobs).
int store_main(const std::vector<std::string>& args);

// The per-rank body of `trireme train gpt`, run inside a launched worker.
int train_worker_main(const std::vector<std::string>& args);

// trireme profile gpt [model flags] --out profile.json: launches local ranks (re-executing
// this binary as `trireme __profile-worker gpt ...`) that measure layers, links and the
// device for the planner; profile_worker_main is the per-rank body.
int profile_main(const std::vector<std::string>& args);
int profile_worker_main(const std::vector<std::string>& args);

// trireme plan --profile P (--cluster C | --local N) [--global-batch B] [--out plan.json]:
// chooses the layout (or, with --evaluate, predicts a given one) and writes the plan.
int plan_main(const std::vector<std::string>& args);

// trireme simulate --plan P --cluster C --profile F [--trace T]: spot preemption replay.
int simulate_main(const std::vector<std::string>& args);

// Absolute path of the running `trireme` binary (for re-executing itself as a worker).
std::string self_executable();

// Prints a rendezvous-store retry (dist::WorldOptions::on_store_retry) as one line on
// stderr: the workers of `trireme train` and `trireme profile` pass it.
void report_store_retry(const std::string& note);

}  // namespace trireme::cli
