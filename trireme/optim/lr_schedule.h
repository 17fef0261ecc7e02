// Learning-rate schedule: linear warm-up, then cosine decay to a floor.
//
//   lr(s) = peak * (s+1)/warmup                                  for s < warmup
//   lr(s) = floor + (peak-floor) * (1 + cos(pi * p)) / 2         p = (s-warmup)/(total-warmup)
//
// s is the 0-based step about to be taken. Pure, so it can be replayed on resume.
#pragma once

#include <cstdint>

namespace trireme::optim {

struct LrSchedule {
  double peak = 1e-3;
  double floor = 1e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  double at(int64_t step) const;
  // Throws InvalidArgument naming the flag: negative rates, warm-up longer than the run...
  void validate() const;
};

}  // namespace trireme::optim
