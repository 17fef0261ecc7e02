// Snapshotter (ft/snapshot.h): three reused shared-memory slots (more while the agent holds
// some, which are not written), a crash before the commit leaves the two snapshots before
// it, and what was taken reads back exactly. And what ft/resume.h saves and restores
// through them and through checkpoints: module buffers, non-contiguous parameters through
// a shared snapshot's broadcast, and Resumable's checks of its inputs and steps.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include "ranks.h"
#include "worlds.h"
#include "trireme/common/error.h"
#include "trireme/dist/world.h"
#include "trireme/ft/resume.h"
#include "trireme/ft/snapshot.h"
#include "trireme/parallel/data/zero.h"

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

// Snapshots of one changing tensor "w" into `area`, as a rank takes them, and holds on
// their data files as the node keeper takes them (a shared flock: ft/snapshot.h, "Lent
// slots"), let go at the end.
struct LentSlots {
  explicit LentSlots(const std::string& area) : area(area), snapshots(area, {"dp=1", 1, 1, 1, 0, 0}) {}
  ~LentSlots() {
    for (int fd : held) ::close(fd);
  }
  void take(int64_t s) {
    weight.add_(1.0);
    step.fill_(s);
    taken.push_back(weight.clone());
    snapshots.take(s, pieces_of(weight, step));
    snapshots.wait();
  }
  void hold(int64_t s) {
    const std::string path = area + "/" + std::to_string(s) + "/data.bin";
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0) << path;
    ASSERT_EQ(::flock(fd, LOCK_SH | LOCK_NB), 0);
    held.push_back(fd);
  }
  void let_go() {
    for (int fd : held) ::close(fd);
    held.clear();
  }
  // Whether step s's snapshot is complete, verifies, and holds what take(s) saw.
  bool intact(int64_t s) const {
    const Checkpoint c = Checkpoint::open(area + "/" + std::to_string(s), /*verify_data=*/true);
    return at::equal(c.read("w", {{0, 0}, {64, 33}}), taken[static_cast<size_t>(s - 1)]);
  }

  std::string area;
  Snapshotter snapshots;
  at::Tensor weight = at::randn({64, 33});
  at::Tensor step = at::zeros({1}, at::kLong);
  std::vector<at::Tensor> taken;  // by step - 1
  std::vector<int> held;
};

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

TEST(Snapshotter, ASlotTheAgentHoldsIsNotReused) {
  // The keeper holds a snapshot by a shared flock on its data file: later snapshots go to
  // other slots, a new one where none is free, and the held one stays whole until it is
  // let go. Five slots at most: past that the one before the newest serves, and when that
  // is held too the snapshot is skipped, not the job.
  TempDir area;
  LentSlots slots(area.path);
  for (int64_t s = 1; s <= 3; ++s) slots.take(s);
  const ino_t first = inode(area.path + "/1/data.bin");
  slots.hold(1);
  slots.take(4);  // slot of step 1 held: a fourth slot
  EXPECT_NE(inode(area.path + "/4/data.bin"), first);
  EXPECT_TRUE(slots.intact(1));
  slots.take(5);  // the slot of step 2 is free
  EXPECT_TRUE(slots.intact(1));
  EXPECT_EQ(Snapshotter::complete_steps(area.path), (std::vector<int64_t>{5, 4, 3, 1}));
  slots.hold(3);
  slots.hold(4);
  slots.take(6);  // step 2's old slot (now 5) and the newest two are in use: a fifth
  EXPECT_TRUE(slots.intact(1));
  EXPECT_TRUE(slots.intact(3));
  slots.hold(5);
  slots.take(7);  // held: 1, 3, 4, 5 (5, the one before the newest, too); no sixth: skipped
  slots.taken.pop_back();
  EXPECT_FALSE(fs::exists(area.path + "/7"));
  EXPECT_EQ(Snapshotter::complete_steps(area.path), (std::vector<int64_t>{6, 5, 4, 3, 1}));
  EXPECT_TRUE(slots.intact(1));
  slots.let_go();
  slots.take(7);  // let go: the oldest slot (step 1's) serves again, no new one
  EXPECT_EQ(inode(area.path + "/7/data.bin"), first);
  EXPECT_TRUE(slots.intact(7));
  EXPECT_FALSE(fs::exists(area.path + "/1"));
}

