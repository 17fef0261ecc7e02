// Run by bench/parity_exchange: the cost of erasure-coded snapshot redundancy with the
// machines as threads of one process over a real Gloo group on loopback (ft/parity_exchange.h).
//   parity_bench MACHINES K M MIB ROUNDS
// Prints one JSON line: median seconds of encode alone (one machine's parity work), of a
// whole exchange round, and of rebuilding one lost machine, and the bytes each machine
// sends per round and keeps as parity.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "../torch/ranks.h"
#include "trireme/ft/erasure.h"
#include "trireme/ft/parity_exchange.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: parity_bench MACHINES K M MIB ROUNDS\n");
    return 2;
  }
  const int machines = std::atoi(argv[1]), k = std::atoi(argv[2]), m = std::atoi(argv[3]);
  const size_t bytes = static_cast<size_t>(std::atof(argv[4]) * (1 << 20));
  const int rounds = std::atoi(argv[5]);
  at::set_num_threads(1);
  const trireme::ft::RedundancyPlan plan = trireme::ft::RedundancyPlan::make(machines, k, m);
  const trireme::ft::RedundancyGroup& group = plan.groups.front();

  // Encode alone: what one machine computes per round, one parity block (from k data
  // blocks) for each of the m it keeps.
  const size_t block = trireme::ft::Stripe::of(bytes, group.k).block;
  std::vector<std::vector<uint8_t>> data(static_cast<size_t>(group.k), std::vector<uint8_t>(block, 7));
  std::vector<uint8_t> parity(block);
  std::vector<const uint8_t*> in;
  for (auto& d : data) in.push_back(d.data());
  const trireme::ft::ErasureCode code(group.k, group.m);
  std::vector<double> encode_s;
  for (int round = 0; round < rounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < group.m; ++r) code.encode_one(in, r, parity.data(), block);
    encode_s.push_back(seconds_since(start));
  }

  std::mutex mutex;
  std::vector<double> exchange_s, rebuild_s;
  trireme::testing::run_ranks(machines, [&](int machine, const trireme::dist::Group& agents) {
    std::vector<uint8_t> mine(bytes, static_cast<uint8_t>(machine));
    for (int r = 0; r < rounds; ++r) {
      agents->barrier()->wait();
      auto start = std::chrono::steady_clock::now();
      const auto held = trireme::ft::exchange_parity(plan, machine, mine.data(), mine.size(), agents);
      agents->barrier()->wait();
      const double exchanged = seconds_since(start);
      start = std::chrono::steady_clock::now();
      trireme::ft::rebuild_lost(plan, machine, {group.machines.back()}, mine.data(), held, agents,
                                trireme::ft::machines_as_ranks(machines));
      agents->barrier()->wait();
      const double rebuilt = seconds_since(start);
      if (machine == 0) {
        std::lock_guard<std::mutex> lock(mutex);
        exchange_s.push_back(exchanged);
        rebuild_s.push_back(rebuilt);
      }
    }
  });
  std::printf(
      "{\"machines\": %d, \"k\": %d, \"m\": %d, \"snapshot_bytes\": %zu, \"block_bytes\": %zu, "
      "\"encode_s\": %.6f, \"exchange_s\": %.6f, \"rebuild_one_s\": %.6f, \"sent_bytes\": %zu, "
      "\"parity_bytes\": %zu}\n",
      machines, group.k, group.m, bytes, block, median(encode_s), median(exchange_s), median(rebuild_s),
      block * static_cast<size_t>(group.k * group.m), block * static_cast<size_t>(group.m));
  return 0;
}
