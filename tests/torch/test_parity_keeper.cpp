// ParityKeeper (ft/parity_keeper.h): machines as threads of one process, each with its own
// snapshot area written by real Snapshotters, its keeper's Gloo group on loopback and a
// real TCPStore hosted here. After the keepers protect the newest step, a lost machine's
// protected copy is rebuilt byte for byte on a survivor, the slices every machine holds
// left out of the coding and filled from the survivor's own copy; the copy is the workers'
// own files, held against reuse while the workers go on; losing more than the parity
// allows is reported, not attempted; a copy torn by its slot's reuse is never committed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "trireme/ft/checkpoint.h"
#include "trireme/ft/parity_keeper.h"
#include "trireme/ft/snapshot.h"

namespace fs = std::filesystem;
using trireme::ft::Checkpoint;
using trireme::ft::ParityKeeper;
using trireme::ft::SavedPiece;
using trireme::ft::Snapshotter;
using trireme::launch::KeeperGeneration;
using trireme::launch::KeeperRecovery;

namespace {

// A rank's state at a step: a weight whose size depends on the rank (so machines' blobs
// differ in size) and whose values on the step; a replica every rank holds alike; and a
// "part" that the even ranks hold alike and the odd ranks hold alike.
at::Tensor weight_of(int rank, int64_t step) {
  return at::arange(0, 1000 * (rank + 1), at::kFloat).add_(static_cast<double>(rank * 100000 + step));
}
constexpr int64_t kReplica = 5000, kPart = 3000;  // elements
std::vector<SavedPiece> state_of(int rank, int64_t step) {
  const at::Tensor w = weight_of(rank, step);
  const at::Tensor replica = at::arange(0, kReplica, at::kFloat).mul_(static_cast<double>(step));
  const at::Tensor part = at::full({kPart}, static_cast<double>(step * 10 + rank % 2), at::kFloat);
  return {{"w", {w.size(0)}, {{0}, {w.size(0)}}, w},
          {"replica", {kReplica}, {{0}, {kReplica}}, replica},
          {"part", {kPart}, {{0}, {kPart}}, part}};
}

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

ino_t inode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

bool wait_until(const std::function<bool()>& done, std::chrono::seconds limit = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// Runs fn(i) for each i on its own thread (the machines' agents) and waits for all.
void on_machines(const std::vector<int>& which, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int i : which) threads.emplace_back([&, i] { fn(i); });
  for (auto& t : threads) t.join();
}

struct Machine {
  std::string area;
  std::vector<int> ranks;
  std::vector<std::unique_ptr<Snapshotter>> snapshots;  // one per rank
  std::unique_ptr<ParityKeeper> keeper;
};

// Machines 0..n-1 (node ids = indices) under one temporary directory, with a store.
class Cluster {
 public:
  // after_copy(node, dir): the keepers' test seam (ParityKeeper's constructor).
  Cluster(const std::vector<std::vector<int>>& ranks, int k, int m,
          const std::function<void(int, const std::string&)>& after_copy = {}, double cpu_share = 0)
      : root_("/dev/shm/trireme-test-keeper-" + std::to_string(::getpid())) {
    fs::remove_all(root_);
    c10d::TCPStoreOptions options;
    options.port = 0;
    options.isServer = true;
    options.waitWorkers = false;
    options.numWorkers = std::nullopt;
    options.timeout = std::chrono::seconds(30);
    store_ = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
    for (size_t i = 0; i < ranks.size(); ++i) {
      Machine machine;
      machine.area = root_ + "/node" + std::to_string(i);
      machine.ranks = ranks[i];
      for (int r : ranks[i])
        machine.snapshots.push_back(std::make_unique<Snapshotter>(machine.area + "/rank-" + std::to_string(r),
                                                                  trireme::ft::CheckpointLayout{"dp", 1, 1, 1, 0, r, ""}));
      std::function<void(const std::string&)> hook;
      if (after_copy) hook = [after_copy, i](const std::string& dir) { after_copy(static_cast<int>(i), dir); };
      machine.keeper = std::make_unique<ParityKeeper>(k, m, cpu_share, hook);
      machines_.push_back(std::move(machine));
    }
  }
  ~Cluster() {
    machines_.clear();
    fs::remove_all(root_);
  }

  Machine& operator[](int i) { return machines_[static_cast<size_t>(i)]; }

  // Every rank of every machine snapshots `step` (committed when this returns).
  void take(int64_t step) {
    for (Machine& machine : machines_)
      for (size_t i = 0; i < machine.ranks.size(); ++i) {
        if (!machine.snapshots[i]) continue;
        machine.snapshots[i]->take(step, state_of(machine.ranks[i], step));
        machine.snapshots[i]->wait();
      }
  }