// With five slots and every one but the newest two held, the slot of the snapshot before
// the newest serves (the newest complete one stays), rather than this snapshot and every
// later one being skipped, which held the keeper's step for good.
TEST(Snapshotter, WithNoSlotLeftTheOneBeforeTheNewestServes) {
  TempDir area;
  LentSlots slots(area.path);
  for (int64_t s = 1; s <= 3; ++s) slots.take(s);
  slots.hold(1);
  slots.take(4);  // a fourth slot
  slots.hold(2);
  slots.take(5);  // a fifth
  slots.hold(3);
  const ino_t fourth = inode(area.path + "/4/data.bin");
  slots.take(6);  // held: 1, 2, 3; no sixth: step 4's slot serves, step 5 stays
  EXPECT_EQ(Snapshotter::complete_steps(area.path), (std::vector<int64_t>{6, 5, 3, 2, 1}));
  EXPECT_EQ(inode(area.path + "/6/data.bin"), fourth);
  EXPECT_TRUE(slots.intact(6));
  EXPECT_TRUE(slots.intact(5));
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
    snapshots.before_update();
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

// Entries that are not a step's checkpoint are skipped, not thrown up: a directory whose
// name is a number too large for a step, and a manifest whose fields have the wrong type
// (before, std::out_of_range and a plain Error escaped find_latest and complete_steps, and
// --resume or a restart ended instead of taking the good step below them).
TEST(Snapshotter, MalformedEntriesAreSkipped) {
  TempDir area;
  Snapshotter snapshots(area.path, {"dp=1", 1, 1, 1, 0, 0});
  at::Tensor weight = at::randn({4, 4});
  at::Tensor step = at::zeros({1}, at::kLong);
  for (int64_t s = 1; s <= 2; ++s) snapshots.take(s, pieces_of(weight, step));
  snapshots.wait();
  fs::create_directories(area.path + "/99999999999999999999");  // beyond int64
  fs::copy(area.path + "/2", area.path + "/3");
  std::string manifest;
  {
    std::ifstream in(area.path + "/3/manifest.json");
    manifest.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t step_field = manifest.find("\"step\": 2,");  // the copy is step 3's
  ASSERT_NE(step_field, std::string::npos) << manifest;
  manifest.replace(step_field, 10, "\"step\": 3,");
  const size_t shape = manifest.find("\"shape\":");
  ASSERT_NE(shape, std::string::npos) << manifest;
  manifest.replace(shape, manifest.find(']', shape) + 1 - shape, "\"shape\":\"x\"");
  std::ofstream(area.path + "/3/manifest.json") << manifest;
  EXPECT_EQ(Snapshotter::complete_steps(area.path), (std::vector<int64_t>{2, 1}));
  std::vector<std::string> skipped;
  const auto latest = Checkpoint::find_latest(area.path, &skipped);
  ASSERT_TRUE(latest) << (skipped.empty() ? "" : skipped[0] + (skipped.size() > 1 ? " | " + skipped[1] : ""));
  EXPECT_EQ(latest->step(), 2);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("field shape is not a list of integers"), std::string::npos) << skipped[0];
}

// take() leaves the copy of host state to the writer thread; before_update() finishes it
// (taking what the thread has not begun), so the state may change as soon as it returns.
TEST(Snapshotter, TheStateMayChangeOnceBeforeUpdateReturns) {
  TempDir area;
  // On one CPU (the writer thread inherits it), the idle-priority thread runs only when
  // this one blocks: a before_update() that did not finish the copy would let it race.
  cpu_set_t all, one;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(all), &all), 0);
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &all)) {
      CPU_SET(cpu, &one);
      break;
    }
  ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);
  struct Restore {
    cpu_set_t set;
    ~Restore() { ::sched_setaffinity(0, sizeof(set), &set); }
  } restore{all};
  Snapshotter snapshots(area.path, {"dp=1", 1, 1, 1, 0, 0});
  std::vector<at::Tensor> weights;
  for (int i = 0; i < 64; ++i) weights.push_back(at::randn({256, 64}));
  const at::Tensor step = at::zeros({1}, at::kLong);
  for (int64_t s = 1; s <= 4; ++s) {
    std::vector<SavedPiece> pieces;
    for (size_t i = 0; i < weights.size(); ++i)
      pieces.push_back({"w" + std::to_string(i), {256, 64}, {{0, 0}, {256, 64}}, weights[i]});
    std::vector<at::Tensor> before;
    for (const at::Tensor& w : weights) before.push_back(w.clone());
    snapshots.take(s, pieces);
    snapshots.before_update();
    for (at::Tensor& w : weights) w.add_(1000.0);  // the next optimizer step
    snapshots.wait();
    const Checkpoint c = Checkpoint::open(area.path + "/" + std::to_string(s), /*verify_data=*/true);
    for (size_t i = 0; i < weights.size(); ++i)
      ASSERT_TRUE(at::equal(c.read("w" + std::to_string(i), {{0, 0}, {256, 64}}), before[i]))
          << "step " << s << ": piece " << i << " was copied after before_update() returned";
  }
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

