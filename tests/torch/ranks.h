// Several ranks as threads of one test process, over real Gloo groups on loopback that
// share an in-memory store (STYLE 9). run_ranks() rethrows the first rank's failure.
// run_threads() is the same for any per-thread work (e.g. Worlds over a real store).
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trireme/dist/backend.h"

namespace trireme::testing {

// Runs fn(rank) on `n` threads and rethrows the first one's failure once all have ended.
inline void run_threads(int n, const std::function<void(int)>& fn) {
  std::exception_ptr error;
  std::mutex mutex;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank)
    threads.emplace_back([&, rank] {
      try {
        fn(rank);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

// Runs fn(rank, group) on `world` threads, each with its own Gloo group of `world` ranks.
inline void run_ranks(int world, const std::function<void(int, const dist::Group&)>& fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  static std::atomic<int> generation{0};
  const std::string prefix = "ranks" + std::to_string(generation++);
  run_threads(world, [&](int rank) {
    dist::GroupOptions options;
    options.timeout = std::chrono::seconds(30);
    auto group =
        dist::create_gloo_group(c10::make_intrusive<c10d::PrefixStore>(prefix, store), rank, world, options);
    fn(rank, group);
    // No rank leaves (destroying its group) before all are done with theirs: a rank that
    // does no collective could otherwise tear down pairs a slower rank still connects.
    group->barrier()->wait();
  });
}

}  // namespace trireme::testing
