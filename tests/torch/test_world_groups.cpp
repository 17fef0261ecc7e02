// World's groups and store: overlapping subgroups rendezvous whichever other groups each
// member created, bad member lists are refused, and a store that goes away is a CommError.
// Ranks are threads of this process, clients of a TCPStore the test hosts.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "worlds.h"
#include "trireme/common/error.h"
#include "trireme/dist/mesh.h"
#include "trireme/dist/world.h"

namespace {

using trireme::dist::World;

void run_worlds(int size, const std::function<void(World&)>& fn) {
  trireme::testing::run_worlds(size, fn, std::chrono::seconds(20));  // a mismatch fails instead of hanging
}

// The sum over `group` of each member's rank + 1.
double sum_of_ranks(const trireme::dist::Group& group, int rank) {
  std::vector<at::Tensor> tensors{at::full({1}, rank + 1.0)};
  trireme::dist::run_collective("test all-reduce", [&] { return group->allreduce(tensors); });
  return tensors[0].item<double>();
}

}  // namespace

// A = {0,1}, then B = {1,2}: rank 1 creates both, rank 2 only B. B's name in the store
// counted rank 1's earlier groups, so ranks 1 and 2 waited under different keys.
TEST(WorldGroups, OverlappingGroupsRendezvousWhateverElseAMemberJoined) {
  run_worlds(3, [](World& world) {
    const int r = world.rank();
    if (r <= 1) EXPECT_EQ(sum_of_ranks(world.new_group({0, 1}, "pair"), r), 1 + 2);
    if (r >= 1) EXPECT_EQ(sum_of_ranks(world.new_group({1, 2}, "pair"), r), 2 + 3);
    // Two groups of the same members and tag are still told apart, in creation order.
    if (r >= 1) EXPECT_EQ(sum_of_ranks(world.new_group({1, 2}, "pair"), r), 2 + 3);
  });
}

TEST(WorldGroups, BadMemberListsAreRefused) {
  const auto server = trireme::testing::host_store();
  World world = trireme::testing::world_client(*server, 0, 1);
  const auto refused = [&](const std::vector<int>& ranks, const std::string& expect) {
    try {
      world.new_group(ranks, "t");
      ADD_FAILURE() << "accepted a bad member list";
    } catch (const trireme::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  };
  refused({0, 0}, "names rank 0 twice");
  refused({0, 1}, "rank 1 is not in this world of 1 ranks");
  refused({-1, 0}, "rank -1 is not in this world");
  refused({}, "rank 0 is not a member of group 't' []");
}

// A layout of another size than the job is refused before any group is made (every
// rank would otherwise wait for members that do not exist).
TEST(WorldGroups, AMeshOfAnotherSizeIsRefused) {
  const auto server = trireme::testing::host_store();
  World world = trireme::testing::world_client(*server, 0, 1);
  try {
    world.mesh_groups(trireme::dist::Mesh::from_sizes(2, 1, 1));
    ADD_FAILURE() << "a mesh of 2 ranks was accepted in a world of 1";
  } catch (const trireme::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("needs 2 ranks but the job has 1"), std::string::npos) << e.what();
  }
}

TEST(WorldGroups, AStoreThatIsGoneIsACommError) {
  auto server = trireme::testing::host_store();
  trireme::dist::WorldOptions options;
  options.connect_timeout = std::chrono::seconds(1);
  std::vector<std::string> notes;
  options.on_store_retry = [&](const std::string& note) { notes.push_back(note); };
  World world = trireme::testing::world_client(*server, 0, 1, options);
  world.heartbeat(1);
  server.reset();  // the only reference: the server stops
  try {
    world.heartbeat(2);
    world.set_job_value("k", "v");
    ADD_FAILURE() << "the store's loss went unnoticed";
  } catch (const trireme::CommError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("the rendezvous store failed to set"), std::string::npos) << text;
    EXPECT_EQ(text.find('\n'), std::string::npos) << text;
  }
  // The broken connection was retried, and said so through the hook (not on stderr).
  EXPECT_FALSE(notes.empty()) << "no retry was reported";
  for (const auto& note : notes) EXPECT_NE(note.find("reconnecting and retrying"), std::string::npos) << note;
}
