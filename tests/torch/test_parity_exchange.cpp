// The agents' parity exchange and rebuild (ft/parity_exchange.h), machines as threads over
// a real Gloo group: after one exchange, the snapshot bytes of any m lost machines of a
// group come back byte for byte at the rebuilder; beyond m the rebuild is refused.
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
      auto got = trireme::ft::rebuild_lost(plan, machine, losses[i], mine.data(), held, agents);
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
    EXPECT_THROW(trireme::ft::rebuild_lost(plan, machine, {0, 1}, mine.data(), held, agents), trireme::InvalidArgument);
  });
}
