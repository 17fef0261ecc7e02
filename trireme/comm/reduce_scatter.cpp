// ReduceScatter: the backend's own for NCCL, a ring of sends and receives for Gloo; see
// reduce_scatter.h.
#include "trireme/comm/reduce_scatter.h"

#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>

#include "trireme/comm/shard.h"
#include "trireme/common/error.h"

namespace trireme::comm {
namespace {

// Point-to-point tag of the ring's messages. The ring's group carries no other
// point-to-point traffic (pipeline stages exchange over the pipeline group), and a pair's
// messages with one tag arrive in the order they were sent, so one tag serves every step.
constexpr int kRingTag = 0x5a;

c10::intrusive_ptr<c10::ivalue::Future> tensor_future() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

// The work of one ring task. Not c10d::Work::create_from_future: its wait() returns
// normally for a future that failed (only waitAndThrow rethrows), so a failed ring would
// pass for a finished one and the step would go on with partial sums.
class RingWork : public c10d::Work {
 public:
  explicit RingWork(c10::intrusive_ptr<c10::ivalue::Future> future) : future_(std::move(future)) {}
  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override { return future_->completed() ? future_->exception_ptr() : nullptr; }
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    future_->waitAndThrow();
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

ReduceScatter::ReduceScatter(dist::Group group) : group_(std::move(group)) {
  TRIREME_CHECK(group_, "ReduceScatter needs a process group");
  ring_ = group_->getBackendName() != "nccl";
  if (ring_ && group_->getSize() > 1) thread_ = std::thread([this] { run(); });
}

ReduceScatter::~ReduceScatter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

c10::intrusive_ptr<c10d::Work> ReduceScatter::launch(at::Tensor buffer) {
  const int d = group_->getSize();
  TRIREME_CHECK(buffer.is_contiguous() && buffer.dim() == 1 && buffer.numel() % d == 0,
                "reduce-scatter needs a contiguous 1-d buffer of d chunks; got ", buffer.numel(),
                " elements for d = ", d);
  if (!ring_) {
    const int64_t stride = buffer.numel() / d;
    at::Tensor mine = buffer.narrow(0, group_->getRank() * stride, stride);
    return group_->_reduce_scatter_base(mine, buffer);
  }
  auto future = tensor_future();
  if (d == 1) {
    future->markCompleted(c10::IValue(std::vector<at::Tensor>{buffer}));
    return c10::make_intrusive<RingWork>(future);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({buffer, future});
  }
  wake_.notify_one();
  return c10::make_intrusive<RingWork>(future);
}

void ReduceScatter::run() {
  c10::AutoGradMode no_grad(false);
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      if (!failure_.empty()) TRIREME_THROW(CommError, failure_);
      ring(task.buffer);
      task.future->markCompleted(c10::IValue(std::vector<at::Tensor>{task.buffer}));
    } catch (const std::exception& e) {
      if (failure_.empty()) failure_ = std::string("ring reduce-scatter failed: ") + dist::error_text(e);
      task.future->setError(std::make_exception_ptr(CommError(failure_)));
    }
  }
}

void ReduceScatter::ring(const at::Tensor& buffer) {
  const int d = group_->getSize();
  const int64_t stride = buffer.numel() / d;
  const auto chunk = [&](int c) { return buffer.narrow(0, c * stride, stride); };
  std::vector<at::Tensor> incoming{at::empty({stride}, buffer.options())};
  for (const RingStep& step : ring_reduce_scatter_steps(d, group_->getRank())) {
    std::vector<at::Tensor> outgoing{chunk(step.send_chunk)};
    auto recv = group_->recv(incoming, step.from, kRingTag);
    auto send = group_->send(outgoing, step.to, kRingTag);
    try {
      recv->wait();
    } catch (...) {
      try {  // the send reads the buffer: it must be over before the buffer can go
        send->wait();
      } catch (...) {
      }
      throw;
    }
    send->wait();
    chunk(step.recv_chunk).add_(incoming[0]);
  }
}

}  // namespace trireme::comm
