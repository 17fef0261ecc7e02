// Copies of training state into host memory that keep the training thread (and, for CUDA
// tensors, the GPU's compute stream) waiting as little as possible.
//
// CPU tensors are copied at once, on the calling thread. CUDA tensors are copied on a
// side stream of their device: the side stream first waits for what the compute stream
// has queued so far (the optimizer step that wrote the parameters), then the copies run
// on the copy engine while the compute stream goes on with the next forward and
// backward. Nothing waits at the time of the copy. Two waits remain, each where it must be:
//   - settle(): before anything changes the sources (the next optimizer step), the
//     training thread waits for copies still running: nothing when they are done, as they
//     are unless the forward and backward were shorter than the copy;
//   - wait_host(): the thread that reads the host copies (checksums, disk writes) blocks
//     until they have landed.
// A device-to-host copy only runs asynchronously into page-locked memory: pin_host_memory
// page-locks a region the caller owns (the snapshot slots in shared memory) through the
// CUDA plugin (dist/nccl), and copies into pageable memory stay correct but synchronous.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

namespace trireme::ft {

class HostCopy {
 public:
  HostCopy() = default;
  HostCopy(const HostCopy&) = delete;
  HostCopy& operator=(const HostCopy&) = delete;

  // Copies `src` (any device; any strides) into `dst`, a host tensor of the same shape and
  // dtype. CPU: done on return. CUDA: queued, done after wait_host(). Throws
  // InvalidArgument for a mismatch, before queueing anything for this copy.
  void copy(const at::Tensor& dst, const at::Tensor& src);
  // Ends a batch of copies: the point that settle() and wait_host() wait for.
  void finish();
  // One whole batch: copy() of each (destination, source) pair, then finish(); when a
  // copy throws, abandon() and rethrow (what was queued is waited for first).
  void copy_all(const std::vector<std::pair<at::Tensor, at::Tensor>>& pairs);
  // Ends a batch that failed part way: waits for what it queued. Call instead of finish()
  // when a copy() threw.
  void abandon() noexcept;
  // Returns at once when the last batch's copies are done (or were CPU copies); else
  // blocks until they are and returns the microseconds it waited. Training thread.
  double settle();
  // Blocks the calling thread until every queued copy is in host memory, then lets go of
  // their sources. Any thread, but not while another calls copy().
  void wait_host();

 private:
  std::optional<c10::Stream> side_;  // the copies' stream, on the first CUDA source's device
  std::optional<c10::Event> done_;   // recorded on side_ by finish()
  bool began_ = false;                // this batch has joined the compute stream
  bool recorded_ = false;             // done_ marks the batch now in flight
  std::vector<at::Tensor> in_flight_;  // sources kept alive until their copies land
};

// Page-locks [base, base + bytes) for asynchronous device-to-host copies, when the CUDA
// plugin is loaded (a CUDA run). Returns whether it did. Unpin before unmapping.
bool pin_host_memory(void* base, size_t bytes);
void unpin_host_memory(void* base);

}  // namespace trireme::ft