  KeeperGeneration generation(int number, const std::vector<int>& members, int node) {
    KeeperGeneration g;
    g.generation = number;
    g.members = members;
    g.position = static_cast<int>(std::find(members.begin(), members.end(), node) - members.begin());
    g.local_ranks = (*this)[node].ranks;
    g.area = (*this)[node].area;
    g.store_host = "127.0.0.1";
    g.store_port = store_->getPort();
    return g;
  }

  void start(int number, const std::vector<int>& members) {
    for (int node : members) (*this)[node].keeper->start(generation(number, members, node));
  }

  c10d::Store& store() { return *store_; }

  bool all_protected(const std::vector<int>& nodes, int64_t step) {
    return wait_until([&] {
      for (int node : nodes)
        if ((*this)[node].keeper->protected_step() != step) return false;
      return true;
    });
  }

  // Recovery from generation 1 (every machine) to generation 2 (`next`), on the survivors
  // at once; the results by node.
  std::vector<KeeperRecovery> recover(const std::vector<int>& next) {
    std::vector<int> all;
    for (size_t i = 0; i < machines_.size(); ++i) all.push_back(static_cast<int>(i));
    std::vector<KeeperRecovery> results(machines_.size());
    on_machines(next, [&](int node) {
      results[static_cast<size_t>(node)] =
          (*this)[node].keeper->recover(generation(1, all, node), generation(2, next, node));
    });
    return results;
  }

  // A machine is lost: its workers, its keeper (with the parity in its memory) and its area.
  void lose(int node) {
    Machine& machine = (*this)[node];
    machine.keeper.reset();
    for (auto& s : machine.snapshots) s.reset();
    fs::remove_all(machine.area);
  }

 private:
  std::string root_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::vector<Machine> machines_;
};

}  // namespace

TEST(ParityKeeper, RebuildsALostMachineOnASurvivor) {
  Cluster cluster({{0, 1}, {2, 3}, {4}}, 2, 1);
  for (int64_t s = 1; s <= 4; ++s) cluster.take(s);
  cluster.start(1, {0, 1, 2});
  ASSERT_TRUE(cluster.all_protected({0, 1, 2}, 4));
  cluster.take(5);  // the next round protects the newer step and drops the older one
  ASSERT_TRUE(cluster.all_protected({0, 1, 2}, 5));
  for (int node = 0; node < 3; ++node) {
    const trireme::ft::KeeperStats stats = cluster[node].keeper->stats();
    EXPECT_GE(stats.rounds, 2) << "node " << node;
    EXPECT_GT(stats.copy_bytes, 0u);
    EXPECT_GT(stats.parity_bytes, 0u);
    // Every machine holds the replica on each of its ranks, and the even ranks' part (ranks
    // 0, 2 and 4); the odd ranks' part (ranks 1 and 3) is not on node 2, so it is coded.
    const uint64_t left_out = (node == 2 ? 1 : 2) * kReplica * 4 + kPart * 4;
    EXPECT_EQ(stats.replicated_bytes, left_out) << "node " << node;
    EXPECT_NE(cluster[node].keeper->summary().find("is on every machine of its group, so not coded"),
              std::string::npos);
    EXPECT_EQ(stats.error, "");
    EXPECT_TRUE(fs::exists(cluster[node].area + "/protected/5"));
    EXPECT_FALSE(fs::exists(cluster[node].area + "/protected/4"));
  }
  on_machines({0, 1, 2}, [&](int node) { cluster[node].keeper->stop(); });
  // The protected copy is the workers' own files, held, not copied; the workers go on
  // past it without writing them (step 8 would reuse step 5's slot).
  for (int node = 0; node < 3; ++node)
    for (int rank : cluster[node].ranks) {
      const std::string name = "/rank-" + std::to_string(rank);
      EXPECT_EQ(inode(cluster[node].area + "/protected/5" + name + "/data.bin"),
                inode(cluster[node].area + name + "/5/data.bin"))
          << "node " << node << name;
    }
  for (int64_t s = 6; s <= 8; ++s) cluster.take(s);

  std::vector<std::string> lost_files;
  for (const char* rank : {"rank-2", "rank-3"})
    for (const char* file : {"data.bin", "manifest.json"})
      lost_files.push_back(contents(cluster[1].area + "/protected/5/" + rank + "/" + file));
  cluster.lose(1);

  const std::vector<KeeperRecovery> results = cluster.recover({0, 2});
  for (int node : {0, 2}) {
    EXPECT_EQ(results[static_cast<size_t>(node)].step, 5) << results[static_cast<size_t>(node)].message;
    EXPECT_TRUE(results[static_cast<size_t>(node)].rebuilt_all) << results[static_cast<size_t>(node)].message;
  }
  EXPECT_NE(results[0].message.find("rebuilt the snapshot of step 5 of node 1 (ranks 2,3;"), std::string::npos)
      << results[0].message;
  EXPECT_NE(results[0].message.find("of it coded, the rest replicated here)"), std::string::npos)
      << results[0].message;
  EXPECT_NE(results[2].message.find("node 1 on node 0"), std::string::npos) << results[2].message;

  size_t i = 0;
  for (const char* rank : {"rank-2", "rank-3"}) {
    const std::string dir = cluster[0].area + "/protected/5/" + rank;
    for (const char* file : {"data.bin", "manifest.json"})
      EXPECT_TRUE(contents(dir + "/" + file) == lost_files[i++]) << dir << "/" << file << " differs";
    const Checkpoint rebuilt = Checkpoint::open(dir, /*verify_data=*/true);
    const int r = rank[5] - '0';
    const std::vector<SavedPiece> expected = state_of(r, 5);
    for (const SavedPiece& piece : expected)
      EXPECT_TRUE(at::equal(rebuilt.read(piece.name, piece.box), piece.data)) << rank << " " << piece.name;
  }
  EXPECT_FALSE(fs::exists(cluster[2].area + "/protected/5/rank-2"));  // one rebuilder
}

