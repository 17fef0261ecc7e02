// The live progress line of a training run:
//   step  42/200 | loss 2.4137 | 18.3k tok/s | 1.21 s/step | ETA 3m11s
// On a terminal it is redrawn in place ('\r'); elsewhere (logs, CI) a full line is printed
// every `every` steps and at the last step, so logs stay short.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace trireme::obs {

struct ProgressState {
  int64_t step = 0;  // 1-based, steps done
  int64_t total = 0;
  double loss = 0;
  double tokens_per_s = 0;
  double seconds_per_step = 0;
};

std::string format_progress(const ProgressState& state);
// "3m11s", "45s", "1h02m"
std::string format_duration(double seconds);
// "18.3k", "1.20M", "950"
std::string format_count(double value);

class ProgressLine {
 public:
  // live: redraw in place; otherwise print a line every `every` steps.
  ProgressLine(std::FILE* out, bool live, int64_t every) : out_(out), live_(live), every_(every) {}
  void update(const ProgressState& state);
  // Ends a live line with a newline.
  void finish();

 private:
  std::FILE* out_;
  bool live_;
  int64_t every_;
  bool drawn_ = false;
};

}  // namespace trireme::obs
