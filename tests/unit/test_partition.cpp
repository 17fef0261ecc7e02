// Contiguous layer partitioning for pipeline stages (parallel/pipeline/partition.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "trireme/common/error.h"
#include "trireme/parallel/pipeline/partition.h"

using namespace trireme::pipeline;
using Ranges = std::vector<LayerRange>;

namespace {
double worst(const std::vector<double>& costs, const Ranges& ranges) {
  double w = 0;
  for (const auto& r : ranges)
    w = std::max(w, std::accumulate(costs.begin() + r.begin, costs.begin() + r.end, 0.0));
  return w;
}

// Exhaustive minimum of the largest part, for checking the dynamic programme.
double brute_force(const std::vector<double>& costs, int parts, int from = 0) {
  const int n = static_cast<int>(costs.size());
  if (parts == 1) return std::accumulate(costs.begin() + from, costs.end(), 0.0);
  double best = 1e300, sum = 0;
  for (int end = from + 1; end <= n - parts + 1; ++end) {
    sum += costs[end - 1];
    best = std::min(best, std::max(sum, brute_force(costs, parts - 1, end)));
  }
  return best;
}
}  // namespace

TEST(Partition, UniformCostsSplitEvenly) {
  EXPECT_EQ(balance_partition(std::vector<double>(8, 1.0), 4), (Ranges{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(balance_partition(std::vector<double>(3, 1.0), 3), (Ranges{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(balance_partition(std::vector<double>(5, 1.0), 1), (Ranges{{0, 5}}));
}

TEST(Partition, HeavyLayersGetTheirOwnPart) {
  // An embedding-like heavy first layer and a heavy head.
  const std::vector<double> costs = {6, 1, 1, 1, 1, 1, 1, 5};
  const Ranges ranges = balance_partition(costs, 3);
  EXPECT_EQ(ranges.front(), (LayerRange{0, 1}));  // the heavy first layer alone
  EXPECT_DOUBLE_EQ(worst(costs, ranges), 6.0);     // optimal: no part costs more than it
  // Ties are broken deterministically: the last part starts at the earliest optimal cut.
  EXPECT_EQ(ranges, (Ranges{{0, 1}, {1, 6}, {6, 8}}));
}

TEST(Partition, OptimalAgainstBruteForce) {
  for (int n = 1; n <= 9; ++n)
    for (int parts = 1; parts <= n; ++parts) {
      std::vector<double> costs;
      for (int i = 0; i < n; ++i) costs.push_back(1 + (i * 7 + n * 3) % 5);
      const Ranges ranges = balance_partition(costs, parts);
      ASSERT_EQ(static_cast<int>(ranges.size()), parts);
      ASSERT_EQ(ranges.front().begin, 0);
      ASSERT_EQ(ranges.back().end, n);
      for (size_t k = 0; k < ranges.size(); ++k) {
        ASSERT_LT(ranges[k].begin, ranges[k].end);
        if (k) ASSERT_EQ(ranges[k].begin, ranges[k - 1].end);
      }
      EXPECT_DOUBLE_EQ(worst(costs, ranges), brute_force(costs, parts)) << "n=" << n << " parts=" << parts;
    }
}

TEST(Partition, RefusesMorePartsThanLayers) {
  try {
    balance_partition(std::vector<double>(3, 1.0), 4);
    FAIL();
  } catch (const trireme::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot split 3 layers into 4"), std::string::npos);
  }
  EXPECT_THROW(balance_partition({1, -1}, 1), trireme::InvalidArgument);
}

TEST(Partition, ParsesAndChecksExplicitSplit) {
  EXPECT_EQ(parse_split("0:3,3:6,6:8", 8, 3), (Ranges{{0, 3}, {3, 6}, {6, 8}}));
  EXPECT_EQ(format_split({{0, 3}, {3, 6}, {6, 8}}), "0:3,3:6,6:8");
  EXPECT_THROW(parse_split("0:3,4:8", 8, 2), trireme::InvalidArgument);   // gap
  EXPECT_THROW(parse_split("0:4,3:8", 8, 2), trireme::InvalidArgument);   // overlap
  EXPECT_THROW(parse_split("0:4,4:7", 8, 2), trireme::InvalidArgument);   // short
  EXPECT_THROW(parse_split("0:4,4:8", 8, 3), trireme::InvalidArgument);   // count
  EXPECT_THROW(parse_split("0:4,4:8,", 8, 2), trireme::InvalidArgument);  // a trailing comma (was accepted)
  EXPECT_THROW(parse_split("0-4,4:8", 8, 2), trireme::InvalidArgument);   // syntax
  EXPECT_THROW(parse_split("0:4,4:4,4:8", 8, 3), trireme::InvalidArgument);  // empty part
  // Out of int's range: not cut down to a number that passes (4294967298 wrapped to 2).
  EXPECT_THROW(parse_split("0:4294967298,2:8", 8, 2), trireme::InvalidArgument);
  EXPECT_THROW(parse_split("0:-1,-1:8", 8, 2), trireme::InvalidArgument);
}

TEST(Partition, SplitNumbersAreDigitsOnly) {
  // strtol alone took leading spaces, a sign and "-0": each number must start with a digit.
  EXPECT_THROW(parse_split(" 0:4,4:8", 8, 2), trireme::InvalidArgument);
  EXPECT_THROW(parse_split("0:4, 4:8", 8, 2), trireme::InvalidArgument);
  EXPECT_THROW(parse_split("0: 4,4:8", 8, 2), trireme::InvalidArgument);
  EXPECT_THROW(parse_split("0:+4,+4:8", 8, 2), trireme::InvalidArgument);
  EXPECT_THROW(parse_split("-0:4,4:8", 8, 2), trireme::InvalidArgument);
  EXPECT_THROW(parse_split("0:4,4:8 ", 8, 2), trireme::InvalidArgument);
  try {
    parse_split("0:4,+4:8", 8, 2);
    FAIL() << "'+4' accepted";
  } catch (const trireme::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'+4:8' is not BEGIN:END"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_split("00:4,4:08", 8, 2), (Ranges{{0, 4}, {4, 8}}));
}
