// HostCopy (ft/host_copy.h): host copies of training state. On the CPU a copy is done when
// copy() returns; on a GPU (tests that skip without one) the copies run on a side stream
// that starts after the compute stream's queued work, and settle() keeps the next write
// from overwriting a source before its copy has read it.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <filesystem>
#include <string>

#include <ATen/ATen.h>

#include "trireme/common/error.h"
#include "trireme/dist/backend.h"
#include "trireme/ft/host_copy.h"
#include "trireme/ft/snapshot.h"

using trireme::InvalidArgument;
using trireme::ft::HostCopy;

TEST(HostCopy, CpuSourcesAreCopiedWhenCopyReturns) {
  HostCopy copies;
  const at::Tensor contiguous = at::arange(12, at::kFloat).reshape({3, 4});
  const at::Tensor transposed = at::arange(12, at::kDouble).reshape({3, 4}).t();  // strided
  at::Tensor a = at::zeros({3, 4}, at::kFloat), b = at::zeros({4, 3}, at::kDouble);
  copies.copy(a, contiguous);
  copies.copy(b, transposed);
  EXPECT_TRUE(at::equal(a, contiguous));  // before finish() or any wait
  EXPECT_TRUE(at::equal(b, transposed));
  copies.finish();
  EXPECT_EQ(copies.settle(), 0.0);  // nothing queued on a device: no waits
  copies.wait_host();
}

TEST(HostCopy, RefusesADestinationOfAnotherShapeOrType) {
  HostCopy copies;
  const at::Tensor source = at::ones({2, 3});
  at::Tensor wrong_shape = at::zeros({3, 2}), wrong_type = at::zeros({2, 3}, at::kDouble);
  EXPECT_THROW(copies.copy(wrong_shape, source), InvalidArgument);
  EXPECT_THROW(copies.copy(wrong_type, source), InvalidArgument);
  EXPECT_EQ(wrong_shape.sum().item<float>(), 0.0f);  // left as it was
  EXPECT_EQ(wrong_type.sum().item<double>(), 0.0);
  copies.abandon();  // what a caller does after a failed copy(): the batch ends cleanly
  at::Tensor right = at::zeros({2, 3});
  copies.copy(right, source);
  copies.finish();
  EXPECT_TRUE(at::equal(right, source));
  // A whole batch whose second pair is wrong: it throws, after ending the batch.
  at::Tensor first = at::zeros({2, 3});
  EXPECT_THROW(copies.copy_all({{first, source}, {wrong_shape, source}}), InvalidArgument);
  EXPECT_TRUE(at::equal(first, source));
  EXPECT_EQ(wrong_shape.sum().item<float>(), 0.0f);
}

TEST(HostCopy, PinningNeedsTheCudaPlugin) {
  // This test binary never loads the CUDA plugin unless a GPU test did: without it there
  // is nothing to page-lock with, and the copies stay correct (synchronous).
  if (::dlsym(RTLD_DEFAULT, "trireme_cuda_host_register")) GTEST_SKIP() << "the CUDA plugin is loaded";
  void* region = ::mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  EXPECT_FALSE(trireme::ft::pin_host_memory(region, 1 << 16));
  trireme::ft::unpin_host_memory(region);  // harmless when not pinned
  ::munmap(region, 1 << 16);
}

namespace {

// Loads the CUDA plugin and returns whether a GPU is usable.
bool have_gpu() {
  try {
    trireme::dist::require_cuda_devices(1);
    return true;
  } catch (const trireme::Error&) {
    return false;
  }
}

}  // namespace

TEST(HostCopy, GpuCopiesFollowTheComputeStreamAndSettleBeforeTheNextWrite) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const at::Device gpu(at::kCUDA, 0);
  at::Tensor param = at::zeros({1024, 1024}, at::TensorOptions(gpu));
  for (int i = 0; i < 50; ++i) param.add_(1.0);  // queued on the compute stream
  const size_t bytes = static_cast<size_t>(param.nbytes());
  void* region = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  EXPECT_TRUE(trireme::ft::pin_host_memory(region, bytes));
  at::Tensor host = at::from_blob(region, param.sizes(), at::kFloat);
  HostCopy copies;
  copies.copy(host, param);
  copies.finish();
  EXPECT_GE(copies.settle(), 0.0);
  param.fill_(-1.0);  // the next "optimizer step": after the copy, by settle()
  copies.wait_host();
  EXPECT_TRUE(at::all(host == 50.0).item<bool>()) << "the copy saw another version than the 50th";
  EXPECT_TRUE(at::all(param.cpu() == -1.0).item<bool>());
  trireme::ft::unpin_host_memory(region);
  ::munmap(region, bytes);
}

TEST(HostCopy, GpuStateSnapshotsIntoPinnedSlots) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::string area = "/dev/shm/trireme-test-host-copy-" + std::to_string(::getpid());
  {
    trireme::ft::Snapshotter snapshots(area, {"dp=1", 1, 1, 1, 0, 0});
    at::Tensor weight = at::randn({256, 130}, at::TensorOptions(at::Device(at::kCUDA, 0)));
    for (int64_t s = 1; s <= 4; ++s) {
      const at::Tensor expected = weight.cpu();
      snapshots.take(s, {{"w", {256, 130}, {{0, 0}, {256, 130}}, weight}});
      snapshots.before_update();
      weight.mul_(1.5);  // changes nothing the snapshot of step s holds
      snapshots.wait();
      const auto c = trireme::ft::Checkpoint::open(area + "/" + std::to_string(s), /*verify_data=*/true);
      EXPECT_TRUE(at::equal(c.read("w", {{0, 0}, {256, 130}}), expected)) << "step " << s;
    }
  }
  std::filesystem::remove_all(area);
}
