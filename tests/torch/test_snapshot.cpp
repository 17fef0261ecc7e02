// Snapshotter (ft/snapshot.h): three reused shared-memory slots, a crash before the commit
// leaves the two snapshots before it, and what was taken reads back exactly.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <ATen/ATen.h>

#include "trireme/common/error.h"
#include "trireme/ft/snapshot.h"

namespace fs = std::filesystem;
using trireme::ft::Checkpoint;
using trireme::ft::SavedPiece;
using trireme::ft::Snapshotter;


namespace {

struct TempDir {
  std::string path = "/dev/shm/trireme-test-snapshot-" + std::to_string(::getpid());
  TempDir() { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
};

std::vector<SavedPiece> pieces_of(const at::Tensor& weight, const at::Tensor& step) {
  return {{"w", {weight.size(0), weight.size(1)}, {{0, 0}, {weight.size(0), weight.size(1)}}, weight},
          {"step", {1}, {{0}, {1}}, step}};
}

ino_t inode(const std::string& path) {
  struct stat st{};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

}  // namespace

TEST(Snapshotter, KeepsThreeNewestAndReusesTheirFiles) {
  TempDir area;
  Snapshotter snapshots(area.path, {"dp=1", 1, 1, 1, 0, 0});
  at::Tensor weight = at::randn({64, 33});
  at::Tensor step = at::zeros({1}, at::kLong);
  std::vector<ino_t> slot_inodes;
  for (int64_t s = 1; s <= 7; ++s) {
    weight.add_(1.0);
    step.fill_(s);
    snapshots.take(s, pieces_of(weight, step));
    snapshots.wait();  // the commit
    const ino_t file = inode(area.path + "/" + std::to_string(s) + "/data.bin");
    if (s <= Snapshotter::kSlots) {
      slot_inodes.push_back(file);
    } else {
      EXPECT_EQ(file, slot_inodes[static_cast<size_t>((s - 1) % Snapshotter::kSlots)])
          << "step " << s << " did not reuse its slot";
    }
    const Checkpoint c = Checkpoint::open(area.path + "/" + std::to_string(s), /*verify_data=*/true);
    EXPECT_TRUE(at::equal(c.read("w", {{0, 0}, {64, 33}}), weight));
    EXPECT_EQ(c.read("step", {{0}, {1}}).item<int64_t>(), s);
  }
  EXPECT_TRUE(snapshots.slots_ready());
  EXPECT_EQ(Snapshotter::complete_steps(area.path), (std::vector<int64_t>{7, 6, 5}));
  EXPECT_EQ(std::distance(fs::directory_iterator(area.path), fs::directory_iterator{}), 3);
}

TEST(Snapshotter, CrashBeforeCommitLeavesTheTwoBefore) {
  TempDir area;
  Snapshotter snapshots(area.path, {"dp=1", 1, 1, 1, 0, 0},
                        [](int64_t s) { if (s == 4) TRIREME_THROW(Error, "injected crash"); });
  at::Tensor weight = at::randn({8, 8});
  at::Tensor step = at::zeros({1}, at::kLong);
  for (int64_t s = 1; s <= 3; ++s) {
    weight.add_(1.0);
    snapshots.take(s, pieces_of(weight, step));
  }
  snapshots.wait();
  const at::Tensor at_three = weight.clone();
  weight.mul_(3.0);
  snapshots.take(4, pieces_of(weight, step));
  EXPECT_THROW(snapshots.wait(), trireme::Error);
  // Step 4 reused step 1's slot: step 1 is gone, step 4 has no manifest, 3 and 2 are whole.
  EXPECT_EQ(Snapshotter::complete_steps(area.path), (std::vector<int64_t>{3, 2}));
  const Checkpoint c = Checkpoint::open(area.path + "/3", /*verify_data=*/true);
  EXPECT_TRUE(at::equal(c.read("w", {{0, 0}, {8, 8}}), at_three));
}

TEST(Snapshotter, NonContiguousPiecesAreCopiedInOrder) {
  TempDir area;
  Snapshotter snapshots(area.path, {"dp=1", 1, 1, 1, 0, 0});
  const at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6});
  const at::Tensor transposed = base.t();  // 6 x 4, not contiguous
  snapshots.take(7, {{"t", {6, 4}, {{0, 0}, {6, 4}}, transposed}});
  snapshots.wait();
  const Checkpoint c = Checkpoint::open(area.path + "/7", /*verify_data=*/true);
  EXPECT_TRUE(at::equal(c.read("t", {{0, 0}, {6, 4}}), transposed.contiguous()));
}
