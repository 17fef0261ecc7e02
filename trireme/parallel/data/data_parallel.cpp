// DataParallel: buckets, hooks and the overlapped all-reduce; see data_parallel.h.
#include "trireme/parallel/data/data_parallel.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <set>

#include "trireme/comm/shard.h"
#include "trireme/common/error.h"
#include "trireme/common/intervals.h"
#include "trireme/obs/clock.h"

namespace trireme::parallel {
namespace {

// Calls `fn` after AccumulateGrad has written a parameter's gradient (not when it was
// handed no gradient: a deferred weight gradient is counted when it is computed).
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& inputs) override {
    if (inputs.empty() || inputs[0].defined()) fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

int64_t bucket_key(const at::Tensor& t) {
  return static_cast<int64_t>(t.scalar_type()) * 1024 + static_cast<int64_t>(t.device().type()) * 64 +
         t.device().index() + 1;
}

}  // namespace

double StepCommStats::comm_busy_us() const {
  std::vector<std::pair<double, double>> spans;
  for (const auto& b : buckets) spans.emplace_back(b.launch_us, b.done_us);
  return union_length(std::move(spans));
}

int StepCommStats::buckets_overlapped() const {
  return static_cast<int>(std::count_if(buckets.begin(), buckets.end(), [&](const BucketTiming& b) {
    return b.launch_us < backward_end_us;
  }));
}

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> module, dist::Group group,
                           DataParallelOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  TRIREME_CHECK(module_, "DataParallel needs a module");
  TRIREME_CHECK(group_, "DataParallel needs a process group");
  TRIREME_CHECK(options_.contributions_per_step >= 1, "contributions_per_step must be >= 1");
  if (options_.reduction == DataParallelOptions::Reduction::kReduceScatter) {
    options_.rebuild_buckets = false;  // the shards must stay where the optimizer state is
    reduce_scatter_ = std::make_unique<comm::ReduceScatter>(group_);
  }
  // A tensor registered in two modules (tied weights) is listed twice by libtorch: it
  // takes part once, or its gradient would be sent, counted and stepped twice.
  for (auto& p : module_->parameters())
    if (p.requires_grad() && index_of_.emplace(p.unsafeGetTensorImpl(), params_.size()).second) params_.push_back(p);
  TRIREME_CHECK(!params_.empty(), "DataParallel needs a module with at least one parameter that requires a gradient "
                "(this one has none: there is nothing to reduce)");
  if (options_.broadcast_parameters) broadcast_initial_state();
  build_buckets(comm::reverse_order(params_.size()));
  try {
    install_hooks();
  } catch (...) {
    remove_hooks();  // hooks already added capture `this`, which is about to go away
    throw;
  }
}

DataParallel::~DataParallel() { remove_hooks(); }

void DataParallel::broadcast_initial_state() {
  std::vector<at::Tensor> listed = module_->parameters();
  if (options_.broadcast_buffers)
    for (auto& b : module_->buffers()) listed.push_back(b);
  std::vector<at::Tensor> state;  // each tensor once (tied weights are listed twice)
  std::set<const void*> seen;
  for (auto& t : listed)
    if (seen.insert(t.unsafeGetTensorImpl()).second) state.push_back(t);
  if (group_->getSize() == 1 || state.empty()) return;
  at::NoGradGuard no_grad;
  // One flat broadcast per dtype/device, in chunks of the bucket cap.
  std::map<int64_t, std::vector<at::Tensor>> by_key;
  for (auto& t : state) by_key[bucket_key(t)].push_back(t);
  for (auto& [key, tensors] : by_key) {
    size_t begin = 0;
    while (begin < tensors.size()) {
      size_t end = begin, bytes = 0;
      while (end < tensors.size() &&
             (end == begin || bytes + tensors[end].nbytes() <= options_.buckets.cap_bytes))
        bytes += tensors[end++].nbytes();
      std::vector<at::Tensor> flat_parts;
      for (size_t i = begin; i < end; ++i) flat_parts.push_back(tensors[i].detach().reshape(-1));
      std::vector<at::Tensor> flat{at::cat(flat_parts)};
      c10d::BroadcastOptions opts;
      opts.rootRank = 0;
      dist::run_collective("initial parameter broadcast", [&] { return group_->broadcast(flat, opts); });
      int64_t offset = 0;
      for (size_t i = begin; i < end; ++i) {
        const int64_t n = tensors[i].numel();
        tensors[i].detach().copy_(flat[0].narrow(0, offset, n).view_as(tensors[i]));
        offset += n;
      }
      begin = end;
    }
  }
}

