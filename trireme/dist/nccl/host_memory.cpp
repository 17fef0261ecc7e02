// Page-locking of host memory the caller owns, for the CUDA plugin's users: the snapshot
// slots in the agent's shared memory are registered once, so that copies of CUDA state
// into them run on the copy engine while the GPU computes (ft/host_copy.h looks these up
// with dlsym; a CPU-only build never has them).
#include <cuda_runtime_api.h>

#include <cstddef>

namespace {

// 0 on success. A failure is also cleared from the runtime's per-thread error, which
// PyTorch checks after its next kernel launch and would report as that kernel's.
int result_of(cudaError_t error) {
  if (error == cudaSuccess) return 0;
  (void)cudaGetLastError();
  return -1;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int trireme_cuda_host_register(void* base, size_t bytes) {
  return result_of(cudaHostRegister(base, bytes, cudaHostRegisterPortable));
}

extern "C" __attribute__((visibility("default"))) int trireme_cuda_host_unregister(void* base) {
  return result_of(cudaHostUnregister(base));
}
