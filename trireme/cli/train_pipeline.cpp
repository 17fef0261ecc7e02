// The pipeline engine of `trireme train gpt`; see cli/train_engine.h.
#include <cstdlib>
#include <optional>

#include "trireme/cli/train_engine.h"
#include "trireme/common/error.h"
#include "trireme/models/gpt.h"
#include "trireme/parallel/pipeline/executor.h"
#include "trireme/parallel/pipeline/stage.h"

namespace trireme::cli {
namespace {

// The layer costs every rank partitions by: rank 0's measurement (or parameter counts),
// broadcast so that all ranks cut the model at the same places.
std::vector<double> agreed_costs(const TrainOptions& opt, dist::World& world,
                                 const pipeline::LayerList& layers, at::Device device) {
  std::vector<double> costs;
  if (opt.pp_balance == "params") return pipeline::parameter_costs(layers);
  const int64_t micro = replica_share(opt, 0).count / opt.micro_batches;  // rank 0's
  // Under tensor parallelism a layer's forward is a collective of its tensor-parallel
  // group, so every rank measures (each group in step) and rank 0's figures are used.
  if (world.rank() == 0 || opt.tp > 1) {
    const at::Tensor sample =
        at::randint(opt.model.vocab, {micro, opt.model.seq_len}, at::TensorOptions(at::kLong).device(device));
    costs = pipeline::measured_costs(layers, sample, /*reps=*/3);
    // Test seam: TRIREME_TEST_SKEW_COSTS=1 makes a restarted generation measure its first
    // layer 100x slower, as a noisy measurement might, so that it would cut elsewhere.
    if (std::getenv("TRIREME_TEST_SKEW_COSTS") && world.info().restart_count > 0 && !costs.empty()) costs[0] *= 100;
  } else {
    costs.assign(layers.size(), 0.0);
  }
  std::vector<at::Tensor> buffer{at::tensor(costs, at::kDouble).to(device)};
  c10d::BroadcastOptions root;
  root.rootRank = 0;
  dist::run_collective("layer cost broadcast", [&] { return world.group()->broadcast(buffer, root); });
  const at::Tensor agreed = buffer[0].cpu();
  return std::vector<double>(agreed.data_ptr<double>(), agreed.data_ptr<double>() + agreed.numel());
}

class PipelineEngine final : public TrainEngine {
 public:
  PipelineEngine(const TrainOptions& opt, dist::World& world, dist::MeshGroups& groups, at::Device device,
                 bool restoring)
      : spec_{pipeline::parse_schedule(opt.schedule), opt.pp, static_cast<int>(opt.micro_batches),
              opt.chunks},
        stage_(groups.coord("pp")),
        model_config_(opt.model),
        seed_(static_cast<uint64_t>(opt.seed)),
        first_replica_(groups.coord("dp") == 0),
        tp_(tensor_parallel(groups, static_cast<uint64_t>(opt.seed), device)),
        pp_group_(groups.axis("pp")),
        slowdown_(opt, groups.rank) {
    const bool split = spec_.kind == pipeline::ScheduleKind::kZbH1;
    std::vector<pipeline::LayerRange> ranges;
    {
      // Build the whole model (so every stage starts from the one-process values, unless
      // restoring, which replaces them), keep this stage's layers, and let the rest go with
      // the model at the end of the scope.
      models::Gpt whole(opt.model, static_cast<uint64_t>(opt.seed), tp_, /*initialize=*/!restoring);
      specs_ = whole->shard_specs();
      whole->to(device);
      whole->set_split_backward(split);
      const pipeline::LayerList layers = whole->layers();
      const int parts = spec_.stages * spec_.chunks;
      const std::optional<std::string> kept =
          world.info().restart_count > 0 ? world.job_value("pp_split") : std::nullopt;
      if (!opt.pp_split.empty()) {
        ranges = pipeline::parse_split(opt.pp_split, static_cast<int>(layers.size()), parts);
      } else if (kept) {
        // A restarted generation cuts where the first did: the snapshots it resumes from
        // hold those stages (measured anew, the costs may balance another way).
        ranges = pipeline::parse_split(*kept, static_cast<int>(layers.size()), parts);
      } else {
        ranges = pipeline::balance_partition(agreed_costs(opt, world, layers, device), parts);
        if (world.rank() == 0) world.set_job_value("pp_split", pipeline::format_split(ranges));
      }
      split_text_ = pipeline::format_split(ranges);
      std::vector<pipeline::LayerRange> mine;
      for (int c = 0; c < spec_.chunks; ++c) mine.push_back(ranges[c * spec_.stages + stage_]);
      stage_module_ = std::make_shared<pipeline::StageModule>(layers, mine);
    }
    // Every stage of a replica agrees on its micro-batch size; replicas may differ.
    const ReplicaShare share = replica_share(opt, groups.coord("dp"));
    const int64_t micro = share.count / opt.micro_batches;
    executor_ = std::make_unique<pipeline::StageExecutor>(
        spec_, stage_, stage_module_->parts(),
        [tp = tp_, weight = share.loss_weight](const at::Tensor& logits, const at::Tensor& targets) {
          at::Tensor loss = tensor::vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                                 targets.reshape({-1}), tp);
          return weight == 1 ? loss : loss * weight;
        },
        pipeline::ActivationSpec{{micro, opt.model.seq_len, opt.model.dim}, at::kFloat, device}, pp_group_);
    parallel::DataParallelOptions dp_options = data_parallel_options(opt, restoring);
    dp_options.contributions_per_step = spec_.micro_batches;
    dp_options.sync_point = parallel::DataParallelOptions::SyncPoint::kExplicit;
    ddp_ = std::make_unique<parallel::DataParallel>(stage_module_, groups.axis("dp"), dp_options);
  }