void DataParallel::install_hooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    // The accumulator node is held only weakly by the parameter: keep it alive, so that
    // our hook is the one autograd runs.
    auto accumulator = torch::autograd::impl::grad_accumulator(params_[i]);
    TRIREME_CHECK(accumulator, "parameter ", i, " is not a leaf that accumulates gradients");
    hook_keys_.push_back(
        accumulator->add_post_hook(std::make_unique<GradReadyHook>([this, i] { on_gradient_ready(i); })));
    accumulators_.push_back(std::move(accumulator));
  }
}

void DataParallel::remove_hooks() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  accumulators_.clear();
  hook_keys_.clear();
}

void DataParallel::build_buckets(const std::vector<size_t>& order) {
  std::vector<comm::BucketParam> specs;
  for (const auto& p : params_) specs.push_back({p.nbytes(), bucket_key(p)});
  assignment_ = comm::assign_buckets(specs, order, options_.buckets);
  order_ = order;
  buckets_.clear();
  bucket_of_.assign(params_.size(), 0);
  for (size_t b = 0; b < assignment_.size(); ++b) {
    Bucket bucket;
    bucket.params = assignment_[b];
    int64_t numel = 0;
    for (size_t p : bucket.params) {
      bucket.offsets.push_back(numel);
      numel += params_[p].numel();
      bucket_of_[p] = b;
    }
    bucket.flags_offset = numel;
    const auto options = params_[bucket.params.front()].options().requires_grad(false);
    if (reduce_scatter_) {
      bucket.chunk = comm::chunk_length(numel, group_->getSize());
      bucket.shard = at::zeros({bucket.chunk}, options);
      bucket.had_grad.assign(bucket.params.size(), false);
    } else if (group_->getSize() > 1) {
      numel += static_cast<int64_t>(bucket.params.size());  // one "has a gradient" flag each
      bucket.flat = at::zeros({numel}, options);
    }  // a group of one: the gradients are already the average; no buffer, no collective
    buckets_.push_back(std::move(bucket));
  }
}

void DataParallel::start_step() {
  in_step_ = true;
  graph_task_ = torch::autograd::get_current_graph_task_id();
  current_ = StepCommStats{};
  current_.first_hook_us = obs::now_us();
  contributions_.assign(params_.size(), 0);
  ready_order_.clear();
  next_launch_ = 0;
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.params.size();
    bucket.launched = false;
    bucket.work.reset();
  }
  if (options_.sync_point == DataParallelOptions::SyncPoint::kEndOfBackward)
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
}

