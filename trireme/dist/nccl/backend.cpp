// The NCCL backend plugin (libtrireme_nccl.so): c10d's ProcessGroupNCCL for CUDA tensors.
// Built only where the CUDA toolkit and libtorch_cuda exist; libtrireme loads it with
// dlopen on first use (dist/backend.cpp), so CPU-only runs never touch CUDA libraries.
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "trireme/common/error.h"
#include "trireme/dist/backend.h"

extern "C" __attribute__((visibility("default"))) trireme::dist::Group trireme_create_nccl_group(
    const trireme::dist::Store& store, int rank, int size,
    const trireme::dist::GroupOptions& options) {
  auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
  nccl_options->timeout = options.timeout;
  try {
    if (options.cuda_device < 0)
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, nccl_options);
    // (One GPU visible per process, as under Slurm's --gpus-per-task or a per-process
    // CUDA_VISIBLE_DEVICES: local rank n is that one, device 0.)
    const int count = c10::cuda::device_count();
    const auto index = static_cast<c10::DeviceIndex>(count > 0 ? options.cuda_device % count : options.cuda_device);
    c10::cuda::set_device(index);
    auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, nccl_options);
    group->setBoundDeviceId(at::Device(at::kCUDA, index));
    return group;
  } catch (const std::exception& e) {
    TRIREME_THROW(CommError, "cannot create NCCL group (rank ", rank, " of ", size,
                  "): ", trireme::dist::error_text(e));
  }
}
