// Checkpoint boxes (ft/box.h): tensor-parallel shards as boxes and their intersections.
#include <gtest/gtest.h>

#include "trireme/common/error.h"
#include "trireme/ft/box.h"

using namespace trireme::ft;

TEST(Box, ShardBoxesFollowBlocks) {
  // A fused q/k/v weight (12, 4): 3 blocks of 4 rows, rank 1 of 2 holds rows 2-3 of each.
  const auto boxes = shard_boxes({12, 4}, 0, 3, 1, 2);
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_EQ(boxes[0], (Box{{2, 0}, {2, 4}}));
  EXPECT_EQ(boxes[1], (Box{{6, 0}, {2, 4}}));
  EXPECT_EQ(boxes[2], (Box{{10, 0}, {2, 4}}));
  // Row-parallel: split along the input dimension.
  EXPECT_EQ(shard_boxes({4, 8}, 1, 1, 0, 2), (std::vector<Box>{{{0, 0}, {4, 4}}}));
  // Replicated, or one rank: the whole tensor.
  EXPECT_EQ(shard_boxes({5}, -1, 1, 1, 2), (std::vector<Box>{whole({5})}));
  EXPECT_EQ(shard_boxes({6, 2}, 0, 1, 0, 1), (std::vector<Box>{whole({6, 2})}));
  EXPECT_THROW(shard_boxes({5, 2}, 0, 1, 0, 2), trireme::InvalidArgument);
}

TEST(Box, ShardsOfAllRanksTileTheTensor) {
  for (int ranks : {1, 2, 4}) {
    int64_t total = 0;
    std::vector<Box> all;
    for (int r = 0; r < ranks; ++r)
      for (const Box& b : shard_boxes({24, 8}, 0, 3, r, ranks)) {
        for (const Box& other : all) EXPECT_FALSE(intersect(b, other)) << describe(b) << describe(other);
        all.push_back(b);
        total += b.numel();
      }
    EXPECT_EQ(total, 24 * 8);
  }
}

TEST(Box, Intersect) {
  const Box a{{0, 0}, {4, 4}}, b{{2, 3}, {4, 4}};
  EXPECT_EQ(intersect(a, b), (Box{{2, 3}, {2, 1}}));
  EXPECT_FALSE(intersect(a, Box{{4, 0}, {1, 4}}));
  EXPECT_EQ(describe(Box{{2, 3}, {2, 1}}), "[2:4, 3:4]");
}