void DataParallel::on_gradient_ready(size_t param) {
  if (!sync_enabled_) return;
  std::lock_guard<std::mutex> lock(mutex_);  // autograd runs one thread per device
  if (!failure_.empty()) TRIREME_THROW(CommError, failure_);
  const bool explicit_sync = options_.sync_point == DataParallelOptions::SyncPoint::kExplicit;
  if (in_step_ && !explicit_sync && torch::autograd::get_current_graph_task_id() != graph_task_) {
    // The previous backward never finished (an exception interrupted it): some of its
    // all-reduces may have been issued and others not, here and on other ranks, so the
    // replicas can no longer be kept in step. Refuse loudly rather than drift apart.
    failure_ = "a previous backward did not finish, so its gradient all-reduces were left "
               "incomplete; the data-parallel group must be rebuilt (restart the job)";
    TRIREME_THROW(CommError, failure_);
  }
  if (!in_step_) start_step();
  const int target = options_.contributions_per_step;
  if (contributions_[param] == target) {
    if (!explicit_sync) return;  // already counted (a parameter used twice)
    // More contributions than one step has: a step was interrupted before synchronize().
    failure_ = "parameter " + std::to_string(param) + " received more gradient contributions "
               "than one step has: a previous step did not finish, so its all-reduces were "
               "left incomplete; the data-parallel group must be rebuilt (restart the job)";
    TRIREME_THROW(CommError, failure_);
  }
  if (++contributions_[param] < target) return;
  ready_order_.push_back(param);
  --buckets_[bucket_of_[param]].pending;
  launch_ready_buckets();
}

void DataParallel::gradient_accumulated(const at::Tensor& param) {
  const auto it = index_of_.find(param.unsafeGetTensorImpl());
  TRIREME_CHECK(it != index_of_.end(),
                "gradient_accumulated: the tensor is not a parameter of this DataParallel module");
  on_gradient_ready(it->second);
}

void DataParallel::synchronize() {
  TRIREME_CHECK(options_.sync_point == DataParallelOptions::SyncPoint::kExplicit,
                "DataParallel::synchronize() needs SyncPoint::kExplicit; with kEndOfBackward the "
                "step ends by itself at the end of backward");
  if (!sync_enabled_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty()) TRIREME_THROW(CommError, failure_);
    if (!in_step_) start_step();  // no gradient arrived at all: every flag stays 0
  }
  finalize();
}

void DataParallel::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) launch(next_launch_++);
}

// Reduce-scatter layout: d chunks of `chunk` gradient elements, each followed by the
// bucket's flags (so every owner receives all of them reduced). The parameters' gradients
// are released once copied: from here on this rank keeps only its shard.
at::Tensor DataParallel::pack_chunks(Bucket& bucket) {
  const int d = group_->getSize();
  const int64_t flags = static_cast<int64_t>(bucket.params.size());
  const int64_t stride = bucket.chunk + flags;
  const at::Tensor& first = params_[bucket.params.front()];
  at::Tensor buffer = at::zeros({d * stride}, first.options().requires_grad(false));
  at::Tensor had = at::zeros({flags}, first.options().requires_grad(false));
  for (size_t k = 0; k < bucket.params.size(); ++k) {
    at::Tensor& p = params_[bucket.params[k]];
    if (!p.grad().defined()) continue;
    had[static_cast<int64_t>(k)].fill_(1.0);
    const at::Tensor grad = p.grad().reshape(-1);
    for (const comm::Segment& s : comm::split_by_chunks(bucket.offsets[k], p.numel(), bucket.chunk))
      buffer.narrow(0, s.chunk * stride + s.chunk_offset, s.length).copy_(grad.narrow(0, s.offset, s.length));
    p.mutable_grad().reset();
  }
  for (int c = 0; c < d; ++c) buffer.narrow(0, c * stride + bucket.chunk, flags).copy_(had);
  return buffer;
}

