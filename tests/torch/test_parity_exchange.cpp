// The agents' parity exchange and rebuild (ft/parity_exchange.h), machines as threads over
// a real Gloo group: after one exchange, the snapshot bytes of any m lost machines of a
// group come back byte for byte at the rebuilder, also over a group of the survivors
// alone; beyond m the rebuild is refused.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <random>
#include <vector>

#include "ranks.h"
#include "trireme/common/error.h"
#include "trireme/ft/parity_exchange.h"

using trireme::ft::ParityHeld;
using trireme::ft::RedundancyPlan;

namespace {

std::vector<uint8_t> snapshot_bytes(int machine, size_t size) {
  std::mt19937 random(static_cast<uint32_t>(machine * 7919 + 1));
  std::vector<uint8_t> bytes(size);
  for (auto& b : bytes) b = static_cast<uint8_t>(random());
  return bytes;
}

// Exchanges, then rebuilds each `lost` set in turn; returns what the rebuilders returned.
void check(int machines, int k, int m, const std::vector<size_t>& sizes, const std::vector<std::vector<int>>& losses) {
  const RedundancyPlan plan = RedundancyPlan::make(machines, k, m);
  std::mutex mutex;
  std::vector<std::map<int, std::vector<uint8_t>>> rebuilt(losses.size());
  trireme::testing::run_ranks(machines, [&](int machine, const trireme::dist::Group& agents) {
    const std::vector<uint8_t> mine = snapshot_bytes(machine, sizes[static_cast<size_t>(machine)]);
    const ParityHeld held = trireme::ft::exchange_parity(plan, machine, mine.data(), mine.size(), agents);
    EXPECT_EQ(static_cast<int>(held.parity.size()), plan.group_of(machine).m);
    for (size_t i = 0; i < losses.size(); ++i) {
      auto got = trireme::ft::rebuild_lost(plan, machine, losses[i], mine.data(), held, agents,
                                           trireme::ft::machines_as_ranks(machines));
      std::lock_guard<std::mutex> lock(mutex);
      for (auto& [id, bytes] : got) rebuilt[i][id] = std::move(bytes);
    }
  });
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_EQ(rebuilt[i].size(), losses[i].size());
    for (int id : losses[i])
      EXPECT_EQ(rebuilt[i][id], snapshot_bytes(id, sizes[static_cast<size_t>(id)])) << "machine " << id << " lost";
  }
}

}  // namespace

TEST(ParityExchange, ThreeMachinesTwoPlusOneSurviveAnyOneLoss) {
  // Unequal sizes (the last block of each is padded), one much larger than a block.
  check(3, 2, 1, {100000, 77777, 150001}, {{0}, {1}, {2}});
}

TEST(ParityExchange, FiveMachinesThreePlusTwoSurviveAnyTwoLosses) {
  check(5, 3, 2, {4096, 5000, 1, 9999, 4096}, {{0, 1}, {1, 4}, {2, 3}, {4}});
}

TEST(ParityExchange, TwoGroupsRebuildIndependently) {
  check(6, 2, 1, {3000, 3000, 3000, 2000, 2000, 2000}, {{0, 4}});
}

TEST(ParityExchange, MoreLossesThanParityAreRefused) {
  const RedundancyPlan plan = RedundancyPlan::make(3, 2, 1);
  trireme::testing::run_ranks(3, [&](int machine, const trireme::dist::Group& agents) {
    const std::vector<uint8_t> mine = snapshot_bytes(machine, 1000);
    const ParityHeld held = trireme::ft::exchange_parity(plan, machine, mine.data(), mine.size(), agents);
    EXPECT_THROW(trireme::ft::rebuild_lost(plan, machine, {0, 1}, mine.data(), held, agents,
                                           trireme::ft::machines_as_ranks(3)),
                 trireme::InvalidArgument);
  });
}

TEST(ParityExchange, SurvivorsRebuildOverAGroupOfTheirOwn) {
  // One group of four machines with 3+1; machine 2 is lost and the three survivors form a
  // group of their own, in which machines 0, 1, 3 are ranks 0, 1, 2.
  const RedundancyPlan plan = RedundancyPlan::make(4, 3, 1);
  const std::vector<size_t> sizes{5000, 6001, 4999, 7003};
  std::vector<ParityHeld> held(4);
  trireme::testing::run_ranks(4, [&](int machine, const trireme::dist::Group& agents) {
    const std::vector<uint8_t> mine = snapshot_bytes(machine, sizes[static_cast<size_t>(machine)]);
    held[static_cast<size_t>(machine)] = trireme::ft::exchange_parity(plan, machine, mine.data(), mine.size(), agents);
  });
  const std::vector<int> survivors{0, 1, 3}, rank_of_machine{0, 1, -1, 2};
  std::map<int, std::vector<uint8_t>> rebuilt;
  std::mutex mutex;
  trireme::testing::run_ranks(3, [&](int rank, const trireme::dist::Group& agents) {
    const int machine = survivors[static_cast<size_t>(rank)];
    const std::vector<uint8_t> mine = snapshot_bytes(machine, sizes[static_cast<size_t>(machine)]);
    auto got = trireme::ft::rebuild_lost(plan, machine, {2}, mine.data(), held[static_cast<size_t>(machine)], agents,
                                         rank_of_machine);
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& [id, bytes] : got) rebuilt[id] = std::move(bytes);
  });
  ASSERT_EQ(rebuilt.size(), 1u);
  EXPECT_EQ(rebuilt[2], snapshot_bytes(2, sizes[2]));
}
