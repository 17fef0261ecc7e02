// Where `trireme plan` and `trireme simulate` get a model's costs: a measured profile file
// (`--profile profile.json` from `trireme profile`) or, for models too big to run here, a
// profile computed from the model's FLOPs at a catalog device's peak (`--analytic A100
// --utilisation 0.5 --layers 24 --dim 2048 ...`).
#pragma once

#include <set>
#include <string>

#include "trireme/cli/flags.h"
#include "trireme/plan/cost_model.h"
#include "trireme/plan/profile.h"

namespace trireme::cli {

struct ProfileSource {
  std::string file;
  std::string analytic;  // a device of the catalog
  double utilisation = 0.5;
  models::GptConfig model;
  bool no_calibration = false;  // keep the layers' times as profiled (see plan::calibrate)
  std::set<std::string> given;  // the flags given (FlagParser::record_given)
};

void add_profile_flags(FlagParser& parser, ProfileSource* source);
// Throws InvalidArgument when a model flag or --utilisation was given (at its default value
// too: source.given) with --profile, whose file holds the times of its own model. Called by
// the commands before their other checks; load_profile() sees values only.
void check_profile_flags(const ProfileSource& source);
// Throws InvalidArgument unless exactly one of --profile and --analytic is given, and when
// a flag of the other one is: the model flags and --utilisation with --profile,
// --no-calibration with --analytic (a flag counts as given when it is not at its default).
// A measured profile with training-step rows comes back calibrated (plan::calibrate)
// unless --no-calibration.
plan::Profile load_profile(const ProfileSource& source);

// The cost model's options for a profile: the overlap of communication with compute the
// profile measured (on CPU the Gloo thread shares the core), else full overlap (separate
// engines on accelerators).
plan::CostOptions cost_options_for(const plan::Profile& profile);

}  // namespace trireme::cli
