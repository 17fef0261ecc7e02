// Asynchronous reduce-scatter of a chunked buffer over a process group, for ZeRO-2.
//
// The buffer holds d chunks of `stride` elements (comm/shard.h); when the returned work
// completes, chunk r of rank r's buffer holds the sum over the group of chunk r (the other
// chunks hold partial sums and are to be discarded).
//
// Backends: NCCL has a reduce-scatter, used as is (in place). Gloo's, in libtorch 2.7,
// all-reduces the whole buffer and keeps a slice, which moves twice the data a
// reduce-scatter needs; so for Gloo the ring of comm/shard.h is run with point-to-point
// sends and receives: (d - 1)/d of the buffer sent and received per rank, the volume of a
// real reduce-scatter. The ring runs on a thread owned by this object, one buffer after
// another in launch order, so launches return at once and overlap whatever the caller
// does next (backward). Every rank must launch the same buffers in the same order.
// A failure (a peer gone, the group's time-out) fails that work and every later one.
#pragma once

#include <ATen/ATen.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "trireme/dist/backend.h"

namespace trireme::comm {

class ReduceScatter {
 public:
  explicit ReduceScatter(dist::Group group);
  ~ReduceScatter();
  ReduceScatter(const ReduceScatter&) = delete;
  ReduceScatter& operator=(const ReduceScatter&) = delete;

  // `buffer`: contiguous, numel a multiple of the group size. Throws InvalidArgument
  // otherwise; the work fails with the backend's error.
  c10::intrusive_ptr<c10d::Work> launch(at::Tensor buffer);

  // True when the ring (not the backend's collective) is used.
  bool uses_ring() const { return ring_; }

 private:
  struct Task {
    at::Tensor buffer;
    c10::intrusive_ptr<c10::ivalue::Future> future;
  };
  void run();
  void ring(const at::Tensor& buffer);

  dist::Group group_;
  bool ring_ = true;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::string failure_;  // once set, every later task fails with it
  std::thread thread_;
};

}  // namespace trireme::comm
