#include "trireme/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "trireme/common/error.h"

namespace trireme::optim {

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return peak * static_cast<double>(step + 1) / warmup_steps;
  const int64_t decay = std::max<int64_t>(1, total_steps - warmup_steps);
  const double p = std::min(1.0, static_cast<double>(step - warmup_steps) / decay);
  return floor + (peak - floor) * 0.5 * (1.0 + std::cos(M_PI * p));
}

void LrSchedule::validate() const {
  TRIREME_CHECK(peak > 0, "--lr must be positive, got ", peak);
  TRIREME_CHECK(floor >= 0 && floor <= peak, "--min-lr ", floor, " is outside [0, --lr ", peak,
                "] (its default is 3e-4); give --min-lr at most --lr");
  TRIREME_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps, "--warmup ", warmup_steps,
                " must be between 0 and --steps ", total_steps);
}

}  // namespace trireme::optim
