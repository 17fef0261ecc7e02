#include "trireme/cli/profile_source.h"

#include <cstdint>
#include <utility>

#include "trireme/cli/train_options.h"
#include "trireme/common/error.h"
#include "trireme/plan/cluster.h"

namespace trireme::cli {

void add_profile_flags(FlagParser& p, ProfileSource* s) {
  p.record_given(&s->given);
  p.add("profile", &s->file, "profile.json from trireme profile (or --analytic)");
  p.add("analytic", &s->analytic,
        "instead of --profile: a profile computed from the model's FLOPs at a catalog device's peak (e.g. A100)");
  p.add("utilisation", &s->utilisation, "with --analytic: achieved share of the device's peak FLOPs");
  add_model_flags(p, &s->model);  // with --analytic: the model's shape
  p.add("vocab", &s->model.vocab, "with --analytic: vocabulary size");
  p.add_switch("no-calibration", &s->no_calibration,
               "use the profile's layer times as measured, not calibrated by its measured training steps");
}

void check_profile_flags(const ProfileSource& s) {
  if (s.file.empty() || !s.analytic.empty()) return;  // (load_profile refuses both given: say that first)
  for (const char* flag : {"layers", "dim", "heads", "seq", "vocab", "utilisation"})
    TRIREME_CHECK(!s.given.count(flag), "--", flag, " applies only with --analytic; --profile ",
                  s.file, " holds the times of its own model (drop --", flag, ")");
}

plan::Profile load_profile(const ProfileSource& s) {
  TRIREME_CHECK(s.file.empty() != s.analytic.empty(),
                "give one of --profile FILE (make one with trireme profile gpt --out profile.json) and --analytic DEVICE");
  // A flag that does not apply is refused rather than ignored. Here one counts as given when
  // its value is not the default; the commands refuse one given at its default value too
  // (check_profile_flags), before they load the profile.
  const ProfileSource defaults;
  if (!s.file.empty()) {
    plan::Profile profile = plan::read_profile(s.file);
    using models::GptConfig;
    const std::pair<const char*, int64_t GptConfig::*> shape[] = {
        {"layers", &GptConfig::layers}, {"dim", &GptConfig::dim}, {"heads", &GptConfig::heads},
        {"seq", &GptConfig::seq_len}, {"vocab", &GptConfig::vocab}};
    for (const auto& [flag, field] : shape)
      TRIREME_CHECK(s.model.*field == defaults.model.*field, "--", flag, " ", s.model.*field,
                    " applies only with --analytic; the model of ", s.file, " has --", flag, " ",
                    profile.model.*field, " (drop --", flag, ", or profile the model you mean with trireme profile gpt)");
    TRIREME_CHECK(s.utilisation == defaults.utilisation,
                  "--utilisation applies only with --analytic; ", s.file,
                  " holds measured times (drop --utilisation)");
    if (!s.no_calibration) plan::calibrate(&profile, cost_options_for(profile));
    return profile;
  }
  TRIREME_CHECK(!s.no_calibration,
                "--no-calibration applies only with --profile; an --analytic profile has no measured "
                "training steps to calibrate by (drop --no-calibration)");
  s.model.validate();
  return plan::analytic_profile(s.model, s.analytic, plan::find_device(s.analytic).tflops, s.utilisation);
}

plan::CostOptions cost_options_for(const plan::Profile& profile) {
  plan::CostOptions o;
  if (profile.overlap >= 0) o.overlap = profile.overlap;
  return o;
}

}  // namespace trireme::cli
