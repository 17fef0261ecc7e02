#include "trireme/obs/progress.h"

#include <cmath>

namespace trireme::obs {

std::string format_duration(double seconds) {
  // (Beyond a million years the count would not fit: llround is undefined past 2^63.)
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 3.2e13) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else
    std::snprintf(buf, sizeof(buf), "%llds", (long long)s);
  return buf;
}

std::string format_count(double value) {
  char buf[32];
  // Each unit from where the smaller one would print rounded up to 1000 (999.96k is 1.00M).
  if (value >= 999950)
    std::snprintf(buf, sizeof(buf), "%.2fM", value / 1e6);
  else if (value >= 999.5)
    std::snprintf(buf, sizeof(buf), "%.1fk", value / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f", value);
  return buf;
}

std::string format_progress(const ProgressState& state) {
  const int width = static_cast<int>(std::to_string(state.total).size());
  const double eta = state.seconds_per_step * static_cast<double>(state.total - state.step);
  char buf[160];
  std::snprintf(buf, sizeof(buf), "step %*lld/%lld | loss %.4f | %s tok/s | %.2f s/step | ETA %s",
                width, (long long)state.step, (long long)state.total, state.loss,
                format_count(state.tokens_per_s).c_str(), state.seconds_per_step,
                format_duration(eta).c_str());
  return buf;
}

void ProgressLine::update(const ProgressState& state) {
  const std::string line = format_progress(state);
  if (live_) {
    // Line first, then '\r': the launcher forwards a segment when it sees its terminator,
    // so ending with '\r' shows this update now rather than with the next one.
    std::fprintf(out_, "%s\033[K\r", line.c_str());
    drawn_ = true;
  } else if (state.step == 1 || state.step == state.total || (every_ > 0 && state.step % every_ == 0)) {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressLine::finish() {
  if (live_ && drawn_) std::fputc('\n', out_);
  drawn_ = false;
  std::fflush(out_);
}

}  // namespace trireme::obs
