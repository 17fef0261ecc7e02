// Interval arithmetic shared by the timing statistics (communication busy time, pipeline
// busy time). Pure, header-only.
#pragma once

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

namespace trireme {

// Total length of the union of [start, end) intervals: overlaps count once.
inline double union_length(std::vector<std::pair<double, double>> spans) {
  std::sort(spans.begin(), spans.end());
  double total = 0, covered_to = -std::numeric_limits<double>::infinity();
  for (const auto& [start, end] : spans) {
    const double from = std::max(start, covered_to);
    if (end > from) total += end - from;
    covered_to = std::max(covered_to, end);
  }
  return total;
}

}  // namespace trireme
