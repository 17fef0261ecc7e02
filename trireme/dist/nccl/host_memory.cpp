// Page-locking of host memory the caller owns, for the CUDA plugin's users: the snapshot
// slots in the agent's shared memory are registered once, so that copies of CUDA state
// into them run on the copy engine while the GPU computes (ft/host_copy.h looks these up
// with dlsym; a CPU-only build never has them).
#include <cuda_runtime_api.h>

#include <cstddef>

extern "C" __attribute__((visibility("default"))) int trireme_cuda_host_register(void* base, size_t bytes) {
  return cudaHostRegister(base, bytes, cudaHostRegisterPortable) == cudaSuccess ? 0 : -1;
}

extern "C" __attribute__((visibility("default"))) int trireme_cuda_host_unregister(void* base) {
  return cudaHostUnregister(base) == cudaSuccess ? 0 : -1;
}