// Restoring reads a slice straight into the destination tensor, copying and checksumming in
// one pass (or only copying, when open() verified the data); a flipped byte is still caught,
// and other dtypes and boxes take the general path.
TEST(Snapshotter, ReadIntoFillsTheTensorInPlaceAndChecksTheCrc) {
  TempDir area;
  Snapshotter snapshots(area.path, {"dp=1", 1, 1, 1, 0, 0});
  const at::Tensor weight = at::randn({64, 33});
  snapshots.take(3, pieces_of(weight, at::full({1}, 3, at::kLong)));
  snapshots.wait();
  const std::string dir = area.path + "/3";
  {
    const Checkpoint c = Checkpoint::open(dir, /*verify_data=*/false);
    at::Tensor into = at::zeros({64, 33});
    const void* storage = into.data_ptr();
    c.read_into("w", {{0, 0}, {64, 33}}, into);
    EXPECT_TRUE(at::equal(into, weight));
    EXPECT_EQ(into.data_ptr(), storage);
    at::Tensor wider = at::zeros({64, 33}, at::kDouble);
    c.read_into("w", {{0, 0}, {64, 33}}, wider);
    EXPECT_TRUE(at::equal(wider, weight.to(at::kDouble)));
    at::Tensor part = at::zeros({10, 5});
    c.read_into("w", {{3, 7}, {10, 5}}, part);
    EXPECT_TRUE(at::equal(part, weight.narrow(0, 3, 10).narrow(1, 7, 5)));
    EXPECT_THROW(c.read_into("w", {{0, 0}, {64, 33}}, at::zeros({33, 64})), trireme::InvalidArgument);
    // Opened with verification, the reads copy without checking again, on both paths.
    const Checkpoint verified = Checkpoint::open(dir, /*verify_data=*/true);
    at::Tensor whole_copy = at::zeros({64, 33});
    verified.read_into("w", {{0, 0}, {64, 33}}, whole_copy);
    EXPECT_TRUE(at::equal(whole_copy, weight));
    EXPECT_TRUE(at::equal(verified.read("w", {{3, 7}, {10, 5}}), weight.narrow(0, 3, 10).narrow(1, 7, 5)));
  }
  uint64_t offset = 0;
  for (const auto& slice : Checkpoint::open(dir, /*verify_data=*/false).slices())
    if (slice.tensor == "w") offset = slice.offset + slice.bytes / 2;
  ASSERT_GT(offset, 0u);
  {
    const int fd = ::open((dir + "/data.bin").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    unsigned char byte = 0;
    ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(offset)), 1);
    byte ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(offset)), 1);
    ::close(fd);
  }
  EXPECT_THROW(Checkpoint::open(dir, /*verify_data=*/true), trireme::CheckpointCorrupt);
  const Checkpoint damaged = Checkpoint::open(dir, /*verify_data=*/false);
  at::Tensor into = at::zeros({64, 33});
  try {
    damaged.read_into("w", {{0, 0}, {64, 33}}, into);
    FAIL() << "a flipped byte was read without complaint";
  } catch (const trireme::CheckpointCorrupt& e) {
    EXPECT_NE(std::string(e.what()).find("CRC-32 mismatch"), std::string::npos) << e.what();
  }
  EXPECT_THROW(damaged.read_into("w", {{0, 0}, {64, 33}}, at::zeros({64, 33}, at::kDouble)),
               trireme::CheckpointCorrupt);
}

