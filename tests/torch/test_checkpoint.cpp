// Checkpoint roots (ft/checkpoint.h): retention that cannot remove an old step warns and
// keeps the new one committed, and a root has one writer at a time (ROOT/.writer), which
// readers and retention ignore.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <ATen/ATen.h>

#include "worlds.h"
#include "trireme/common/error.h"
#include "trireme/common/file_io.h"
#include "trireme/ft/checkpoint.h"
#include "trireme/ft/checksum.h"
#include "trireme/ft/resume.h"

namespace fs = std::filesystem;
using trireme::ft::Checkpoint;
using trireme::ft::SavedPiece;

namespace {

struct TempDir {
  std::string path = "/tmp/trireme-test-checkpoint-" + std::to_string(::getpid());
  TempDir() { clear(); }
  ~TempDir() { clear(); }
  void clear() const { fs::remove_all(path); }
};

// Commits ROOT/<step>, one tensor "w" of 4 floats equal to `step`, keeping `keep`.
void commit_step(const std::string& root, int64_t step, int keep) {
  const at::Tensor w = at::full({4}, static_cast<float>(step));
  const SavedPiece piece{"w", {4}, {{0}, {4}}, w};
  const std::string dir = root + "/" + std::to_string(step);
  fs::create_directories(dir);
  const std::string_view magic = trireme::ft::shard_magic();
  const int fd = ::open((dir + "/data.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(trireme::write_all(fd, {{magic.data(), magic.size()}, {static_cast<const char*>(w.data_ptr()), 16}}), 0);
  ::close(fd);
  const trireme::ft::PlacedPiece placed{&piece, magic.size(), 16, trireme::ft::crc32(w.data_ptr(), 16)};
  trireme::ft::commit_local_checkpoint(root, step, {"dp=1", 1, 1, 1, 0, -1, "", ""}, "data.bin", {placed}, keep);
}

// A mount point is busy: rmdir of it fails with EBUSY, even for root (which passes over
// permissions). Unmounted when it goes.
struct BusyMount {
  std::string path;
  bool mounted = false;
  explicit BusyMount(const std::string& at) : path(at) {
    fs::create_directories(path);
    mounted = ::mount("trireme-test", path.c_str(), "tmpfs", 0, "size=64k") == 0;
  }
  ~BusyMount() {
    if (mounted) ::umount2(path.c_str(), MNT_DETACH);
  }
};

}  // namespace

// An old step that cannot be removed after a commit costs disk space, not the checkpoint:
// one warning, and the commit stands (before, the exception failed the background writer
// and training died at its next checkpoint).
TEST(CheckpointRetention, AStepThatCannotBeRemovedIsLeftWithAWarning) {
  TempDir tmp;
  const std::string root = tmp.path + "/root";
  commit_step(root, 1, 1);
  const BusyMount busy(root + "/1/mounted");
  if (!busy.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (no CAP_SYS_ADMIN): no removal to make fail";
  testing::internal::CaptureStderr();
  EXPECT_NO_THROW(commit_step(root, 2, 1));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("trireme: checkpoint retention could not remove " + root + "/1"), std::string::npos) << err;
  const auto latest = Checkpoint::find_latest(root, nullptr);
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->step(), 2);
  EXPECT_TRUE(at::equal(latest->read("w", {{0}, {4}}), at::full({4}, 2.0f)));
}

// A restarted job's leader whose earlier generation still holds the lock (its rank 0 on a
// lost machine, whose flock on a network file system lasts until its lease ends) goes on
// without it, saying so, instead of ending the job that is recovering; a new job is refused.
TEST(CheckpointWriterLock, ARestartedJobGoesOnWithoutALockItsEarlierGenerationHolds) {
  TempDir tmp;
  const std::string root = tmp.path + "/root";
  const trireme::ft::WriterLock earlier(root);
  EXPECT_NO_THROW(trireme::ft::WriterLock(root, std::chrono::milliseconds(100), /*restarted=*/true));
  EXPECT_THROW(trireme::ft::WriterLock(root, std::chrono::milliseconds(100)), trireme::Unrecoverable);
}

// A root that cannot be made (under a file) is a typed error naming it, not the standard
// library's filesystem_error.
TEST(CheckpointWriterLock, ARootThatCannotBeMadeIsATypedError) {
  TempDir tmp;
  fs::create_directories(tmp.path);
  const std::string file = tmp.path + "/a-file";
  std::ofstream(file) << "x";
  ASSERT_TRUE(fs::is_regular_file(file));
  try {
    trireme::ft::WriterLock lock(file + "/root");
    ADD_FAILURE() << "a root under a file was taken";
  } catch (const trireme::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create the checkpoint directory " + file + "/root"),
              std::string::npos)
        << e.what();
  }
}

// Two writers on one root: the second is refused, naming the root and the fix; once the
// first is gone, a writer takes the root again. The lock file is no step.
TEST(CheckpointWriterLock, ASecondWriterOfARootIsRefused) {
  TempDir tmp;
  const std::string root = tmp.path + "/root";
  trireme::testing::run_worlds(1, [&](trireme::dist::World& world) {
    trireme::ft::TrainingState state;
    state.world = &world;
    state.layout = {"dp=1", 1, 1, 1, 0, -1, "", ""};
    {
      const auto first = trireme::ft::checkpoint_writer(state, root, 2);
      try {
        trireme::ft::checkpoint_writer(state, root, 2);
        ADD_FAILURE() << "a second writer of " << root << " was allowed";
      } catch (const trireme::Unrecoverable& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(root), std::string::npos) << what;
        EXPECT_NE(what.find("give each job its own --checkpoint-dir"), std::string::npos) << what;
      }
    }
    EXPECT_NO_THROW(trireme::ft::checkpoint_writer(state, root, 2));
  });
  EXPECT_TRUE(fs::exists(root + "/.writer"));
  commit_step(root, 1, 1);
  commit_step(root, 2, 1);  // retention passes over the lock file
  EXPECT_TRUE(fs::exists(root + "/.writer"));
  EXPECT_EQ(trireme::ft::checkpoint_steps(root), std::vector<int64_t>{2});
  const auto latest = Checkpoint::find_latest(root, nullptr);
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->step(), 2);
}