TEST(ParityKeeper, LosingMoreThanTheParityIsReported) {
  Cluster cluster({{0}, {1}, {2}}, 2, 1);
  for (int64_t s = 1; s <= 2; ++s) cluster.take(s);
  cluster.start(1, {0, 1, 2});
  ASSERT_TRUE(cluster.all_protected({0, 1, 2}, 2));
  on_machines({0, 1, 2}, [&](int node) { cluster[node].keeper->stop(); });
  cluster.lose(1);
  cluster.lose(2);

  const KeeperRecovery result = cluster.recover({0})[0];
  EXPECT_EQ(result.step, 2);
  EXPECT_FALSE(result.rebuilt_all);
  EXPECT_NE(result.message.find("lost 2 machines (node ids 1, 2) of one redundancy group; --redundancy 2+1 "
                                "tolerates 1 per group"),
            std::string::npos)
      << result.message;
  EXPECT_FALSE(fs::exists(cluster[0].area + "/protected/2/rank-1"));
}

TEST(ParityKeeper, ASnapshotReplacedWhileCopiedIsNotCommitted) {
  // While node 1's keeper copies rank 1's snapshot of step 3, the worker reuses its slot:
  // it removes the manifest, writes the slot and commits a manifest again (here: the same
  // bytes, a new file). The copy may be torn, so the round is dropped everywhere.
  Cluster cluster({{0}, {1}, {2}}, 2, 1, [](int node, const std::string& dir) {
    if (node != 1 || fs::path(dir).filename() != "3") return;
    const std::string manifest = dir + "/manifest.json";
    const std::string bytes = contents(manifest);
    fs::remove(manifest);
    std::ofstream(manifest + ".new", std::ios::binary) << bytes;
    fs::rename(manifest + ".new", manifest);
  });
  for (int64_t s = 1; s <= 3; ++s) cluster.take(s);
  cluster.start(1, {0, 1, 2});
  ASSERT_TRUE(wait_until([&] {
    for (int node = 0; node < 3; ++node)
      if (cluster[node].keeper->stats().skipped < 1) return false;
    return true;
  }));
  for (int node = 0; node < 3; ++node) {
    EXPECT_EQ(cluster[node].keeper->protected_step(), 0);
    EXPECT_FALSE(fs::exists(cluster[node].area + "/protected/3"));
    EXPECT_FALSE(fs::exists(cluster[node].area + "/protected/.tmp-3"));
  }
  cluster.take(4);  // the next step is protected
  ASSERT_TRUE(cluster.all_protected({0, 1, 2}, 4));
  for (int node = 0; node < 3; ++node) EXPECT_EQ(cluster[node].keeper->stats().skipped, 1);
  on_machines({0, 1, 2}, [&](int node) { cluster[node].keeper->stop(); });
}

TEST(ParityKeeper, ASlotAWorkerIsReusingIsNotTaken) {
  // Node 1's worker holds its slot of step 1 exclusively, as it does while it reuses the
  // slot (ft/snapshot.h, "Lent slots"): the round of step 1 is dropped everywhere, and the
  // next step is protected once the worker lets go.
  Cluster cluster({{0}, {1}, {2}}, 2, 1);
  cluster.take(1);
  const std::string path = cluster[1].area + "/rank-1/1/data.bin";
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const std::vector<int> all{0, 1, 2};
  cluster.start(1, all);
  ASSERT_TRUE(wait_until([&] {
    for (int node : all)
      if (cluster[node].keeper->stats().skipped < 1) return false;
    return true;
  }));
  for (int node : all) EXPECT_EQ(cluster[node].keeper->protected_step(), 0);
  ::close(fd);
  cluster.take(2);
  EXPECT_TRUE(cluster.all_protected(all, 2));
  on_machines(all, [&](int node) { cluster[node].keeper->stop(); });
}

