// `trireme plan --measure-top K`: the cost model ranks the layouts, then K of them are run
// on this machine with `trireme train gpt --plan` and the fastest measured is chosen: the
// model's choice, the best of each other dp x tp x pp shape, then the next families in the
// model's order (cli/plan.cpp, choose_by_trials). For clusters whose ranks
// all live here (`--local N`, or groups of device "cpu" emulated on this machine's ranks);
// a cluster of real accelerators elsewhere cannot be measured from here.
//
// Each trial is a real run of `steps` steps in its own process tree; candidates are run in
// `rounds` rounds, each round in a rotated order so that a drift of this machine's speed
// during the trials does not fall on one candidate; a candidate's measured step is the
// median of its steps over all rounds, the first two steps of each run (start-up) dropped.
#pragma once

#include <string>
#include <vector>

#include "trireme/plan/plan.h"
#include "trireme/plan/search.h"

namespace trireme::cli {

struct TrialOptions {
  int candidates = 0;  // K; 0: no trials
  int steps = 10;
  int rounds = 2;
  std::string dir;  // the trial runs go here; "" means a temporary directory, removed after
};

struct TrialResult {
  plan::Candidate candidate;
  std::vector<double> step_s;  // every measured step of every round
  std::vector<double> round_s;  // the median step of each round that ran
  double measured_step_s = 0;  // their median; 0 when every run of it failed
  std::string error;           // the last failure, if any
};

// Throws InvalidArgument when a group of the cluster is not emulated on this machine.
void check_measurable(const plan::Cluster& cluster);

// Runs each candidate's plan `rounds` times for `steps` steps (progress on stdout) and
// returns them in the order given, measured. Throws Error when no candidate ran.
std::vector<TrialResult> measure_candidates(const std::vector<plan::Candidate>& candidates,
                                            const plan::Profile& profile, const plan::Cluster& cluster,
                                            const TrialOptions& options);

}  // namespace trireme::cli
