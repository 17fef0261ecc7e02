// Protected snapshot blobs (ft/protected_blob.h): real one-rank snapshots written by a
// Snapshotter, serialized with some slices left out, written back with the holes filled
// from another rank's snapshot, byte for byte; a hole nothing can fill, a cut or padded
// blob and a path escaping the root are refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "trireme/common/error.h"
#include "trireme/ft/protected_blob.h"
#include "trireme/ft/snapshot.h"

namespace fs = std::filesystem;
using trireme::ft::SavedPiece;

namespace {

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Under ROOT/rank-<r>/1: a tensor of this rank's own and one every rank holds alike.
class ProtectedBlob : public ::testing::Test {
 protected:
  const std::string root_ = "/dev/shm/trireme-test-blob-" + std::to_string(::getpid());

  void SetUp() override {
    fs::remove_all(root_);
    for (int rank : {0, 1}) {
      const at::Tensor own = at::arange(0, 300, at::kFloat).add_(rank * 1000.0);
      const at::Tensor shared = at::arange(0, 2000, at::kDouble).mul_(0.5);
      trireme::ft::Snapshotter snapshots(root_ + "/rank-" + std::to_string(rank),
                                         trireme::ft::CheckpointLayout{"dp", 2, 1, 1, 0, rank, ""});
      snapshots.take(1, {{"own", {300}, {{0}, {300}}, own}, {"shared", {2000}, {{0}, {2000}}, shared}});
      snapshots.wait();
    }
  }
  void TearDown() override { fs::remove_all(root_); }

  // rank-<r>/1's files relative to ROOT/rank-<r>, as the keeper lists them.
  static std::vector<std::string> files() { return {"1/data.bin", "1/manifest.json"}; }
  std::string dir(int rank) const { return root_ + "/rank-" + std::to_string(rank); }
};

}  // namespace

TEST_F(ProtectedBlob, ReplicatedSlicesAreLeftOutAndFilledBackByteForByte) {
  const std::set<std::string> keys0 = trireme::ft::slice_keys(dir(0), files());
  const std::set<std::string> keys1 = trireme::ft::slice_keys(dir(1), files());
  ASSERT_EQ(keys0.size(), 2u);
  std::set<std::string> both;
  std::set_intersection(keys0.begin(), keys0.end(), keys1.begin(), keys1.end(), std::inserter(both, both.end()));
  ASSERT_EQ(both.size(), 1u);  // "shared" alone: "own" differs
  EXPECT_EQ(both.begin()->rfind("shared|", 0), 0u) << *both.begin();

  uint64_t holes = 0;
  const std::vector<uint8_t> whole = trireme::ft::serialize_blob(dir(0), files(), {}, &holes);
  EXPECT_EQ(holes, 0u);
  const std::vector<uint8_t> blob = trireme::ft::serialize_blob(dir(0), files(), both, &holes);
  EXPECT_EQ(holes, 2000u * 8);
  EXPECT_LT(blob.size() + holes, whole.size() + 200);  // the hole's record is small
  EXPECT_EQ(blob.size() + holes - whole.size(), 2 * sizeof(uint64_t) + sizeof(uint32_t) + both.begin()->size());

  // Rebuilt elsewhere, "shared" filled from rank 1's snapshot.
  const std::string rebuilt = root_ + "/rebuilt";
  const std::vector<std::string> tops =
      trireme::ft::write_blob(blob, rebuilt, trireme::ft::fill_from(dir(1), files()));
  EXPECT_EQ(tops, std::vector<std::string>{"1"});
  for (const std::string& file : files())
    EXPECT_TRUE(contents(rebuilt + "/" + file) == contents(dir(0) + "/" + file)) << file << " differs";
  const auto copy = trireme::ft::Checkpoint::open(rebuilt + "/1", /*verify_data=*/true);
  EXPECT_EQ(copy.step(), 1);
}

TEST_F(ProtectedBlob, AHoleNothingFillsIsRefused) {
  const std::set<std::string> keys = trireme::ft::slice_keys(dir(0), files());
  const std::vector<uint8_t> blob = trireme::ft::serialize_blob(dir(0), files(), keys);  // every slice a hole
  try {
    trireme::ft::write_blob(blob, root_ + "/rebuilt", trireme::ft::fill_from(dir(1), files()));
    FAIL() << "a hole rank 1 cannot fill was accepted";
  } catch (const trireme::CheckpointCorrupt& e) {
    EXPECT_NE(std::string(e.what()).find("no copy of the replicated slice own|"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(root_ + "/rebuilt"));  // the file it had begun is gone again
}

TEST_F(ProtectedBlob, MalformedBlobsAreRefused) {
  const std::vector<uint8_t> blob = trireme::ft::serialize_blob(dir(0), files(), {});
  const auto refused = [&](std::vector<uint8_t> bad, const std::string& why) {
    try {
      trireme::ft::write_blob(bad, root_ + "/rebuilt", trireme::ft::fill_from(dir(1), files()));
      ADD_FAILURE() << "accepted a blob that " << why;
    } catch (const trireme::CheckpointCorrupt& e) {
      SUCCEED() << e.what();
    }
    // Nothing half-written stays where a restart would look for a source.
    const std::string rebuilt = root_ + "/rebuilt";
    EXPECT_TRUE(!fs::exists(rebuilt) || fs::is_empty(rebuilt)) << "a blob that " << why << " left files behind";
  };
  refused({blob.begin(), blob.end() - 1}, "is one byte short");
  std::vector<uint8_t> padded = blob;
  padded.push_back(0);
  refused(padded, "has a byte after its last file");
  std::vector<uint8_t> magic = blob;
  magic[0] = 'X';
  refused(magic, "has no magic line");
  // The first file's path, "1/data.bin", made to escape the root: "../data.bin".
  std::vector<uint8_t> escaping = blob;
  const std::string magic_line = "TRIREME-PROTECTED 2\n";
  const size_t path_at = magic_line.size() + 2 * sizeof(uint32_t);
  ASSERT_EQ(std::string(escaping.begin() + path_at, escaping.begin() + path_at + 2), "1/");
  escaping[path_at] = '.';
  escaping.insert(escaping.begin() + path_at, '.');
  escaping[magic_line.size() + sizeof(uint32_t)] += 1;  // the path's length
  refused(escaping, "names a path outside its root");
  EXPECT_FALSE(fs::exists(root_ + "/data.bin"));
}