namespace {

using trireme::dist::World;
using trireme::ft::Resumable;
using trireme::ft::ResumableOptions;

using trireme::testing::run_worlds;

World one_rank() { return World::connect(trireme::dist::WorldInfo{}); }

// A small model with buffers that every training step changes (a BatchNorm's running
// statistics and its num_batches_tracked, an int64 scalar).
torch::nn::Sequential model_with_buffers() {
  return torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6));
}

void train_step(torch::nn::Sequential& model, torch::optim::AdamW& optimizer, int64_t step) {
  model->forward(at::arange(32, at::kFloat).reshape({8, 4}).mul(0.1 * (step + 1)).sin()).square().mean().backward();
  optimizer.step();
  optimizer.zero_grad();
}

}  // namespace

// A checkpoint holds the module's buffers, and resume() restores them bit for bit (before,
// only parameters were saved: the running statistics restarted from their initial values).
TEST(Resumable, BuffersRoundTripThroughACheckpoint) {
  TempDir area;
  World world = one_rank();
  const ResumableOptions options{area.path + "/ckpt", /*checkpoint_every=*/1};
  at::manual_seed(1);
  torch::nn::Sequential trained = model_with_buffers();
  torch::optim::AdamW optimizer(trained->parameters(), torch::optim::AdamWOptions(1e-2));
  {
    Resumable resumable(world, *trained, optimizer, options);
    ASSERT_EQ(resumable.resume(), 0);
    for (int64_t step = 0; step < 3; ++step) {
      train_step(trained, optimizer, step);
      resumable.step_done(step + 1);
    }
    resumable.wait();
  }
  at::manual_seed(2);
  torch::nn::Sequential restored = model_with_buffers();
  torch::optim::AdamW fresh(restored->parameters(), torch::optim::AdamWOptions(1e-2));
  Resumable resumable(world, *restored, fresh, options);
  ASSERT_EQ(resumable.resume(), 3);
  const auto want = trained->named_buffers(), got = restored->named_buffers();
  ASSERT_EQ(want.size(), 3u);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].key(), want[i].key());
    EXPECT_TRUE(at::equal(got[i].value(), want[i].value())) << want[i].key();
  }
  EXPECT_EQ(restored->named_buffers()["1.num_batches_tracked"].item<int64_t>(), 3);
  const auto params = trained->parameters(), loaded = restored->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(at::equal(params[i], loaded[i]));
}

// step_done() takes only a step after the last one done or resumed at: a step taken again
// would have the Snapshotter rewrite the complete snapshot that holds it.
TEST(Resumable, StepDoneRefusesAStepNotAfterTheLast) {
  TempDir area;
  World world = one_rank();
  const ResumableOptions options{area.path + "/ckpt", /*checkpoint_every=*/2};
  at::manual_seed(1);
  torch::nn::Sequential model = model_with_buffers();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  {
    Resumable resumable(world, *model, optimizer, options);
    ASSERT_EQ(resumable.resume(), 0);
    EXPECT_THROW(resumable.step_done(0), trireme::InvalidArgument);
    resumable.step_done(1);
    resumable.step_done(2);
    try {
      resumable.step_done(2);
      FAIL() << "step 2 was taken twice";
    } catch (const trireme::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("step_done(2) after step 2"), std::string::npos) << e.what();
    }
    EXPECT_THROW(resumable.step_done(1), trireme::InvalidArgument);
    resumable.wait();
  }
  Resumable resumed(world, *model, optimizer, options);
  ASSERT_EQ(resumed.resume(), 2);
  EXPECT_THROW(resumed.step_done(2), trireme::InvalidArgument);
  resumed.step_done(3);
  resumed.wait();
}