void DataParallel::launch(size_t b) {
  at::NoGradGuard no_grad;
  Bucket& bucket = buckets_[b];
  if (reduce_scatter_) {
    bucket.flat = pack_chunks(bucket);
  } else if (!bucket.flat.defined()) {  // a group of one
    bucket.launched = true;
    return;
  } else {
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const at::Tensor& p = params_[bucket.params[k]];
      at::Tensor slot = bucket.flat.narrow(0, bucket.offsets[k], p.numel());
      const bool has_grad = p.grad().defined();
      if (has_grad)
        slot.copy_(p.grad().reshape(-1));
      else
        slot.zero_();
      bucket.flat[bucket.flags_offset + static_cast<int64_t>(k)].fill_(has_grad ? 1.0 : 0.0);
    }
  }
  bucket.flat.div_(group_->getSize());
  const char* what = reduce_scatter_ ? "reduce-scatter" : "all-reduce";
  BucketTiming timing{static_cast<int>(b), bucket.flat.nbytes(), obs::now_us(), 0};
  try {
    if (reduce_scatter_) {
      bucket.work = reduce_scatter_->launch(bucket.flat);
    } else {
      std::vector<at::Tensor> tensors{bucket.flat};
      bucket.work = group_->allreduce(tensors);
    }
  } catch (const std::exception& e) {
    TRIREME_THROW(CommError, "gradient ", what, " of bucket ", b, " could not be issued: ",
                  dist::error_text(e));
  }
  bucket.launched = true;
  bucket.done_us = std::make_shared<std::atomic<double>>(0.0);
  auto done = bucket.done_us;
  bucket.work->getFuture()->addCallback([done](c10::ivalue::Future&) { *done = obs::now_us(); });
  current_.buckets.push_back(timing);
}

void DataParallel::finalize() {
  try {
    finish_step();
  } catch (const std::exception& e) {
    // Buckets may be left unreduced here and reduced elsewhere: later steps cannot be
    // trusted to line up, so every later backward fails with this message.
    failure_ = std::string("gradient synchronisation failed: ") + dist::error_text(e);
    throw;
  }
}

void DataParallel::finish_step() {
  current_.backward_end_us = obs::now_us();
  at::NoGradGuard no_grad;
  // Buckets still waiting hold parameters that got no gradient in this step.
  for (auto& bucket : buckets_) bucket.pending = 0;
  launch_ready_buckets();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (reduce_scatter_) {
      dist::wait_work(bucket.work, "gradient reduce-scatter");
      const int64_t stride = bucket.chunk + static_cast<int64_t>(bucket.params.size());
      const at::Tensor mine = bucket.flat.narrow(0, group_->getRank() * stride, stride);
      bucket.shard.copy_(mine.narrow(0, 0, bucket.chunk));
      const at::Tensor flags = mine.narrow(0, bucket.chunk, stride - bucket.chunk).to(at::kFloat).cpu();
      for (size_t k = 0; k < bucket.params.size(); ++k) bucket.had_grad[k] = flags.data_ptr<float>()[k] != 0.0f;
      bucket.flat = at::Tensor();  // the transient buffer goes; the shard stays
      bucket.work.reset();
      continue;
    }
    if (!bucket.work) continue;  // a group of one: nothing was sent
    dist::wait_work(bucket.work, "gradient all-reduce");
    const at::Tensor flags =
        bucket.flat.narrow(0, bucket.flags_offset, static_cast<int64_t>(bucket.params.size()))
            .to(at::kFloat)
            .cpu();
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      at::Tensor& p = params_[bucket.params[k]];
      // No rank had a gradient for it: leave it undefined, as one process would, so the
      // optimizer skips it.
      if (flags.data_ptr<float>()[k] == 0.0f) continue;
      at::Tensor averaged = bucket.flat.narrow(0, bucket.offsets[k], p.numel()).view_as(p);
      if (p.grad().defined())
        p.mutable_grad().copy_(averaged);
      else
        p.mutable_grad() = averaged.clone();
    }
  }
  current_.sync_end_us = obs::now_us();
  for (auto& timing : current_.buckets) {
    // The completion callback has run by the time wait() returns; fall back to now if not.
    const double done = *buckets_[timing.bucket].done_us;
    timing.done_us = done > 0 ? done : current_.sync_end_us;
  }
  last_ = current_;
  in_step_ = false;
  ++steps_;
  if (options_.rebuild_buckets && !rebuilt_) rebuild_from_observed_order();
}

