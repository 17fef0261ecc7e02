// DataParallel: C++ distributed data parallelism with wait-free backpropagation.
//
// Each rank holds a full replica of the module and computes gradients on its share of the
// batch; DataParallel averages the gradients across the data-parallel group so that every
// replica takes the same optimizer step. Following Poseidon's wait-free backpropagation, the
// averaging overlaps backward: gradients are grouped into buckets (comm/bucket.h), and a
// bucket's asynchronous all-reduce is launched from an autograd hook the moment the last of
// its gradients has been accumulated, while backward carries on with earlier layers.
//
// One step, as seen by DataParallel:
//   1. backward starts; as each parameter's gradient is accumulated, its post-accumulate
//      hook marks it ready. A bucket whose gradients are all ready is copied into its flat
//      buffer, divided by the group size and all-reduced asynchronously. Buckets launch in
//      bucket order on every rank (collectives must be issued in the same order
//      everywhere), so a bucket that is ready early waits for the ones before it.
//   2. when autograd finishes (an engine callback queued by the first hook), buckets not
//      yet launched -- some parameter of theirs got no gradient in this step -- are
//      launched with zeros for the missing gradients; then every bucket is waited for and
//      the averaged gradients are written back to param.grad().
//   3. after the first step the bucket assignment is rebuilt from the order in which
//      gradients actually became ready (rank 0's order, broadcast so all ranks agree).
//
// Gradient accumulation: inside a `no_sync()` scope the hooks do nothing and gradients
// accumulate locally; the first backward outside it averages the accumulated sums.
//
// Pipeline stages (parallel/pipeline/executor.h) use the same machinery with two options:
// a parameter's gradient is complete after `contributions_per_step` accumulations (one per
// micro-batch), and the step ends when the caller says so (`SyncPoint::kExplicit`,
// synchronize()) rather than at the end of one backward pass. A bucket is still launched
// the moment its last gradient is complete, so the all-reduce of the last layers overlaps
// the backward work the schedule has left. Gradients written outside autograd (the
// deferred weight gradients of zero-bubble schedules) are reported with
// gradient_accumulated().
//
// In a group of one rank (tensor or pipeline parallelism without data parallelism) the
// gradients already are the average: no bucket buffer is kept and nothing is sent.
//
// Each bucket carries, after the gradients, one flag per parameter saying whether this
// rank had a gradient for it. A parameter that no rank gives a gradient keeps an undefined
// gradient, as it would in one process, so the optimizer skips it (no weight decay or
// moment update); one that some ranks use gets the average, the others counting zero.
//
// ZeRO-2 (Reduction::kReduceScatter, used by parallel/data/zero.h): a bucket is
// reduce-scattered instead of all-reduced (comm/reduce_scatter.h). Rank r of d owns chunk r
// of every bucket (comm/shard.h); at launch the bucket's gradients are packed into a
// transient buffer of d chunks, each chunk followed by the bucket's "had a gradient"
// flags, and the parameters' gradients are released; when the step ends, this rank's
// averaged chunk is kept in gradient_shard(bucket) and the flags in had_gradient(), and
// parameters' .grad stay undefined. Bucket rebuilding is off in this mode (the shards,
// and the optimizer state behind them, must not move).
//
// Failures are loud, never silent drift: an all-reduce that fails, or a backward that an
// exception interrupted (leaving some buckets reduced and others not), makes this and every
// later backward throw CommError; the job must be restarted (the agent's recovery path).
// Move the module to its device before wrapping it: DataParallel hooks the parameters'
// gradient accumulators, which moving the parameters replaces.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/nn/module.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "trireme/comm/bucket.h"
#include "trireme/comm/reduce_scatter.h"
#include "trireme/dist/backend.h"

namespace trireme::parallel {

struct DataParallelOptions {
  comm::BucketOptions buckets;
  // Rebuild the buckets from the observed gradient-ready order after the first step.
  bool rebuild_buckets = true;
  // Broadcast rank 0's parameters at construction, so that every replica starts equal.
  // Off for a caller that makes them equal itself right after (e.g. by restoring the same
  // checkpoint into every replica), who calls broadcast_initial_state() if it cannot.
  bool broadcast_parameters = true;
  // Broadcast buffers (e.g. running statistics) from rank 0 along with the parameters.
  bool broadcast_buffers = true;
  // Accumulations that complete one step's gradient of a parameter: 1 for plain data
  // parallelism, m for a pipeline stage running m micro-batches.
  int contributions_per_step = 1;
  enum class SyncPoint {
    kEndOfBackward,  // an engine callback at the end of the backward pass ends the step
    kExplicit,       // the caller ends the step with synchronize()
  };
  SyncPoint sync_point = SyncPoint::kEndOfBackward;
  enum class Reduction {
    kAllReduce,      // every rank gets the averaged gradients of every parameter
    kReduceScatter,  // ZeRO-2: every rank gets the averaged chunk it owns (see above)
  };
  Reduction reduction = Reduction::kAllReduce;
};

// What one synchronised step's communication looked like. Times in steady-clock
// microseconds (obs/clock.h).
struct BucketTiming {
  int bucket = 0;
  size_t bytes = 0;
  double launch_us = 0;  // all-reduce issued
  double done_us = 0;    // all-reduce completed (reported by the backend's future)
};

struct StepCommStats {
  double first_hook_us = 0;     // first gradient ready
  double backward_end_us = 0;   // autograd finished computing
  double sync_end_us = 0;       // every bucket done and gradients written back
  std::vector<BucketTiming> buckets;