// What Resumable cannot save, or options that make no sense, are refused by its
// constructor with InvalidArgument naming them (before, AMSGrad failed inside libtorch at
// the first step after a resume, an fp16 parameter in the background writer, and
// checkpoint_every without a directory wrote nothing, silently).
TEST(Resumable, ConstructorChecksItsInputs) {
  World world = one_rank();
  const auto refused = [&](torch::nn::Module& model, torch::optim::AdamW& optimizer, const ResumableOptions& options,
                           const std::string& naming) {
    try {
      Resumable resumable(world, model, optimizer, options);
      ADD_FAILURE() << "not refused: " << naming;
    } catch (const trireme::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(naming), std::string::npos) << e.what();
    }
  };
  torch::nn::Sequential model = model_with_buffers();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  refused(*model, optimizer, {"/tmp/unused", 1, /*keep_checkpoints=*/0}, "keep_checkpoints");
  refused(*model, optimizer, {"", /*checkpoint_every=*/5}, "checkpoint_dir is empty");
  refused(*model, optimizer, {"/tmp/unused", /*checkpoint_every=*/-1}, "checkpoint_every");
  refused(*model, optimizer, {"", 0, 3, /*snapshot_every=*/-2}, "snapshot_every");
  torch::optim::AdamW amsgrad(model->parameters(), torch::optim::AdamWOptions(1e-2).amsgrad(true));
  refused(*model, amsgrad, {}, "amsgrad");
  torch::nn::Linear half(4, 2);
  half->to(at::kHalf);
  torch::optim::AdamW half_optimizer(half->parameters(), torch::optim::AdamWOptions(1e-2));
  refused(*half, half_optimizer, {}, "parameter 'weight' is Half");
  torch::nn::Linear masked(4, 2);
  masked->register_buffer("mask", at::ones({2}, at::kBool));
  torch::optim::AdamW masked_optimizer(masked->parameters(), torch::optim::AdamWOptions(1e-2));
  refused(*masked, masked_optimizer, {}, "buffer 'mask' is Bool");
  torch::nn::Sequential empty;  // (a module with nothing to save: no device to agree on either)
  refused(*empty, optimizer, {}, "the model has no parameters");
  Resumable fine(world, *model, optimizer, {});  // the defaults are fine
}

// ZeRO refuses AMSGrad too: its max_exp_avg_sq is neither gathered nor saved.
TEST(ZeroOptimizer, RefusesAmsgrad) {
  trireme::testing::run_ranks(1, [](int, const trireme::dist::Group& group) {
    torch::nn::Linear net(4, 2);
    trireme::parallel::DataParallelOptions options;
    options.rebuild_buckets = false;
    trireme::parallel::DataParallel dp(net.ptr(), group, options);
    try {
      trireme::parallel::ZeroOptimizer zero(dp, 1, torch::optim::AdamWOptions(1e-2).amsgrad(true));
      ADD_FAILURE() << "ZeRO took amsgrad";
    } catch (const trireme::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("amsgrad"), std::string::npos) << e.what();
    }
  });
}

// A snapshot holds the buffers as they were when it was taken, although the next forward
// pass (a BatchNorm's running statistics) changes them before before_update(), which only
// the next optimizer step calls: they are copied at once, not by the background thread
// (before, a change that came first was saved with the old step's parameters, and passed
// its checksums).
TEST(LoadSnapshot, BuffersAreThoseOfTheStepSnapshotted) {
  TempDir area;
  World world = one_rank();
  const at::Tensor big = at::randn({1 << 20}).requires_grad_(true);  // keeps the copy thread busy
  const at::Tensor running = at::arange(1 << 16, at::kFloat);
  torch::optim::AdamW optimizer(std::vector<at::Tensor>{big}, torch::optim::AdamWOptions(1e-2));
  trireme::ft::TrainingState state;
  state.world = &world;
  state.parameters = {{"big", big}};
  state.buffers = {{"running", running}};
  state.adamw = &optimizer;
  state.layout = {"dp=1", 1, 1, 1, 0, -1, ""};
  trireme::ft::CheckpointLayout own = state.layout;
  own.rank = 0;
  const std::string dir = area.path + "/rank-0";
  const at::Tensor want = running.clone();
  {
    Snapshotter snapshots(dir, own);
    trireme::ft::take_snapshot(state, snapshots, 1);
    running.add_(1);  // the next forward pass
    snapshots.before_update();
    snapshots.wait();
  }
  running.fill_(-1);
  ASSERT_EQ(trireme::ft::load_snapshot(state, dir), 1);
  EXPECT_TRUE(at::equal(running, want)) << "max diff " << (running - want).abs().max().item<float>();
}

