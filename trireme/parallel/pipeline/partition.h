// Splitting a model's ordered layer list into contiguous parts, one per virtual pipeline
// stage (p stages x v chunks). Pure.
//
//   balance_partition   minimises the cost of the most expensive part (the pipeline's
//                       critical stage) given a cost per layer: measured time from a
//                       profile, or parameter count when there is none
//   parse_split         the explicit override --pp-split 0:3,3:6,...: half-open layer
//                       ranges that must cover every layer once, in order
#pragma once

#include <string>
#include <vector>

namespace trireme::pipeline {

struct LayerRange {
  int begin = 0;  // first layer
  int end = 0;    // one past the last layer
  bool operator==(const LayerRange& o) const { return begin == o.begin && end == o.end; }
};

// `parts` contiguous, non-empty ranges covering costs.size() layers, minimising the
// largest sum of costs. Among optimal splits the choice is deterministic: each part's
// start is the earliest cut that keeps the parts before it optimal.
// Throws InvalidArgument when there are fewer layers than parts or a cost is negative.
std::vector<LayerRange> balance_partition(const std::vector<double>& costs, int parts);

// Parses "0:3,3:6,6:8" for a model of `layers` layers split into `parts` parts. Throws
// InvalidArgument naming the problem (gap, overlap, wrong count, out of range, syntax).
std::vector<LayerRange> parse_split(const std::string& text, int layers, int parts);

// "0:3,3:6,6:8"
std::string format_split(const std::vector<LayerRange>& ranges);

}  // namespace trireme::pipeline