const at::Tensor& DataParallel::gradient_shard(size_t b) const {
  TRIREME_CHECK(reduce_scatter_, "gradient_shard() needs Reduction::kReduceScatter");
  TRIREME_CHECK(b < buckets_.size(), "gradient_shard: bucket ", b, " of ", buckets_.size());
  return buckets_[b].shard;
}

bool DataParallel::had_gradient(size_t b, size_t k) const {
  TRIREME_CHECK(reduce_scatter_, "had_gradient() needs Reduction::kReduceScatter");
  TRIREME_CHECK(b < buckets_.size() && k < buckets_[b].had_grad.size(), "had_gradient: no parameter ", k,
                " in bucket ", b);
  return buckets_[b].had_grad[k];
}

int64_t DataParallel::buffer_bytes() const {
  int64_t bytes = 0;
  for (const auto& bucket : buckets_) {
    const at::Tensor& kept = reduce_scatter_ ? bucket.shard : bucket.flat;
    if (kept.defined()) bytes += static_cast<int64_t>(kept.nbytes());
  }
  return bytes;
}

at::Tensor DataParallel::bucket_state() const {
  at::Tensor state = at::empty({static_cast<int64_t>(order_.size()) + 1}, at::kLong);
  auto* data = state.data_ptr<int64_t>();
  for (size_t i = 0; i < order_.size(); ++i) data[i] = static_cast<int64_t>(order_[i]);
  data[order_.size()] = rebuilt_ ? 1 : 0;
  return state;
}

bool DataParallel::restore_bucket_state(const at::Tensor& state) {
  const size_t n = params_.size();
  TRIREME_CHECK(state.scalar_type() == at::kLong && state.dim() == 1, "bucket state must be a 1-d int64 tensor");
  TRIREME_CHECK(!in_step_, "restore_bucket_state() must come before the first step");
  if (state.numel() != static_cast<int64_t>(n) + 1) return false;
  const at::Tensor contiguous = state.contiguous();
  const auto* data = contiguous.data_ptr<int64_t>();
  std::vector<size_t> order(n);
  std::vector<bool> seen(n, false);
  for (size_t i = 0; i < n; ++i) {
    TRIREME_CHECK(data[i] >= 0 && data[i] < static_cast<int64_t>(n) && !seen[static_cast<size_t>(data[i])],
                  "bucket state is not an order of the ", n, " parameters");
    seen[static_cast<size_t>(data[i])] = true;
    order[i] = static_cast<size_t>(data[i]);
  }
  if (data[n] != 1 || !options_.rebuild_buckets) return false;  // the first step rebuilds, as the run did
  build_buckets(order);
  rebuilt_ = true;
  return true;
}

void DataParallel::rebuild_from_observed_order() {
  rebuilt_ = true;
  // Parameters that got no gradient go last, in reverse registration order.
  std::vector<int64_t> order(ready_order_.begin(), ready_order_.end());
  std::vector<bool> listed(params_.size(), false);
  for (size_t p : ready_order_) listed[p] = true;
  for (size_t p = params_.size(); p-- > 0;)
    if (!listed[p]) order.push_back(static_cast<int64_t>(p));
  // Every rank must use the same buckets: take rank 0's observed order.
  // On the parameters' device: NCCL only moves CUDA tensors.
  std::vector<at::Tensor> tensor{at::tensor(order, at::kLong).to(params_.front().device())};
  if (group_->getSize() > 1) {
    c10d::BroadcastOptions opts;
    opts.rootRank = 0;
    dist::run_collective("bucket order broadcast", [&] { return group_->broadcast(tensor, opts); });
  }
  const at::Tensor agreed_order = tensor[0].cpu();
  std::vector<size_t> agreed(params_.size());
  const auto* data = agreed_order.data_ptr<int64_t>();
  for (size_t i = 0; i < agreed.size(); ++i) agreed[i] = static_cast<size_t>(data[i]);
  build_buckets(agreed);
}

}  // namespace trireme::parallel
