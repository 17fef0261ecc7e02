// ZeRO sharding arithmetic (comm/shard.h): chunks, owned pieces and the ring's steps,
// checked against closed forms and by simulating every rank of the ring together.
#include <gtest/gtest.h>

#include <numeric>

#include "trireme/comm/shard.h"
#include "trireme/common/error.h"

using namespace trireme::comm;

TEST(Shard, ChunkLengthRoundsUp) {
  EXPECT_EQ(chunk_length(10, 4), 3);
  EXPECT_EQ(chunk_length(12, 4), 3);
  EXPECT_EQ(chunk_length(0, 4), 0);
  EXPECT_EQ(chunk_length(7, 1), 7);
  EXPECT_THROW(chunk_length(5, 0), trireme::InvalidArgument);
}

TEST(Shard, SplitByChunksCutsAtBoundaries) {
  // Elements 2..8 with chunks of 3: [2] in chunk 0, [3,4,5] in 1, [6,7,8] in 2.
  const auto s = split_by_chunks(2, 7, 3);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].chunk, 0);
  EXPECT_EQ(s[0].chunk_offset, 2);
  EXPECT_EQ(s[0].length, 1);
  EXPECT_EQ(s[1].offset, 1);
  EXPECT_EQ(s[1].chunk, 1);
  EXPECT_EQ(s[1].length, 3);
  EXPECT_EQ(s[2].offset, 4);
  EXPECT_EQ(s[2].chunk, 2);
  EXPECT_EQ(s[2].chunk_offset, 0);
  EXPECT_TRUE(split_by_chunks(5, 0, 3).empty());
}

// Every element of every parameter is owned by exactly one rank, at the place the chunk
// arithmetic says, and each rank owns at most one chunk's worth.
TEST(Shard, OwnedPiecesCoverEveryElementOnce) {
  const std::vector<std::vector<int64_t>> buckets = {{5, 1, 7, 3}, {1}, {4, 4}, {0, 9, 0}, {2, 3}};
  for (const auto& numels : buckets)
    for (int d : {1, 2, 3, 4, 7}) {
      const int64_t total = std::accumulate(numels.begin(), numels.end(), int64_t{0});
      const int64_t chunk = chunk_length(total, d);
      std::vector<std::vector<int>> owner(numels.size());
      for (size_t k = 0; k < numels.size(); ++k) owner[k].assign(numels[k], -1);
      for (int r = 0; r < d; ++r) {
        int64_t owned = 0, next_chunk_offset = 0;
        std::vector<int64_t> offsets{0};
        for (int64_t n : numels) offsets.push_back(offsets.back() + n);
        for (const ShardPiece& p : owned_pieces(numels, d, r)) {
          EXPECT_EQ(p.chunk_offset, next_chunk_offset) << "pieces are contiguous in the chunk";
          EXPECT_EQ(offsets[p.param] + p.param_offset, r * chunk + p.chunk_offset);
          for (int64_t e = 0; e < p.length; ++e) {
            EXPECT_EQ(owner[p.param][p.param_offset + e], -1);
            owner[p.param][p.param_offset + e] = r;
          }
          owned += p.length;
          next_chunk_offset += p.length;
        }
        EXPECT_LE(owned, chunk);
      }
      for (const auto& o : owner)
        for (int r : o) EXPECT_GE(r, 0);
    }
}

// All ranks of the ring run step by step together on integers: each ends with the sum of
// its own chunk, sends what it received the step before, and sends d - 1 chunks.
TEST(Shard, RingReduceScatterSimulated) {
  for (int d = 1; d <= 6; ++d) {
    // data[r][c]: rank r's value of chunk c, initially 100 r + c.
    std::vector<std::vector<long>> data(d, std::vector<long>(d));
    for (int r = 0; r < d; ++r)
      for (int c = 0; c < d; ++c) data[r][c] = 100L * r + c;
    std::vector<std::vector<RingStep>> plan(d);
    for (int r = 0; r < d; ++r) {
      plan[r] = ring_reduce_scatter_steps(d, r);
      ASSERT_EQ(plan[r].size(), static_cast<size_t>(d - 1));
    }
    for (int s = 0; s + 1 < d; ++s) {
      std::vector<std::vector<long>> sent(d, std::vector<long>(d, 0));
      for (int r = 0; r < d; ++r) {
        const RingStep& step = plan[r][s];
        if (s > 0) EXPECT_EQ(step.send_chunk, plan[r][s - 1].recv_chunk);
        // The receiver expects exactly this chunk from this sender.
        const RingStep& peer = plan[step.to][s];
        EXPECT_EQ(peer.from, r);
        EXPECT_EQ(peer.recv_chunk, step.send_chunk);
        sent[step.to][step.send_chunk] = data[r][step.send_chunk];
      }
      for (int r = 0; r < d; ++r) data[r][plan[r][s].recv_chunk] += sent[r][plan[r][s].recv_chunk];
    }
    for (int r = 0; r < d; ++r) {
      long expected = 0;
      for (int q = 0; q < d; ++q) expected += 100L * q + r;
      EXPECT_EQ(data[r][r], expected) << "d=" << d << " rank " << r;
    }
  }
}
