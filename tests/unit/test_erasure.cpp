// Reed–Solomon erasure coding (ft/erasure.h): every pattern of up to m lost blocks of a
// k+m code is rebuilt byte for byte; more losses, and bad shapes, are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "trireme/common/error.h"
#include "trireme/ft/erasure.h"

using trireme::ft::ErasureCode;
using trireme::ft::Stripe;

namespace {

struct Blocks {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<uint8_t*> pointers() {
    std::vector<uint8_t*> out;
    for (auto& b : bytes) out.push_back(b.data());
    return out;
  }
};

// k random data blocks and their m parity blocks.
Blocks encoded(const ErasureCode& code, size_t length, uint32_t seed) {
  std::mt19937 random(seed);
  Blocks b;
  b.bytes.assign(static_cast<size_t>(code.k() + code.m()), std::vector<uint8_t>(length));
  std::vector<const uint8_t*> data;
  std::vector<uint8_t*> parity;
  for (int i = 0; i < code.k(); ++i) {
    for (auto& x : b.bytes[i]) x = static_cast<uint8_t>(random());
    data.push_back(b.bytes[i].data());
  }
  for (int i = code.k(); i < code.k() + code.m(); ++i) parity.push_back(b.bytes[i].data());
  code.encode(data, parity, length);
  return b;
}

// Every subset of {0..n-1} of size at most m, as a bit mask.
std::vector<std::vector<int>> loss_patterns(int n, int m) {
  std::vector<std::vector<int>> out;
  for (unsigned mask = 1; mask < (1u << n); ++mask) {
    std::vector<int> lost;
    for (int i = 0; i < n; ++i)
      if (mask & (1u << i)) lost.push_back(i);
    if (static_cast<int>(lost.size()) <= m) out.push_back(lost);
  }
  return out;
}

}  // namespace

TEST(ErasureCode, RebuildsEveryPatternOfUpToMLostBlocks) {
  for (const auto [k, m] : {std::pair{2, 1}, std::pair{3, 2}, std::pair{4, 2}, std::pair{1, 1}, std::pair{5, 3}}) {
    const ErasureCode code(k, m);
    const Blocks original = encoded(code, 1000, static_cast<uint32_t>(17 * k + m));
    int patterns = 0;
    for (const std::vector<int>& lost : loss_patterns(k + m, m)) {
      Blocks damaged = original;
      for (int i : lost) std::fill(damaged.bytes[i].begin(), damaged.bytes[i].end(), 0xEE);
      code.reconstruct(damaged.pointers(), lost, 1000);
      ASSERT_EQ(damaged.bytes, original.bytes) << k << "+" << m << ", " << lost.size() << " lost, first " << lost[0];
      ++patterns;
    }
    EXPECT_GT(patterns, 0);
  }
}

TEST(ErasureCode, OneParityBlockEqualsItsRowOfTheFullEncode) {
  const ErasureCode code(3, 2);
  const Blocks full = encoded(code, 640, 11);
  std::vector<const uint8_t*> data;
  for (int i = 0; i < code.k(); ++i) data.push_back(full.bytes[i].data());
  for (int r = 0; r < code.m(); ++r) {
    std::vector<uint8_t> one(640, 0xAA);
    code.encode_one(data, r, one.data(), 640);
    EXPECT_EQ(one, full.bytes[static_cast<size_t>(code.k() + r)]) << "parity " << r;
  }
  std::vector<uint8_t> out(640);
  EXPECT_THROW(code.encode_one(data, 2, out.data(), 640), trireme::InvalidArgument);
}

TEST(ErasureCode, ParityIsNotACopyOfTheData) {
  // 2+1 over distinct blocks: the parity is neither block (a code that only copied would
  // pass the rebuild test for k = 1 but not protect k > 1).
  const ErasureCode code(2, 1);
  const Blocks b = encoded(code, 256, 3);
  EXPECT_NE(b.bytes[2], b.bytes[0]);
  EXPECT_NE(b.bytes[2], b.bytes[1]);
}

TEST(ErasureCode, RefusesMoreLossesThanParityAndBadShapes) {
  const ErasureCode code(2, 1);
  Blocks b = encoded(code, 64, 5);
  EXPECT_THROW(code.reconstruct(b.pointers(), {0, 1}, 64), trireme::InvalidArgument);
  EXPECT_THROW(code.reconstruct(b.pointers(), {3}, 64), trireme::InvalidArgument);
  EXPECT_THROW(ErasureCode(0, 1), trireme::InvalidArgument);
  EXPECT_THROW(ErasureCode(200, 56), trireme::InvalidArgument);
  EXPECT_THROW(code.encode({b.bytes[0].data()}, {b.bytes[2].data()}, 64), trireme::InvalidArgument);
}

TEST(ErasureCode, NoParityIsAllowedAndRebuildsNothing) {
  const ErasureCode code(3, 0);
  Blocks b = encoded(code, 64, 9);
  EXPECT_NO_THROW(code.reconstruct(b.pointers(), {}, 64));
  EXPECT_THROW(code.reconstruct(b.pointers(), {1}, 64), trireme::InvalidArgument);
}

TEST(Stripe, BlocksCoverTheBytesAndStayAligned) {
  EXPECT_EQ(Stripe::of(0, 2).block, 0u);
  EXPECT_EQ(Stripe::of(1, 2).block, 64u);
  EXPECT_EQ(Stripe::of(128, 2).block, 64u);
  EXPECT_EQ(Stripe::of(129, 2).block, 128u);
  for (size_t total : {1u, 1000u, 40000003u})
    for (int k : {1, 2, 3, 7}) {
      const size_t block = Stripe::of(total, k).block;
      EXPECT_EQ(block % 64, 0u);
      EXPECT_GE(block * static_cast<size_t>(k), total);
      EXPECT_LT(block * static_cast<size_t>(k), total + 64 * static_cast<size_t>(k));
    }
  EXPECT_THROW(Stripe::of(10, 0), trireme::InvalidArgument);
}

// A block of 2 GiB and more (a machine's coded share of a large sharded model) is coded
// and rebuilt whole: ISA-L takes its length as an int, and the length cast whole wrapped
// (no parity at all at 4 GiB, none beyond 2 GiB before that) without an error. 1+1 code,
// so the test holds two blocks of 2 GiB + 4 KiB; the lost data block is rebuilt from its
// parity and checked word by word, the bytes past 2 GiB included.
TEST(ErasureCode, BlocksOfTwoGibibytesAndMoreAreCodedWhole) {
  const size_t length = (size_t{1} << 31) + 4096;
  const size_t words = length / sizeof(uint64_t);
  const auto word = [](size_t i) { return (i + 1) * 0x9E3779B97F4A7C15ull; };
  std::vector<uint64_t> data(words), parity(words, 0);
  for (size_t i = 0; i < words; ++i) data[i] = word(i);
  const ErasureCode code(1, 1);
  code.encode({reinterpret_cast<const uint8_t*>(data.data())}, {reinterpret_cast<uint8_t*>(parity.data())}, length);
  EXPECT_NE(parity[words - 1], 0u) << "no parity past 2 GiB";
  std::fill(data.begin(), data.end(), 0);
  code.reconstruct({reinterpret_cast<uint8_t*>(data.data()), reinterpret_cast<uint8_t*>(parity.data())}, {0}, length);
  size_t wrong = 0;
  for (size_t i = 0; i < words; ++i) wrong += data[i] != word(i);
  EXPECT_EQ(wrong, 0u) << "words rebuilt wrong";
}
