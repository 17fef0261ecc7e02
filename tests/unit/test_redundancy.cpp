// Placement of erasure-coded snapshot blocks across machines (ft/redundancy.h), checked
// end to end with the real codec: every machine's snapshot comes back after the loss of
// any m machines of its group, and not after m + 1.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "trireme/common/error.h"
#include "trireme/ft/erasure.h"
#include "trireme/ft/redundancy.h"

using trireme::ft::BlockRef;
using trireme::ft::ErasureCode;
using trireme::ft::RedundancyGroup;
using trireme::ft::RedundancyPlan;

namespace {

constexpr size_t kBlock = 192;
using Bytes = std::vector<uint8_t>;

// What each machine holds after a round: its own k data blocks and its parity blocks,
// keyed by (codeword, parity index).
struct Machine {
  std::vector<Bytes> data;
  std::map<std::pair<int, int>, Bytes> parity;
};

std::map<int, Machine> encode_group(const RedundancyGroup& g, uint32_t seed) {
  std::mt19937 random(seed);
  std::map<int, Machine> held;
  for (int id : g.machines) {
    held[id].data.assign(static_cast<size_t>(g.k), Bytes(kBlock));
    for (Bytes& b : held[id].data)
      for (uint8_t& x : b) x = static_cast<uint8_t>(random());
  }
  const ErasureCode code(g.k, g.m);
  for (int j = 0; j < g.size(); ++j) {
    const std::vector<BlockRef> refs = g.codeword(j);
    std::vector<const uint8_t*> data;
    for (int p = 0; p < g.k; ++p) data.push_back(held[refs[p].machine].data[refs[p].index].data());
    std::vector<Bytes> parity(static_cast<size_t>(g.m), Bytes(kBlock));
    std::vector<uint8_t*> out;
    for (Bytes& b : parity) out.push_back(b.data());
    code.encode(data, out, kBlock);
    for (int r = 0; r < g.m; ++r) held[refs[g.k + r].machine].parity[{j, r}] = parity[r];
  }
  return held;
}

// Rebuilds the data blocks of the `lost` machines from what the others hold.
std::map<int, std::vector<Bytes>> rebuild(const RedundancyGroup& g, const std::map<int, Machine>& held,
                                          const std::set<int>& lost) {
  const ErasureCode code(g.k, g.m);
  std::map<int, std::vector<Bytes>> rebuilt;
  for (int id : lost) rebuilt[id].assign(static_cast<size_t>(g.k), Bytes(kBlock));
  for (int j = 0; j < g.size(); ++j) {
    const std::vector<BlockRef> refs = g.codeword(j);
    std::vector<Bytes> blocks(refs.size(), Bytes(kBlock));
    std::vector<int> missing;
    for (size_t pos = 0; pos < refs.size(); ++pos) {
      const BlockRef& ref = refs[pos];
      if (lost.count(ref.machine)) {
        missing.push_back(static_cast<int>(pos));
        continue;
      }
      const Machine& m = held.at(ref.machine);
      blocks[pos] = ref.parity ? m.parity.at({j, ref.index}) : m.data[ref.index];
    }
    std::vector<uint8_t*> pointers;
    for (Bytes& b : blocks) pointers.push_back(b.data());
    code.reconstruct(pointers, missing, kBlock);
    for (int pos : missing)
      if (!refs[pos].parity) rebuilt[refs[pos].machine][refs[pos].index] = blocks[pos];
  }
  return rebuilt;
}

}  // namespace

TEST(RedundancyPlan, EveryLossOfUpToMMachinesInAGroupIsRebuilt) {
  for (const auto [machines, k, m] : {std::tuple{3, 2, 1}, std::tuple{5, 3, 2}, std::tuple{4, 2, 1},
                                      std::tuple{7, 2, 1}, std::tuple{6, 4, 2}}) {
    const RedundancyPlan plan = RedundancyPlan::make(machines, k, m);
    for (const RedundancyGroup& g : plan.groups) {
      const auto held = encode_group(g, static_cast<uint32_t>(machines * 31 + k));
      const int n = g.size();
      for (unsigned mask = 1; mask < (1u << n); ++mask) {
        std::set<int> lost;
        for (int i = 0; i < n; ++i)
          if (mask & (1u << i)) lost.insert(g.machines[i]);
        const std::vector<int> lost_list(lost.begin(), lost.end());
        if (static_cast<int>(lost.size()) > m) {
          EXPECT_FALSE(g.recoverable(lost_list)) << "claims to survive " << lost.size() << " losses with m=" << m;
          continue;
        }
        ASSERT_TRUE(g.recoverable(lost_list));
        const auto rebuilt = rebuild(g, held, lost);
        for (int id : lost) ASSERT_EQ(rebuilt.at(id), held.at(id).data) << "machine " << id << ", mask " << mask;
      }
    }
  }
}

TEST(RedundancyPlan, GroupsCoverTheMachinesAndKeepMParityEach) {
  const RedundancyPlan plan = RedundancyPlan::make(7, 2, 1);  // 7 machines: groups of 4 and 3
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(plan.groups[0].machines, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(plan.groups[0].k, 3);
  EXPECT_EQ(plan.groups[1].machines, (std::vector<int>{4, 5, 6}));
  EXPECT_EQ(plan.groups[1].k, 2);
  for (const auto& g : plan.groups)
    for (int id : g.machines) EXPECT_EQ(static_cast<int>(g.parity_kept_by(id).size()), g.m);
  EXPECT_EQ(&plan.group_of(5), &plan.groups[1]);
  // One loss per group is fine; two in one group is not.
  EXPECT_TRUE(plan.recoverable({1, 5}));
  EXPECT_FALSE(plan.recoverable({4, 6}));
}

TEST(RedundancyPlan, RefusesTooFewMachinesAndBadSpecs) {
  EXPECT_THROW(RedundancyPlan::make(2, 2, 1), trireme::InvalidArgument);
  EXPECT_THROW(RedundancyPlan::make(3, 0, 1), trireme::InvalidArgument);
  EXPECT_EQ(RedundancyPlan::parse("2+1"), (std::pair<int, int>{2, 1}));
  EXPECT_EQ(RedundancyPlan::parse("1+0"), (std::pair<int, int>{1, 0}));
  for (const char* bad : {"2", "2+", "+1", "2+1x", "0+1", "a+b", "2+-1"})
    EXPECT_THROW(RedundancyPlan::parse(bad), trireme::InvalidArgument) << bad;
  // A group is one code word of at most 255 machines: 300 machines at 120+1 make two
  // groups of 150, and 200+1 cannot be placed at all (before, a group of 300 was planned
  // and every round failed in the code).
  const RedundancyPlan wide = RedundancyPlan::make(300, 2, 1);
  for (const auto& g : wide.groups) EXPECT_LE(g.machines.size(), 255u);
  EXPECT_EQ(wide.groups.size(), 100u);  // (groups of 3: machines / (k + m))
  EXPECT_EQ(RedundancyPlan::make(300, 120, 1).groups.size(), 2u);
  EXPECT_THROW(RedundancyPlan::make(300, 200, 1), trireme::InvalidArgument);
  EXPECT_THROW(RedundancyPlan::make(600, 255, 1), trireme::InvalidArgument);
}
