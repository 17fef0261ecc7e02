// The counting CPU allocator; see obs/memory.h.
#include "trireme/obs/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace trireme::obs {
namespace {

std::atomic<int64_t> live_bytes{0};
std::atomic<int64_t> peak{0};
std::atomic<bool> is_installed{false};

void add(int64_t n) {
  const int64_t now = live_bytes.fetch_add(n) + n;
  int64_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}

// The inner allocations, by data pointer. The context of a counted DataPtr is its data
// pointer (not a separate record): libtorch's raw_allocate(), which some kernels use for
// scratch space, requires exactly that.
struct Counted {
  c10::DataPtr inner;
  int64_t bytes = 0;
};
std::mutex table_mutex;
std::unordered_map<void*, Counted>& table() {
  static auto* map = new std::unordered_map<void*, Counted>();  // outlives every storage
  return *map;
}

void free_counted(void* data) {
  Counted counted;
  {
    std::lock_guard<std::mutex> lock(table_mutex);
    auto it = table().find(data);
    if (it == table().end()) return;
    counted = std::move(it->second);
    table().erase(it);
  }
  live_bytes.fetch_sub(counted.bytes);
  // counted.inner frees the inner allocation as it goes out of scope.
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    if (data == nullptr) return inner;  // zero bytes: nothing to count
    {
      std::lock_guard<std::mutex> lock(table_mutex);
      table()[data] = Counted{std::move(inner), static_cast<int64_t>(n)};
    }
    add(static_cast<int64_t>(n));
    return {data, data, &free_counted, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_counted; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* inner_;
};

}  // namespace

void CpuMemory::install() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never destroyed: storages allocated through it may outlive any scope.
    static auto* allocator = new CountingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(allocator, /*priority=*/100);
    is_installed = true;
  });
}

bool CpuMemory::installed() { return is_installed; }
int64_t CpuMemory::current_bytes() { return live_bytes.load(); }
int64_t CpuMemory::peak_bytes() { return peak.load(); }
void CpuMemory::reset_peak() { peak = live_bytes.load(); }

}  // namespace trireme::obs
