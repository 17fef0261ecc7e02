// HostCopy and host-memory pinning; see host_copy.h. Device-generic c10 streams and
// events: no CUDA header here, and nothing CUDA runs unless a source is a CUDA tensor.
#include "trireme/ft/host_copy.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <dlfcn.h>

#include <cstring>

#include "trireme/common/error.h"
#include "trireme/obs/clock.h"

namespace trireme::ft {

void HostCopy::copy(const at::Tensor& dst, const at::Tensor& src) {
  TRIREME_CHECK(dst.device().is_cpu() && dst.sizes() == src.sizes() && dst.scalar_type() == src.scalar_type(),
                "host copy: destination ", dst.sizes(), " ", dst.scalar_type(), " on ", dst.device(),
                " does not hold source ", src.sizes(), " ", src.scalar_type());
  const at::Tensor source = src.detach();
  if (source.device().is_cpu()) {
    if (source.is_contiguous() && dst.is_contiguous())
      std::memcpy(dst.data_ptr(), source.data_ptr(), source.nbytes());
    else
      dst.copy_(source);
    return;
  }
  TRIREME_CHECK(source.is_cuda(), "host copy: tensors on ", source.device(), " are not supported; use cpu or cuda");
  TRIREME_CHECK(!began_ || source.device() == side_->device(), "host copy: sources on ", side_->device(), " and ",
                source.device(), " in one batch; snapshot one device's state per process");
  if (!began_) {
    // The side stream starts where the compute stream is now: after the writes of the
    // optimizer step whose result is being copied.
    const c10::impl::VirtualGuardImpl guard_impl(source.device().type());
    if (!side_ || side_->device() != source.device()) {
      side_ = guard_impl.getStreamFromGlobalPool(source.device());
      done_.emplace(source.device().type());
    }
    c10::Event joined(source.device().type());
    joined.record(guard_impl.getStream(source.device()));
    joined.block(*side_);
    began_ = true;
  }
  const c10::StreamGuard on_side(*side_);
  dst.copy_(source, /*non_blocking=*/true);
  in_flight_.push_back(source);  // a temporary source must outlive its copy
}

void HostCopy::finish() {
  if (!began_) return;
  done_->record(*side_);
  recorded_ = true;
  began_ = false;
}

void HostCopy::copy_all(const std::vector<std::pair<at::Tensor, at::Tensor>>& pairs) {
  try {
    for (const auto& [dst, src] : pairs) copy(dst, src);
  } catch (...) {
    abandon();
    throw;
  }
  finish();
}

void HostCopy::abandon() noexcept {
  try {
    finish();
    wait_host();
  } catch (...) {
    // The device failed too; nothing more can be waited for.
  }
  in_flight_.clear();
}

double HostCopy::settle() {
  if (!recorded_ || done_->query()) return 0;
  const double start = obs::now_us();
  done_->synchronize();
  return obs::now_us() - start;
}

void HostCopy::wait_host() {
  if (!recorded_) return;
  // On the copies' device: a thread that never chose one would otherwise be on GPU 0.
  const c10::DeviceGuard on_device(side_->device());
  done_->synchronize();
  in_flight_.clear();
}

namespace {

using RegisterFn = int (*)(void*, size_t);
using UnregisterFn = int (*)(void*);

// Exported by the CUDA plugin (dist/nccl/host_memory.cpp), present once it is loaded.
template <typename Fn>
Fn plugin_function(const char* name) {
  return reinterpret_cast<Fn>(::dlsym(RTLD_DEFAULT, name));
}

}  // namespace

bool pin_host_memory(void* base, size_t bytes) {
  const auto pin = plugin_function<RegisterFn>("trireme_cuda_host_register");
  return pin != nullptr && pin(base, bytes) == 0;
}

void unpin_host_memory(void* base) {
  if (const auto unpin = plugin_function<UnregisterFn>("trireme_cuda_host_unregister")) unpin(base);
}

}  // namespace trireme::ft
