// BatchSampler: deterministic, resumable, independent of the number of ranks.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "trireme/common/error.h"
#include "trireme/data/sampler.h"

using trireme::InvalidArgument;
using trireme::data::BatchSampler;

TEST(SamplerTest, SameArgumentsGiveSameOffsets) {
  BatchSampler a(10000, 64, 8, 7), b(10000, 64, 8, 7);
  for (int64_t step : {0, 1, 5, 1000000}) EXPECT_EQ(a.global_offsets(step), b.global_offsets(step));
}

// The offsets themselves are pinned: a checkpoint written by one version of Trireme
// resumes on the same data order in the next (comparing the sampler with itself would
// not notice a change to its mixing or its range mapping).
TEST(SamplerTest, OffsetsArePinnedAcrossVersions) {
  BatchSampler s(10000, 64, 8, 7);
  EXPECT_EQ(s.global_offsets(0), (std::vector<uint64_t>{6054, 9571, 2907, 994, 9813, 696, 5534, 5177}));
  EXPECT_EQ(s.global_offsets(1000000), (std::vector<uint64_t>{5680, 3567, 6561, 826, 745, 7105, 2135, 2553}));
}

TEST(SamplerTest, SeedChangesOffsets) {
  BatchSampler a(10000, 64, 8, 7), b(10000, 64, 8, 8);
  EXPECT_NE(a.global_offsets(0), b.global_offsets(0));
}

TEST(SamplerTest, DifferentStepsDiffer) {
  BatchSampler s(1000000, 128, 16, 1);
  std::set<std::vector<uint64_t>> seen;
  for (int64_t step = 0; step < 100; ++step) seen.insert(s.global_offsets(step));
  EXPECT_EQ(seen.size(), 100u);
}

TEST(SamplerTest, OffsetsStayInRange) {
  // corpus 130, seq 128: valid starts are 0 and 1 only.
  BatchSampler tiny(130, 128, 64, 3);
  std::set<uint64_t> starts;
  for (int64_t step = 0; step < 10; ++step)
    for (uint64_t o : tiny.global_offsets(step)) starts.insert(o);
  EXPECT_EQ(starts, (std::set<uint64_t>{0, 1}));

  BatchSampler exact(129, 128, 4, 3);  // exactly one window
  for (uint64_t o : exact.global_offsets(9)) EXPECT_EQ(o, 0u);

  BatchSampler big(5000, 100, 32, 11);
  for (int64_t step = 0; step < 200; ++step)
    for (uint64_t o : big.global_offsets(step)) EXPECT_LE(o, 5000u - 100u - 1u);
}

TEST(SamplerTest, OffsetsCoverTheCorpus) {
  BatchSampler s(1000, 10, 100, 5);
  std::set<uint64_t> starts;
  for (int64_t step = 0; step < 200; ++step)
    for (uint64_t o : s.global_offsets(step)) starts.insert(o);
  EXPECT_EQ(starts.size(), 990u);  // every valid start shows up in 20,000 draws
}

TEST(SamplerTest, ShardsConcatenateToGlobalBatchForEveryWorldSize) {
  BatchSampler s(100000, 32, 24, 42);
  for (int64_t step : {0, 3, 77}) {
    const auto global = s.global_offsets(step);
    for (int64_t world : {1, 2, 3, 4, 6, 8, 12, 24}) {
      std::vector<uint64_t> joined;
      for (int64_t rank = 0; rank < world; ++rank) {
        const auto part = s.shard(step, rank, world);
        EXPECT_EQ(part.size(), static_cast<size_t>(24 / world));
        joined.insert(joined.end(), part.begin(), part.end());
      }
      EXPECT_EQ(joined, global) << "world " << world << " step " << step;
    }
  }
}

TEST(SamplerTest, UnequalReplicaSlicesConcatenateToGlobalBatch) {
  BatchSampler s(100000, 32, 16, 7);
  const auto global = s.global_offsets(5);
  std::vector<uint64_t> joined;
  int64_t begin = 0;
  for (int64_t count : {12, 3, 1}) {
    const auto part = s.slice(5, begin, count);
    EXPECT_EQ(part.size(), static_cast<size_t>(count));
    joined.insert(joined.end(), part.begin(), part.end());
    begin += count;
  }
  EXPECT_EQ(joined, global);
  EXPECT_THROW(s.slice(5, 12, 5), InvalidArgument);  // past the end
  EXPECT_THROW(s.slice(5, 0, 0), InvalidArgument);
  EXPECT_THROW(s.slice(5, -1, 2), InvalidArgument);
  EXPECT_THROW(s.slice(5, 1, std::numeric_limits<int64_t>::max()), InvalidArgument);  // begin + count overflowed
}

TEST(SamplerTest, ResumeAtAnyStepMatchesUninterruptedRun) {
  BatchSampler first(50000, 16, 4, 9);
  std::vector<std::vector<uint64_t>> run;
  for (int64_t step = 0; step < 20; ++step) run.push_back(first.global_offsets(step));
  BatchSampler resumed(50000, 16, 4, 9);  // a fresh object, as after a restart
  for (int64_t step = 12; step < 20; ++step) EXPECT_EQ(resumed.global_offsets(step), run[step]);
}

TEST(SamplerTest, BatchNotDivisibleByWorldIsRejected) {
  BatchSampler s(10000, 8, 6, 0);
  try {
    s.shard(0, 0, 4);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "--batch 6 is not divisible by 4 data-parallel ranks; choose a multiple of 4");
  }
}

TEST(SamplerTest, BadArgumentsAreRejected) {
  EXPECT_THROW(BatchSampler(128, 128, 4, 0), InvalidArgument);  // no room for the target
  EXPECT_THROW(BatchSampler(1000, 0, 4, 0), InvalidArgument);
  EXPECT_THROW(BatchSampler(1000, 8, 0, 0), InvalidArgument);
  BatchSampler s(1000, 8, 4, 0);
  EXPECT_THROW(s.global_offsets(-1), InvalidArgument);
  EXPECT_THROW(s.shard(0, 2, 2), InvalidArgument);
  EXPECT_THROW(s.shard(0, -1, 2), InvalidArgument);
  EXPECT_THROW(s.shard(0, 0, 0), InvalidArgument);
}