TEST(ParityKeeper, TheRoundsStepIsReadOnceEveryMachineHasCome) {
  // Node 1's CPU share holds its second round back until a flush; nodes 0 and 2 come to
  // that round at step 2 and wait for it while their workers go on to step 5, and node 1's
  // slot of step 2 is reused. Their newest steps are read once node 1 has come: the round
  // protects step 5 and none is dropped.
  Cluster cluster({{0}, {1}, {2}}, 2, 1);
  cluster[1].keeper = std::make_unique<ParityKeeper>(2, 1, 1e-9);
  const std::vector<int> all{0, 1, 2};
  cluster.take(1);
  cluster.start(1, all);
  ASSERT_TRUE(cluster.all_protected(all, 1));
  cluster.take(2);
  ASSERT_TRUE(wait_until(
      [&] { return cluster.store().check({"trireme/keeper/1/arrived/1/0", "trireme/keeper/1/arrived/1/2"}); }));
  for (int64_t s = 3; s <= 5; ++s) cluster.take(s);
  EXPECT_TRUE(cluster[1].keeper->flush(60));
  ASSERT_TRUE(cluster.all_protected(all, 5));
  for (int node : all) EXPECT_EQ(cluster[node].keeper->stats().skipped, 0) << "node " << node;
  on_machines(all, [&](int node) { cluster[node].keeper->stop(); });
}

TEST(ParityKeeper, AJobShrunkBelowKPlusMMirrors) {
  // 2+1 on the two machines left after a loss: (2-1)+1, each machine's copy mirrored on
  // the other, so losing one more is still rebuilt.
  Cluster cluster({{0}, {1}}, 2, 1);
  for (int64_t s = 1; s <= 2; ++s) cluster.take(s);
  cluster.start(1, {0, 1});
  ASSERT_TRUE(cluster.all_protected({0, 1}, 2));
  on_machines({0, 1}, [&](int node) { cluster[node].keeper->stop(); });
  const std::string lost = contents(cluster[1].area + "/protected/2/rank-1/data.bin");
  cluster.lose(1);
  const KeeperRecovery result = cluster.recover({0})[0];
  EXPECT_TRUE(result.rebuilt_all) << result.message;
  EXPECT_TRUE(contents(cluster[0].area + "/protected/2/rank-1/data.bin") == lost);
}

TEST(ParityKeeper, TooFewMachinesProtectNothingAndSaySo) {
  Cluster cluster({{0}}, 2, 1);
  cluster.take(1);
  cluster.start(1, {0});
  ASSERT_TRUE(wait_until([&] { return !cluster[0].keeper->stats().error.empty(); }));
  EXPECT_NE(cluster[0].keeper->stats().error.find("--redundancy 2+1 needs more than 1 machines"), std::string::npos);
  EXPECT_EQ(cluster[0].keeper->protected_step(), 0);
}

TEST(ParityKeeper, RoundsAreSpacedByTheirCpuShare) {
  // A share so small that the round after the first waits (the keeper's CPU ms) x 1e9 ms:
  // the newer step is not protected, and stop() still returns at once.
  Cluster cluster({{0}, {1}, {2}}, 2, 1, {}, 1e-9);
  cluster.take(1);
  cluster.start(1, {0, 1, 2});
  ASSERT_TRUE(cluster.all_protected({0, 1, 2}, 1));
  cluster.take(2);
  cluster.take(3);
  // Each keeper has seen step 3 while its share held the round back (no timing assumed).
  ASSERT_TRUE(wait_until([&] {
    for (int node = 0; node < 3; ++node)
      if (cluster[node].keeper->stats().held_back_step != 3) return false;
    return true;
  }));
  for (int node = 0; node < 3; ++node) {
    EXPECT_EQ(cluster[node].keeper->protected_step(), 1);
    const trireme::ft::KeeperStats stats = cluster[node].keeper->stats();
    ASSERT_EQ(stats.round_cpu_ms.size(), 1u);
    EXPECT_GT(stats.round_cpu_ms[0], 0.0);
  }
  // A flush on one machine (a preemption notice there) lifts the share on all of them.
  EXPECT_TRUE(cluster[1].keeper->flush(60));
  EXPECT_TRUE(cluster.all_protected({0, 1, 2}, 3));
  cluster.take(4);
  EXPECT_TRUE(cluster.all_protected({0, 1, 2}, 4));  // and for the rest of the generation
  const auto start = std::chrono::steady_clock::now();
  on_machines({0, 1, 2}, [&](int node) { cluster[node].keeper->stop(); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}