namespace {

// The state of one parameter `w` of a data-parallel pair (rank `world.rank()`), and the
// node directories of an `area`: rank 0's holds its snapshot of step 1, rank 1's nothing
// (node 1 lost its memory). Returns this rank's node directory.
std::string pair_with_rank0_snapshot(trireme::ft::TrainingState& state, World& world, const at::Tensor& w,
                                     torch::optim::AdamW& optimizer, const std::string& area) {
  const int rank = world.rank();
  state.world = &world;
  state.parameters = {{"w", w}};
  state.dp = 2;
  state.dp_rank = rank;
  state.dp_group = world.group();
  state.adamw = &optimizer;
  state.layout = {"dp=2", 2, 1, 1, 0, -1, ""};
  const std::string node = area + "/node" + std::to_string(rank);
  std::filesystem::create_directories(node);
  if (rank == 0) {
    trireme::ft::CheckpointLayout own = state.layout;
    own.rank = rank;
    Snapshotter snapshots(node + "/rank-0", own);
    trireme::ft::take_snapshot(state, snapshots, 1);
    snapshots.before_update();
    snapshots.wait();
  }
  return node;
}

}  // namespace

// Whole snapshots restored from the agents' memory where only one replica's node holds
// one: the donor broadcasts its parameters and AdamW state into the other replica's, also
// where those are not contiguous. (The broadcast goes through contiguous copies: Gloo
// handles such a tensor, NCCL refuses it.)
TEST(LoadSnapshot, MemoryDonorBroadcastFillsNonContiguousTensors) {
  TempDir area;
  run_worlds(2, [&](World& world) {
    const int rank = world.rank();
    const at::Tensor w = at::arange(12, at::kFloat).reshape({3, 4}).t().detach().requires_grad_(true);
    ASSERT_FALSE(w.is_contiguous());
    torch::optim::AdamW optimizer(std::vector<at::Tensor>{w}, torch::optim::AdamWOptions(1e-2));
    w.mutable_grad() = at::ones_like(w);
    optimizer.step();
    trireme::ft::TrainingState state;
    const std::string node = pair_with_rank0_snapshot(state, world, w, optimizer, area.path);
    const at::Tensor want = w.detach().clone();
    const auto adam = trireme::parallel::adamw_state(optimizer, w.unsafeGetTensorImpl());
    const at::Tensor want_avg = adam.exp_avg.clone(), want_sq = adam.exp_avg_sq.clone();
    {
      at::NoGradGuard no_grad;
      w.fill_(-1);  // in place: the strides stay
      trireme::parallel::set_adamw_state(optimizer, w.unsafeGetTensorImpl(), {});
    }
    std::string from;
    ASSERT_EQ(trireme::ft::load_from_memory(state, node, &from), 1) << from;
    EXPECT_FALSE(w.is_contiguous());
    EXPECT_TRUE(at::equal(w, want)) << "rank " << rank << ": " << w;
    const auto got = trireme::parallel::adamw_state(optimizer, w.unsafeGetTensorImpl());
    EXPECT_EQ(got.step, 1);
    ASSERT_TRUE(got.exp_avg.defined() && got.exp_avg_sq.defined());
    EXPECT_TRUE(at::equal(got.exp_avg, want_avg)) << "rank " << rank;
    EXPECT_TRUE(at::equal(got.exp_avg_sq, want_sq)) << "rank " << rank;
  });
}

// The generators are restored from memory on every rank or on none, as the bucket layout
// is: here rank 0's node holds its own snapshot and rank 1's none, so rank 0 keeps the
// stream it has (before, it rewound its own while its peer kept a fresh one: in a
// tensor-parallel group, replicated dropout masks then differed between the ranks).
TEST(LoadSnapshot, GeneratorsAreRestoredFromMemoryOnEveryRankOrNone) {
  TempDir area;
  run_worlds(2, [&](World& world) {
    const int rank = world.rank();
    const at::Tensor w = at::ones({2, 3}).requires_grad_(true);
    torch::optim::AdamW optimizer(std::vector<at::Tensor>{w}, torch::optim::AdamWOptions(1e-2));
    trireme::ft::TrainingState state;
    state.split_rng = std::make_shared<trireme::tensor::RngTracker>(7, 0);  // equal streams, as TP peers'
    const std::string node = pair_with_rank0_snapshot(state, world, w, optimizer, area.path);
    at::Generator& split = state.split_rng->split_generator();
    at::rand({16}, split);  // both streams move on from the snapshot's state
    const at::Tensor moved_on = split.get_state();
    std::string from;
    ASSERT_EQ(trireme::ft::load_from_memory(state, node, &from), 1) << from;
    EXPECT_TRUE(at::equal(split.get_state(), moved_on)) << "rank " << rank << " restored its generators alone";
  });
}

