// The data-parallel engine of `trireme train gpt`; see cli/train_engine.h.
#include <optional>

#include "trireme/cli/train_engine.h"
#include "trireme/models/gpt.h"

namespace trireme::cli {
namespace {

class DataParallelEngine final : public TrainEngine {
 public:
  DataParallelEngine(const TrainOptions& opt, dist::MeshGroups& groups, at::Device device, bool restoring)
      : tp_(tensor_parallel(groups, static_cast<uint64_t>(opt.seed), device)),
        seed_(static_cast<uint64_t>(opt.seed)),
        model_(opt.model, seed_, tp_, /*initialize=*/!restoring),
        leader_(groups.rank == 0),
        loss_weight_(replica_share(opt, groups.coord("dp")).loss_weight),
        slowdown_(opt, groups.rank) {
    model_->to(device);
    ddp_ = std::make_unique<parallel::DataParallel>(model_.ptr(), groups.axis("dp"),
                                                    data_parallel_options(opt, restoring));
  }

  std::vector<at::Tensor> parameters() override { return model_->parameters(); }
  optim::NormSharing gradient_norm_sharing() override {
    return norm_sharing(model_->parameters(), named_parameters(), model_->shard_specs(), tp_, {});
  }

  double run_step(const std::vector<data::Batch>& micro_batches, StepTimes* times,
                  const StepTrace& trace) override {
    at::Tensor local_loss = at::zeros({1}, at::TensorOptions(at::kDouble).device(micro_batches[0].inputs.device()));
    const size_t m = micro_batches.size();
    for (size_t k = 0; k < m; ++k) {
      std::optional<parallel::DataParallel::NoSync> no_sync;
      if (k + 1 < m) no_sync.emplace(*ddp_);
      // An emulated slower device is slowed by the compute this thread did (CPU time), not
      // by its waits: backward ends waiting for the gradient all-reduce, whose length is set
      // by the other replicas.
      const double f0 = obs::now_us();
      const double c0 = obs::thread_cpu_us();
      at::Tensor loss = model_->loss(micro_batches[k].inputs, micro_batches[k].targets) / static_cast<double>(m);
      if (loss_weight_ != 1) loss = loss * loss_weight_;  // unequal replica batches
      slowdown_.after((obs::thread_cpu_us() - c0) * 1e-6);
      // Backward's share is slept before it, by the last backward's measure: the gradient
      // all-reduce then starts as late as a slower device would start it (slept after, it
      // would follow the wait for the other replicas instead of overlapping it).
      const double f2 = obs::now_us();
      const bool ahead = last_backward_cpu_s_ >= 0;
      if (ahead) slowdown_.after(last_backward_cpu_s_);
      const double c2 = obs::thread_cpu_us();
      loss.backward();
      last_backward_cpu_s_ = (obs::thread_cpu_us() - c2) * 1e-6;
      if (!ahead) slowdown_.after(last_backward_cpu_s_);
      const double b1 = obs::now_us();
      local_loss += loss.detach().to(at::kDouble);
      times->forward_us += f2 - f0;  // both with any emulated slowdown
      times->backward_us += b1 - f2;
      if (trace.timeline) {
        trace.timeline->add({"forward", "compute", obs::Lane::kCompute, trace.clock->wall(f0), f2 - f0, "", ""});
        trace.timeline->add({"backward", "compute", obs::Lane::kCompute, trace.clock->wall(f2), b1 - f2, "", ""});
      }
    }
    return tp_.rank == 0 ? local_loss.item<double>() : 0.0;
  }

  const parallel::StepCommStats& comm() const override { return ddp_->last_step(); }
  parallel::DataParallel& data_parallel() override { return *ddp_; }

  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override {
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const auto& item : model_->named_parameters()) named.emplace_back(item.key(), item.value());
    return named;
  }
  void initialize_parameters() override { model_->init_parameters(seed_); }
  const std::map<std::string, tensor::ShardSpec>& shard_specs() const override { return model_->shard_specs(); }
  std::shared_ptr<tensor::RngTracker> split_rng() const override { return tp_.rng; }

  std::vector<std::pair<std::string, at::Tensor>> dump_parameters() override {
    return gather_parameters(named_parameters(), model_->shard_specs(), tp_, leader_);
  }

  // (The sample needs every tensor-parallel rank; it is drawn only from a whole model.)
  models::GptImpl* whole_model() override { return tp_.active() ? nullptr : model_.get(); }
  void summarize(obs::JsonObject&) const override {}
  std::string describe() const override {
    return tp_.active() ? "heads, MLP and vocabulary split " + std::to_string(tp_.size) + " ways"
                        : "whole model on every rank";
  }

 private:
  tensor::TensorParallel tp_;
  uint64_t seed_;
  models::Gpt model_;
  bool leader_;
  double loss_weight_;
  EmulatedSlowdown slowdown_;
  double last_backward_cpu_s_ = -1;  // CPU time of the last micro-batch's backward
  std::unique_ptr<parallel::DataParallel> ddp_;
};

}  // namespace

parallel::DataParallelOptions data_parallel_options(const TrainOptions& options, bool restoring) {
  parallel::DataParallelOptions dp;
  dp.broadcast_parameters = !restoring;
  dp.buckets.cap_bytes = static_cast<size_t>(options.bucket_mb * (1 << 20));
  dp.buckets.first_cap_bytes = static_cast<size_t>(options.first_bucket_mb * (1 << 20));
  if (options.zero == 2) dp.reduction = parallel::DataParallelOptions::Reduction::kReduceScatter;
  // ZeRO's shards follow the buckets, so they must not be rebuilt after the first step.
  if (options.zero > 0) dp.rebuild_buckets = false;
  return dp;
}

std::unique_ptr<TrainEngine> make_data_parallel_engine(const TrainOptions& options, dist::MeshGroups& groups,
                                                       at::Device device, bool restoring) {
  return std::make_unique<DataParallelEngine>(options, groups, device, restoring);
}

}  // namespace trireme::cli
