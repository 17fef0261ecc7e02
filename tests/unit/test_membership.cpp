// The membership rule of a restart (launch/membership.h), without processes.
#include "trireme/launch/membership.h"

#include <gtest/gtest.h>

using trireme::launch::decide_membership;
using trireme::launch::NodeState;

TEST(Membership, LostAndLeftMembersAreDroppedAndNamed) {
  const auto d = decide_membership({0, 1, 2}, {{0, NodeState::kCheckedIn}, {1, NodeState::kLeft}, {2, NodeState::kLost}},
                                   1, 3, true, 5);
  EXPECT_EQ(d.members, (std::vector<int>{0}));
  EXPECT_EQ(d.dropped, (std::vector<int>{1, 2}));
  EXPECT_EQ(d.why_dropped, "node 1 left the job; node 2 is lost (no heartbeat for 5 s)");
  EXPECT_EQ(d.failure, "");
}

TEST(Membership, JoinersFillUpToMaxLowestIdFirst) {
  // Node 1 was lost earlier; 1 and 3 ask to join a job of at most 3 with 0 and 2 in it.
  const auto d = decide_membership(
      {0, 2}, {{0, NodeState::kCheckedIn}, {1, NodeState::kJoining}, {2, NodeState::kCheckedIn}, {3, NodeState::kJoining}},
      2, 3, true, 5);
  EXPECT_EQ(d.members, (std::vector<int>{0, 1, 2}));  // sorted: ranks follow ids
  EXPECT_TRUE(d.dropped.empty());
  EXPECT_EQ(d.why_dropped, "");
}

TEST(Membership, AMemberNotHeardOfIsLost) {
  const auto d = decide_membership({0, 1}, {{0, NodeState::kCheckedIn}}, 1, 2, true, 2.5);
  EXPECT_EQ(d.members, (std::vector<int>{0}));
  EXPECT_EQ(d.why_dropped, "node 1 is lost (no heartbeat for 2.5 s)");
}

TEST(Membership, FewerThanMinEndsTheJobSayingWhy) {
  const auto elastic = decide_membership({0, 1, 2}, {{0, NodeState::kCheckedIn}}, 2, 3, true, 5);
  EXPECT_EQ(elastic.failure,
            "node 1 is lost (no heartbeat for 5 s); node 2 is lost (no heartbeat for 5 s); 1 node left, fewer "
            "than --nnodes MIN = 2");
  const auto fixed = decide_membership({0, 1}, {{0, NodeState::kCheckedIn}, {1, NodeState::kLeft}}, 2, 2, false, 5);
  EXPECT_EQ(fixed.failure,
            "node 1 left the job; 1 node left, fewer than the 2 the job needs (give --nnodes MIN:MAX to go on with "
            "fewer)");
}
