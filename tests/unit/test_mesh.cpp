// Golden values for the mesh rank arithmetic (dist/mesh.h).
#include <gtest/gtest.h>

#include "trireme/common/error.h"
#include "trireme/dist/mesh.h"

using trireme::dist::Mesh;
using Groups = std::vector<std::vector<int>>;

TEST(Mesh, MegatronOrderWorkedExample) {
  const Mesh mesh = Mesh::from_sizes(/*dp=*/2, /*tp=*/2, /*pp=*/2, "tp-dp-pp");
  EXPECT_EQ(mesh.world_size(), 8);
  EXPECT_EQ(mesh.groups("tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh.groups("dp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.groups("pp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.coords(6), (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(mesh.rank_of({0, 1, 1}), 6);
  EXPECT_EQ(mesh.describe(), "tp=2 x dp=2 x pp=2 (tp-dp-pp)");
}

TEST(Mesh, DataParallelInnermost) {
  // dp-tp-pp with dp=4, tp=2, pp=1: dp groups are consecutive ranks.
  const Mesh mesh = Mesh::from_sizes(4, 2, 1, "dp-tp-pp");
  EXPECT_EQ(mesh.groups("dp"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(mesh.groups("tp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.groups("pp"), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(mesh.coord(5, "dp"), 1);
  EXPECT_EQ(mesh.coord(5, "tp"), 1);
  EXPECT_EQ(mesh.group(6, "dp"), (std::vector<int>{4, 5, 6, 7}));
}

TEST(Mesh, PipelineInnermostUnevenSizes) {
  // pp-dp-tp with pp=3, dp=2, tp=1: rank = pp + 3*dp.
  const Mesh mesh = Mesh::from_sizes(2, 1, 3, "pp-dp-tp");
  EXPECT_EQ(mesh.world_size(), 6);
  EXPECT_EQ(mesh.groups("pp"), (Groups{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(mesh.groups("dp"), (Groups{{0, 3}, {1, 4}, {2, 5}}));
  for (int r = 0; r < mesh.world_size(); ++r) EXPECT_EQ(mesh.rank_of(mesh.coords(r)), r);
}

TEST(Mesh, RankOfIsInverseOfCoordsForManyShapes) {
  for (int dp : {1, 2, 3})
    for (int tp : {1, 2, 4})
      for (int pp : {1, 2, 3})
        for (const char* order : {"tp-dp-pp", "dp-tp-pp", "pp-tp-dp"}) {
          const Mesh mesh = Mesh::from_sizes(dp, tp, pp, order);
          ASSERT_EQ(mesh.world_size(), dp * tp * pp);
          for (int r = 0; r < mesh.world_size(); ++r) {
            ASSERT_EQ(mesh.rank_of(mesh.coords(r)), r);
            for (const char* axis : {"dp", "tp", "pp"}) {
              const auto g = mesh.group(r, axis);
              ASSERT_EQ(static_cast<int>(g.size()), mesh.size(axis));
              ASSERT_EQ(g[mesh.coord(r, axis)], r);  // index in group == coordinate
            }
          }
        }
}

TEST(Mesh, RejectsBadInput) {
  EXPECT_THROW(Mesh::from_sizes(2, 1, 1, "tp-dp"), trireme::InvalidArgument);
  EXPECT_THROW(Mesh::from_sizes(2, 1, 1, "tp-dp-dp"), trireme::InvalidArgument);
  EXPECT_THROW(Mesh::from_sizes(0, 1, 1), trireme::InvalidArgument);
  const Mesh mesh = Mesh::from_sizes(2, 1, 1);
  EXPECT_THROW(mesh.coords(2), trireme::InvalidArgument);
  EXPECT_THROW(mesh.size("ep"), trireme::InvalidArgument);
  // A product past int's range is refused, not wrapped (65536^2 wrapped to 0).
  EXPECT_THROW(Mesh({{"a", 65536}, {"b", 65536}}), trireme::InvalidArgument);
}

TEST(Mesh, GroupKeyNamesAreTheListUpTo64CharactersThenCountAndHash) {
  EXPECT_EQ(trireme::dist::group_key_name({0, 2, 4}), "0,2,4");
  std::vector<int> ranks;
  for (int r = 0; r < 32; ++r) ranks.push_back(r);  // "0,1,...,31": 85 characters
  const std::string long_name = trireme::dist::group_key_name(ranks);
  EXPECT_EQ(long_name.rfind("32#", 0), 0u) << long_name;
  EXPECT_EQ(long_name.size(), 3u + 16u) << long_name;
  EXPECT_EQ(long_name.find_first_not_of("0123456789abcdef", 3), std::string::npos) << long_name;
  // Another list of the same size, and the same list again, name other and the same groups.
  std::vector<int> other = ranks;
  std::swap(other[30], other[31]);
  EXPECT_NE(trireme::dist::group_key_name(other), long_name);
  EXPECT_EQ(trireme::dist::group_key_name(ranks), long_name);
  // A name never holds '/', which separates the tag in the store keys.
  ranks.resize(8192);
  for (int r = 0; r < 8192; ++r) ranks[r] = r;
  EXPECT_LE(trireme::dist::group_key_name(ranks).size(), 64u);
  EXPECT_EQ(trireme::dist::group_key_name(ranks).find('/'), std::string::npos);
}