  std::vector<at::Tensor> parameters() override { return stage_module_->parameters(); }
  optim::NormSharing gradient_norm_sharing() override {
    return norm_sharing(stage_module_->parameters(), stage_module_->named_model_parameters(), specs_, tp_,
                        {pp_group_});
  }

  double run_step(const std::vector<data::Batch>& micro_batches, StepTimes* times,
                  const StepTrace& trace) override {
    std::vector<pipeline::MicroBatch> inputs;
    for (const auto& b : micro_batches) inputs.push_back({b.inputs, b.targets});
    pipeline::StageCallbacks callbacks;
    callbacks.reduce_gradients = [this] { ddp_->synchronize(); };
    callbacks.weight_grad_accumulated = [this](const at::Tensor& p) { ddp_->gradient_accumulated(p); };
    if (slowdown_.factor() > 1)
      callbacks.computed = [this](const pipeline::Instruction&, double seconds) { slowdown_.after(seconds); };
    executor_->set_recording(trace.timeline != nullptr);
    const double stage_loss = executor_->run(inputs, callbacks);
    const double loss = tp_.rank == 0 ? stage_loss : 0.0;  // every tensor-parallel rank has it
    peak_live_ = std::max(peak_live_, executor_->last_run().peak_live_micro_batches);
    account(*times, trace);
    return loss;
  }

  const parallel::StepCommStats& comm() const override { return ddp_->last_step(); }
  parallel::DataParallel& data_parallel() override { return *ddp_; }

  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override {
    return stage_module_->named_model_parameters();
  }
  // (Each stage's values are those of the one-process model of the seed.)
  void initialize_parameters() override {
    models::Gpt whole(model_config_, seed_, tp_);
    std::map<std::string, at::Tensor> values;
    for (const auto& item : whole->named_parameters()) values.emplace(item.key(), item.value());
    at::NoGradGuard no_grad;
    for (auto& [name, param] : stage_module_->named_model_parameters()) param.copy_(values.at(name));
  }
  const std::map<std::string, tensor::ShardSpec>& shard_specs() const override { return specs_; }
  std::shared_ptr<tensor::RngTracker> split_rng() const override { return tp_.rng; }

  std::vector<std::pair<std::string, at::Tensor>> dump_parameters() override {
    return gather_parameters(stage_module_->named_model_parameters(), specs_, tp_,
                             first_replica_ && tp_.rank == 0);
  }

  models::GptImpl* whole_model() override { return nullptr; }

  void summarize(obs::JsonObject& out) const override {
    std::string chunks = "[";
    for (int c = 0; c < spec_.chunks; ++c)
      chunks += (c ? ", " : "") + obs::json_escape(stage_module_->describe_chunk(c));
    chunks += "]";
    out.add_raw("layers", chunks).add("peak_live_micro_batches", peak_live_);
  }

  std::string describe() const override {
    return std::string(pipeline::schedule_name(spec_.kind)) + ", " + std::to_string(spec_.micro_batches) +
           " micro-batches, layers split " + split_text_;
  }

 private:
  // Forward/backward totals for metrics.jsonl (every step) and, when traced, every
  // instruction's span (the executor keeps them only then).
  void account(StepTimes& times, const StepTrace& trace) {
    const pipeline::StageRunStats& stats = executor_->last_run();
    times.forward_us += stats.forward_us;
    times.backward_us += stats.backward_us;
    if (!trace.timeline) return;
    for (const auto& e : stats.executed) {
      const bool compute = pipeline::is_compute(e.instruction);
      if (!compute && !pipeline::is_communication(e.instruction)) continue;
      const auto [micro, chunk] = pipeline::micro_and_chunk(e.instruction);
      trace.timeline->add({pipeline::to_string(e.instruction), "pipeline",
                           compute ? obs::Lane::kCompute : obs::Lane::kComm,
                           trace.clock->wall(e.start_us), e.end_us - e.start_us,
                           obs::JsonObject().add("micro", micro).add("chunk", chunk).add("step", trace.step).str(),
                           compute ? pipeline::compact_name(e.instruction, spec_.chunks).substr(1) : ""});
    }
  }

  pipeline::ScheduleSpec spec_;
  int stage_;
  models::GptConfig model_config_;
  uint64_t seed_;
  bool first_replica_;
  tensor::TensorParallel tp_;
  std::map<std::string, tensor::ShardSpec> specs_;
  dist::Group pp_group_;
  std::string split_text_;
  EmulatedSlowdown slowdown_;
  std::shared_ptr<pipeline::StageModule> stage_module_;
  std::unique_ptr<pipeline::StageExecutor> executor_;
  std::unique_ptr<parallel::DataParallel> ddp_;
  int peak_live_ = 0;
};

}  // namespace

std::unique_ptr<TrainEngine> make_pipeline_engine(const TrainOptions& options, dist::World& world,
                                                  dist::MeshGroups& groups, at::Device device, bool restoring) {
  return std::make_unique<PipelineEngine>(options, world, groups, device, restoring);
}

}  // namespace trireme::cli
