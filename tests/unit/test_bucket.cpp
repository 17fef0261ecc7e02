// Bucket assignment (comm/bucket.h) as a pure function.
#include <gtest/gtest.h>

#include "trireme/comm/bucket.h"
#include "trireme/common/error.h"

using namespace trireme::comm;
using Buckets = std::vector<std::vector<size_t>>;

namespace {
std::vector<BucketParam> sized(std::vector<size_t> bytes, int64_t key = 0) {
  std::vector<BucketParam> out;
  for (size_t b : bytes) out.push_back({b, key});
  return out;
}
}  // namespace

TEST(Bucket, ReverseOrderFillsToCap) {
  BucketOptions opt{/*cap=*/100, /*first_cap=*/100};
  const auto params = sized({40, 40, 40, 40, 40});
  EXPECT_EQ(assign_buckets(params, reverse_order(5), opt), (Buckets{{4, 3, 2}, {1, 0}}));
}

TEST(Bucket, FirstBucketIsSmaller) {
  BucketOptions opt{/*cap=*/100, /*first_cap=*/30};
  const auto params = sized({20, 20, 20, 20, 20, 20});
  EXPECT_EQ(assign_buckets(params, reverse_order(6), opt), (Buckets{{5, 4}, {3, 2, 1, 0}}));
}

TEST(Bucket, OversizedParameterClosesItsBucket) {
  BucketOptions opt{100, 100};
  const auto params = sized({10, 500, 10});
  EXPECT_EQ(assign_buckets(params, {0, 1, 2}, opt), (Buckets{{0, 1}, {2}}));
  EXPECT_EQ(assign_buckets(params, {1, 0, 2}, opt), (Buckets{{1}, {0, 2}}));
}

TEST(Bucket, ExactFitClosesBucket) {
  BucketOptions opt{100, 100};
  EXPECT_EQ(assign_buckets(sized({50, 50, 50}), {0, 1, 2}, opt), (Buckets{{0, 1}, {2}}));
}

TEST(Bucket, ObservedOrderIsFollowed) {
  BucketOptions opt{100, 100};
  const auto params = sized({60, 60, 30, 30});
  EXPECT_EQ(assign_buckets(params, {2, 0, 3, 1}, opt), (Buckets{{2, 0, 3}, {1}}));
}

TEST(Bucket, KeysNeverMix) {
  BucketOptions opt{100, 100};
  std::vector<BucketParam> params = {{30, 0}, {30, 1}, {30, 0}, {30, 1}, {50, 0}};
  // key 0: 0,2,4 reach 110 >= 100 and close; key 1 stays open with 1,3.
  EXPECT_EQ(assign_buckets(params, {0, 1, 2, 3, 4}, opt), (Buckets{{0, 2, 4}, {1, 3}}));
}

TEST(Bucket, EveryParameterExactlyOnceAcrossSweep) {
  for (size_t n : {0, 1, 7, 64}) {
    for (size_t cap : {1, 16, 1000}) {
      std::vector<BucketParam> params;
      for (size_t i = 0; i < n; ++i) params.push_back({(i * 37) % 23 + 1, int64_t(i % 3)});
      const auto buckets = assign_buckets(params, reverse_order(n), {cap, cap / 2 + 1});
      std::vector<int> count(n, 0);
      for (const auto& b : buckets) {
        ASSERT_FALSE(b.empty());
        for (size_t i : b) {
          ++count[i];
          ASSERT_EQ(params[i].key, params[b.front()].key);
        }
      }
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(count[i], 1) << "n=" << n << " cap=" << cap;
    }
  }
}

TEST(Bucket, RejectsNonPermutation) {
  const auto params = sized({1, 1, 1});
  EXPECT_THROW(assign_buckets(params, {0, 0, 1}), trireme::InvalidArgument);
  EXPECT_THROW(assign_buckets(params, {0, 1}), trireme::InvalidArgument);
  EXPECT_THROW(assign_buckets(params, {0, 1, 5}), trireme::InvalidArgument);
}