// A snapshot shared by the data-parallel group, restored on "nodes" that each hold only
// their own replica's share (each rank's snapshot directory in an area of its own): each
// share is broadcast by its holder and written into the others' parameters and AdamW
// state, also where those are not contiguous (before, a reshape(-1) copied such a tensor
// and the broadcast was written into the copy).
TEST(LoadSnapshot, SharedSnapshotBroadcastFillsNonContiguousTensors) {
  TempDir area;
  run_worlds(2, [&](World& world) {
    const int rank = world.rank();
    // Two transposed (non-contiguous) parameters, the same on both ranks: the larger is
    // replica 0's share, the other replica 1's.
    const at::Tensor w1 = at::arange(12, at::kFloat).reshape({3, 4}).t().detach().requires_grad_(true);
    const at::Tensor w2 = at::arange(10, at::kFloat).reshape({2, 5}).t().detach().requires_grad_(true);
    ASSERT_FALSE(w1.is_contiguous());
    torch::optim::AdamW optimizer(std::vector<at::Tensor>{w1, w2}, torch::optim::AdamWOptions(1e-2));
    w1.mutable_grad() = at::ones_like(w1);
    w2.mutable_grad() = at::full_like(w2, 2.0);
    optimizer.step();
    trireme::ft::TrainingState state;
    state.world = &world;
    state.parameters = {{"w1", w1}, {"w2", w2}};
    state.dp = 2;
    state.dp_rank = rank;
    state.dp_group = world.group();
    state.adamw = &optimizer;
    state.layout = {"dp=2", 2, 1, 1, 0, -1, ""};
    state.share_snapshots = true;
    trireme::ft::CheckpointLayout own = state.layout;
    own.rank = rank;
    const std::string dir = area.path + "/node" + std::to_string(rank) + "/rank-" + std::to_string(rank);
    {
      Snapshotter snapshots(dir, own);
      trireme::ft::take_snapshot(state, snapshots, 1);
      snapshots.before_update();
      snapshots.wait();
    }
    std::vector<at::Tensor> want;
    for (const at::Tensor& p : {w1, w2}) {
      const auto adam = trireme::parallel::adamw_state(optimizer, p.unsafeGetTensorImpl());
      ASSERT_EQ(adam.step, 1);
      want.insert(want.end(), {p.detach().clone(), adam.exp_avg.clone(), adam.exp_avg_sq.clone()});
    }
    {
      at::NoGradGuard no_grad;
      for (const at::Tensor& p : {w1, w2}) {
        p.fill_(-1);  // in place: the strides stay
        trireme::parallel::set_adamw_state(optimizer, p.unsafeGetTensorImpl(), {});
      }
    }
    bool shared = false;
    ASSERT_EQ(trireme::ft::load_snapshot(state, dir, &shared), 1);
    EXPECT_TRUE(shared);
    size_t k = 0;
    for (const at::Tensor& p : {w1, w2}) {
      const auto adam = trireme::parallel::adamw_state(optimizer, p.unsafeGetTensorImpl());
      EXPECT_TRUE(at::equal(p, want[k])) << "rank " << rank << " parameter " << k / 3;
      EXPECT_EQ(adam.step, 1);
      ASSERT_TRUE(adam.exp_avg.defined() && adam.exp_avg_sq.defined());
      EXPECT_TRUE(at::equal(adam.exp_avg, want[k + 1])) << "rank " << rank << " exp_avg " << k / 3;
      EXPECT_TRUE(at::equal(adam.exp_avg_sq, want[k + 2])) << "rank " << rank << " exp_avg_sq " << k / 3;
      k += 3;
    }
  });
}
