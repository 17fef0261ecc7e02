// The counting CPU allocator (obs/memory.h): tensors allocated after install() are counted
// while alive, the peak remembers the largest live total, and freeing un-counts.
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include "trireme/obs/memory.h"

namespace trireme::obs {
namespace {

TEST(CpuMemory, CountsLiveTensorsAndThePeak) {
  CpuMemory::install();
  CpuMemory::install();  // idempotent
  ASSERT_TRUE(CpuMemory::installed());
  const int64_t before = CpuMemory::current_bytes();
  CpuMemory::reset_peak();
  {
    at::Tensor a = at::zeros({1 << 18}, at::kFloat);  // 1 MiB
    EXPECT_GE(CpuMemory::current_bytes() - before, 1 << 20);
    {
      at::Tensor b = at::ones({1 << 19}, at::kFloat);  // 2 MiB more
      EXPECT_GE(CpuMemory::current_bytes() - before, 3 << 20);
      EXPECT_FLOAT_EQ((a.sum() + b.sum()).item<float>(), float(1 << 19));  // usable memory
    }
    EXPECT_LT(CpuMemory::current_bytes() - before, 2 << 20);
  }
  EXPECT_LT(CpuMemory::current_bytes() - before, 1 << 20);
  EXPECT_GE(CpuMemory::peak_bytes() - before, 3 << 20);
  CpuMemory::reset_peak();
  EXPECT_EQ(CpuMemory::peak_bytes(), CpuMemory::current_bytes());
}

// Kernels may take scratch space through raw_allocate()/raw_deallocate(), which requires
// an allocator whose DataPtr context is its data pointer.
TEST(CpuMemory, ServesRawAllocations) {
  CpuMemory::install();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  const int64_t before = CpuMemory::current_bytes();
  void* p = allocator->raw_allocate(4096);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(CpuMemory::current_bytes() - before, 4096);
  allocator->raw_deallocate(p);
  EXPECT_EQ(CpuMemory::current_bytes(), before);
}

}  // namespace
}  // namespace trireme::obs