  // Communication not hidden behind backward: from the end of backward compute to the
  // averaged gradients being in place.
  double exposed_us() const { return sync_end_us - backward_end_us; }
  // Length of the union of the buckets' [launch, done] intervals.
  double comm_busy_us() const;
  // Buckets whose all-reduce was launched before backward finished.
  int buckets_overlapped() const;
};

class DataParallel {
 public:
  // Broadcasts rank 0's parameters (and buffers) to the group, then installs the hooks.
  DataParallel(std::shared_ptr<torch::nn::Module> module, dist::Group group,
               DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  torch::nn::Module& module() { return *module_; }
  const dist::Group& group() const { return group_; }
  const DataParallelOptions& options() const { return options_; }

  // RAII scope in which backward does not synchronise (gradient accumulation).
  class NoSync {
   public:
    explicit NoSync(DataParallel& dp) : dp_(dp), previous_(dp.sync_enabled_.exchange(false)) {}
    ~NoSync() { dp_.sync_enabled_ = previous_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DataParallel& dp_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // Counts one accumulation of `param`'s gradient made outside autograd (deferred weight
  // gradients). Throws InvalidArgument for a tensor that is not one of the parameters.
  void gradient_accumulated(const at::Tensor& param);
  // SyncPoint::kExplicit only: launches the buckets still waiting (parameters that got
  // fewer contributions than expected count what they have), waits for every bucket and
  // writes the averages back. Throws CommError when synchronisation failed.
  void synchronize();

  // Statistics of the last synchronised backward.
  const StepCommStats& last_step() const { return last_; }
  // Current bucket assignment: indices into the module's parameters that require
  // gradients, in module().parameters() order (frozen parameters are skipped, and a
  // tensor that several modules register, a tied weight, is listed once, where it first
  // appears).
  const std::vector<std::vector<size_t>>& buckets() const { return assignment_; }
  // Number of synchronised backward passes so far.
  int64_t steps() const { return steps_; }
  // The bucket layout as training state: the parameter order the buckets were built from,
  // then 1 if it is the one rebuilt after the first step, else 0 (int64, parameters() + 1
  // elements). With 3 or more ranks a ring all-reduce sums an element in an order set by
  // its place in the bucket, so a run restarted at step S must build the buckets the
  // uninterrupted run had at S to give its bits; restore_bucket_state() does, before the
  // first step. A state of another parameter list (a pipeline stage cut elsewhere) is
  // ignored: the first step rebuilds, on every replica of the stage alike. Returns whether
  // it was applied; throws InvalidArgument for a state that is not an order.
  at::Tensor bucket_state() const;
  bool restore_bucket_state(const at::Tensor& state);
  // The parameters that take part (those requiring gradients, each tensor once), in
  // module order: the indices of buckets() refer to this list.
  const std::vector<at::Tensor>& parameters() const { return params_; }

  // Reduction::kReduceScatter only, after a synchronised step: this rank's chunk of
  // bucket b's averaged gradients (comm::chunk_length elements, zero padded), and whether
  // any rank had a gradient for the bucket's k-th parameter.
  const at::Tensor& gradient_shard(size_t b) const;
  bool had_gradient(size_t b, size_t k) const;
  // Bytes this object keeps between steps: the all-reduce buckets' flat buffers, or under
  // reduce-scatter the gradient shards.
  int64_t buffer_bytes() const;

  // Makes every replica's parameters (and buffers, with broadcast_buffers) rank 0's, as
  // construction does unless broadcast_parameters is off. A collective over the group.
  void broadcast_initial_state();

 private:
  struct Bucket {
    std::vector<size_t> params;
    std::vector<int64_t> offsets;  // element offset of each param in `flat`
    int64_t flags_offset = 0;      // then one element per param: 1 if it had a gradient
    at::Tensor flat;               // all-reduce: kept; reduce-scatter: only while in flight
    int64_t chunk = 0;             // reduce-scatter: gradient elements per chunk
    at::Tensor shard;              // reduce-scatter: this rank's averaged chunk
    std::vector<bool> had_grad;    // reduce-scatter: flags of the last step
    size_t pending = 0;
    bool launched = false;
    c10::intrusive_ptr<c10d::Work> work;
    std::shared_ptr<std::atomic<double>> done_us;
  };

  void install_hooks();
  void remove_hooks();
  void build_buckets(const std::vector<size_t>& order);
  void on_gradient_ready(size_t param);
  void start_step();
  void launch_ready_buckets();
  void launch(size_t bucket);
  at::Tensor pack_chunks(Bucket& bucket);
  void finalize();
  void finish_step();
  void rebuild_from_observed_order();

  std::shared_ptr<torch::nn::Module> module_;
  dist::Group group_;
  DataParallelOptions options_;
  std::vector<at::Tensor> params_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  std::unique_ptr<comm::ReduceScatter> reduce_scatter_;

  std::vector<std::vector<size_t>> assignment_;
  std::vector<size_t> order_;  // the order assignment_ was built from
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // param -> bucket
  std::vector<int> contributions_;  // param -> accumulations counted this step
  std::map<const void*, size_t> index_of_;  // parameter TensorImpl -> index
  std::vector<size_t> ready_order_;
  size_t next_launch_ = 0;
  bool in_step_ = false;
  int graph_task_ = -1;  // the backward pass the current step belongs to
  std::string failure_;  // set when synchronisation broke; every later backward throws it
  std::mutex mutex_;
  bool rebuilt_ = false;
  std::atomic<bool> sync_enabled_{true};
  int64_t steps_ = 0;
  StepCommStats current_, last_;
};

}  // namespace trireme::parallel
