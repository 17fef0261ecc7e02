// Timing layers (whole and tensor-parallel), optimizer phases, links, the overlap of
// communication with compute and a matmul for `trireme profile`; see profiler.h.
#include "trireme/plan/torch/profiler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>

#include "trireme/common/error.h"
#include "trireme/dist/backend.h"
#include "trireme/models/gpt.h"
#include "trireme/obs/clock.h"
#include "trireme/obs/memory.h"
#include "trireme/optim/clip.h"
#include "trireme/parallel/data/data_parallel.h"
#include "trireme/parallel/pipeline/executor.h"
#include "trireme/parallel/pipeline/partition.h"
#include "trireme/parallel/pipeline/stage.h"
#include "trireme/parallel/pipeline/deferred_linear.h"

namespace trireme::plan {
namespace {

// The trainer's AdamW (cli/train_options.h defaults: --lr 3e-3, --weight-decay 0.1, and
// train_worker.cpp's betas): the step costs the same whatever the values, but weight decay
// on or off changes its work.
torch::optim::AdamWOptions trainer_adamw_options() {
  return torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).weight_decay(0.1);
}

// The trainer's gradient clip (--clip's default, cli/train_options.h).
constexpr double kMaxGradNorm = 1.0;

// Messages below this size are timed several to a batch (up to kMaxBatched, as many as
// fit in it): they are quick, and more samples steady the median of their noisy times.
constexpr int64_t kBatchedBelowBytes = 1024 * 1024;
constexpr int kMaxBatched = 32;

int operations_per_batch(int64_t bytes) {
  return static_cast<int>(std::clamp<int64_t>(kBatchedBelowBytes / std::max<int64_t>(bytes, 1), 1,
                                              kMaxBatched));
}

void call(const std::function<void()>& f) {
  if (f) f();
}

double seconds_since(double start_us) { return (obs::now_us() - start_us) / 1e6; }

// What one layer is in the measurement: its place decides its input and its backward.
enum class LayerKind { kEmbeddings, kBlock, kHead };

// Runs of one layer at one micro-batch size.
struct LayerRunner {
  const pipeline::Layer& layer;
  LayerKind kind;
  const models::GptImpl& model;
  at::Tensor input;         // token ids (embeddings) or the previous layer's output
  at::Tensor targets;       // (b,T) for the head's loss
  at::Tensor output_grad;   // the gradient fed to backward (not for the head)
  pipeline::WeightGradQueue queue;
  at::Tensor root;          // between the forward and the backward of a timed run

  // The layer's forward from a fresh leaf of `input` (a view: it allocates no storage).
  // Returns what backward starts from: the output, or the head's loss.
  at::Tensor forward(int64_t* output_bytes = nullptr) const {
    const at::Tensor leaf = input.is_floating_point() ? input.detach().requires_grad_(true) : input;
    const at::Tensor out = layer.forward(leaf);
    if (output_bytes) *output_bytes = static_cast<int64_t>(out.nbytes());
    return kind == LayerKind::kHead ? model.loss_of_logits(out, targets) : out;
  }

  // The three timed parts: B needs F's root, W the queue B filled.
  double time_forward() {
    const double start = obs::now_us();
    root = forward();
    return seconds_since(start);
  }
  double time_backward() {
    const double start = obs::now_us();
    {
      pipeline::DeferWeightGrads defer(queue);
      if (kind == LayerKind::kHead)
        root.backward();
      else
        root.backward(output_grad);
    }
    root = at::Tensor();
    return seconds_since(start);
  }
  double time_weight() {
    const double start = obs::now_us();
    queue.run_all();
    return seconds_since(start);
  }

  // Bytes the forward leaves alive while only its root is kept (then freed, unused).
  void measure_memory(int64_t* activation, int64_t* output) const {
    const bool settle = model.tensor_parallel().active();
    const int64_t before = settle ? settled_bytes() : obs::CpuMemory::current_bytes();
    const at::Tensor kept = forward(output);
    *activation = (settle ? settled_bytes() : obs::CpuMemory::current_bytes()) - before;
  }

  // The live bytes once the communication backend's threads are done with finished
  // collectives: a c10d work (its future holds the collective's tensors) is released by
  // the worker thread a moment after the caller's wait returns, so a tensor the forward
  // dropped can still be live when it returns, or one from before be freed during it.
  // Reads until two readings a millisecond apart agree (at most kSettleReadings).
  static int64_t settled_bytes() {
    constexpr int kSettleReadings = 50;
    int64_t bytes = obs::CpuMemory::current_bytes();
    for (int i = 0; i < kSettleReadings; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const int64_t again = obs::CpuMemory::current_bytes();
      if (again == bytes) break;
      bytes = again;
    }
    return bytes;
  }
};

// One layer at one micro-batch size: its runner and its samples.
struct Cell {
  LayerRunner runner;
  std::vector<double> f, b, w;

  LayerTiming timing(int64_t micro_batch) const {
    LayerTiming t;
    t.micro_batch = micro_batch;
    t.forward_s = median(f);
    t.backward_input_s = median(b);
    // The embeddings defer nothing: their whole backward is B (see profiler.h).
    t.backward_weight_s = runner.kind == LayerKind::kEmbeddings ? 0.0 : median(w);
    runner.measure_memory(&t.activation_bytes, &t.output_bytes);
    return t;
  }
};

std::vector<at::Tensor> layer_parameters(const pipeline::Layer& layer) {
  std::vector<at::Tensor> params;
  for (const auto& [name, module] : layer.modules)
    for (const auto& p : module->parameters(/*recurse=*/true)) params.push_back(p);
  return params;
}

// The optimizer phase (see profiler.h): clip, step, zero_grad, on fresh random gradients.
double time_optimizer(const std::vector<at::Tensor>& params, int repeats, at::Generator& generator) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) grads.push_back(at::randn(p.sizes(), generator, p.options()));
  torch::optim::AdamW adamw(params, trainer_adamw_options());
  std::vector<double> times;
  for (int r = 0; r <= repeats; ++r) {  // round 0 allocates the moments
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i].clone();
    const double start = obs::now_us();
    optim::clip_grad_norm(params, kMaxGradNorm);
    adamw.step();
    adamw.zero_grad();
    if (r > 0) times.push_back(seconds_since(start));
  }
  return median(times);
}

void check_micro_batches(const std::vector<int64_t>& sizes) {
  TRIREME_CHECK(!sizes.empty(), "profiling needs at least one micro-batch size");
  for (size_t i = 0; i < sizes.size(); ++i) {
    TRIREME_CHECK(sizes[i] >= 1, "micro-batch sizes must be positive, got ", sizes[i]);
    TRIREME_CHECK(i == 0 || sizes[i] > sizes[i - 1], "micro-batch sizes must ascend, got ",
                  sizes[i - 1], " before ", sizes[i]);
  }
}

}  // namespace

namespace {

void check_layer_options(const LayerMeasureOptions& options) {
  options.model.validate();
  check_micro_batches(options.micro_batches);
  TRIREME_CHECK(options.repeats >= 1, "profiling needs at least one repeat, got ", options.repeats);
}

// The rounds of profiler.h over `layers` (of `model`): per layer, its rows, ascending b.
// Every rank of a tensor-parallel model runs the same operations in the same order.
std::vector<std::vector<LayerTiming>> time_layers(const models::GptImpl& model,
                                                  const pipeline::LayerList& layers,
                                                  const LayerMeasureOptions& options) {
  const int64_t T = options.model.seq_len;
  const size_t n = layers.size();
  at::Generator generator = at::detail::createCPUGenerator(options.seed);

  // Rounds: a round is one training step of the whole model at one b, split into its
  // parts: F of every layer in order, B of every layer in reverse, then W of every layer,
  // each part timed on its own. So a layer's caches are as cold or warm as in training, and
  // a burst of interference from other processes spoils one sample of many figures (which
  // their medians drop) rather than every sample of one. The rounds of one b run back to
  // back after a warm-up round, as training repeats one micro-batch size: alternating sizes
  // would keep the memory allocator growing and trimming its heap (page faults training
  // does not have).
  std::vector<std::vector<LayerTiming>> rows(n);
  const double start_us = obs::now_us();
  int rounds_done = 0;
  const int rounds = static_cast<int>(options.micro_batches.size()) * (options.repeats + 1);
  for (const int64_t micro_batch : options.micro_batches) {
    // Random token ids and targets; each layer's input is the previous layers' output.
    const at::Tensor idx = at::randint(options.model.vocab, {micro_batch, T}, generator, at::kLong);
    const at::Tensor targets = at::randint(options.model.vocab, {micro_batch, T}, generator, at::kLong);
    std::vector<at::Tensor> inputs{idx};  // inputs[l]: layer l's input; inputs[n]: the logits
    {
      at::NoGradGuard no_grad;
      for (const auto& layer : layers) inputs.push_back(layer.forward(inputs.back()));
    }
    std::vector<Cell> cells;
    for (size_t l = 0; l < n; ++l) {
      const LayerKind kind = l == 0      ? LayerKind::kEmbeddings
                             : l + 1 == n ? LayerKind::kHead
                                          : LayerKind::kBlock;
      at::Tensor output_grad;  // a fixed random gradient of the output's size and scale
      if (kind != LayerKind::kHead)
        output_grad = at::randn(inputs[l + 1].sizes(), generator, inputs[l + 1].options()) /
                      std::sqrt(static_cast<double>(inputs[l + 1].numel()));
      LayerRunner runner{layers[l], kind, model, inputs[l], targets, output_grad, {}, {}};
      cells.push_back(Cell{std::move(runner), {}, {}, {}});
    }

    for (int round = 0; round <= options.repeats; ++round) {  // round 0 warms up
      call(options.in_step);
      std::vector<double> f(n), b(n), w(n);
      for (size_t l = 0; l < n; ++l) f[l] = cells[l].runner.time_forward();
      for (size_t l = n; l-- > 0;) b[l] = cells[l].runner.time_backward();
      for (size_t l = n; l-- > 0;) w[l] = cells[l].runner.time_weight();
      if (options.on_round) options.on_round(++rounds_done, rounds, seconds_since(start_us));
      if (round == 0) continue;
      for (size_t l = 0; l < n; ++l) {
        cells[l].f.push_back(f[l]);
        cells[l].b.push_back(b[l]);
        cells[l].w.push_back(w[l]);
      }
    }
    for (size_t l = 0; l < n; ++l) rows[l].push_back(cells[l].timing(micro_batch));
  }
  return rows;
}

}  // namespace

std::vector<LayerProfile> measure_layers(const LayerMeasureOptions& options) {
  check_layer_options(options);
  obs::CpuMemory::install();

  models::Gpt model(options.model, options.seed);
  model->train();
  model->set_split_backward(true);
  const pipeline::LayerList layers = model->layers();
  std::vector<std::vector<LayerTiming>> rows = time_layers(*model, layers, options);

  std::vector<LayerProfile> profiles(layers.size());
  at::Generator generator = at::detail::createCPUGenerator(options.seed + 1);
  for (size_t l = 0; l < layers.size(); ++l) {
    LayerProfile& profile = profiles[l];
    profile.name = layers[l].name;
    profile.timings = std::move(rows[l]);
    const std::vector<at::Tensor> params = layer_parameters(layers[l]);
    for (const auto& p : params) profile.parameters += p.numel();
    call(options.in_step);
    profile.optimizer_s = time_optimizer(params, options.repeats, generator);
    if (options.on_layer) options.on_layer(profile);
  }
  return profiles;
}

namespace {

// For each micro-batch size of `options`: random tokens and targets from `generator`, then
// after a warm-up `repeats` timed calls of `step` (in_step before each); the medians.
std::vector<std::pair<int64_t, double>> time_steps(
    const LayerMeasureOptions& options, at::Generator& generator,
    const std::function<void(const at::Tensor& idx, const at::Tensor& targets)>& step) {
  std::vector<std::pair<int64_t, double>> rows;
  for (const int64_t micro_batch : options.micro_batches) {
    const at::Tensor idx = at::randint(options.model.vocab, {micro_batch, options.model.seq_len}, generator, at::kLong);
    const at::Tensor targets = at::randint(options.model.vocab, {micro_batch, options.model.seq_len}, generator, at::kLong);
    std::vector<double> samples;
    for (int round = 0; round <= options.repeats; ++round) {  // round 0 warms up
      call(options.in_step);
      const double start_us = obs::now_us();
      step(idx, targets);
      if (round > 0) samples.push_back(seconds_since(start_us));
    }
    rows.emplace_back(micro_batch, median(samples));
  }
  return rows;
}

}  // namespace

std::vector<WholeModelTiming> measure_whole_model(const LayerMeasureOptions& options) {
  check_layer_options(options);
  models::Gpt model(options.model, options.seed);
  model->train();
  at::Generator generator = at::detail::createCPUGenerator(options.seed + 2);
  std::vector<WholeModelTiming> rows;
  for (const auto& [micro_batch, seconds] : time_steps(options, generator, [&](const at::Tensor& idx, const at::Tensor& targets) {
         model->loss(idx, targets).backward();
         model->zero_grad();  // (timed too: a negligible share)
       }))
    rows.push_back({micro_batch, seconds});
  return rows;
}

std::vector<TrainingStepTiming> measure_training_step(const LayerMeasureOptions& options,
                                                      const dist::Group& group) {
  check_layer_options(options);
  models::Gpt model(options.model, options.seed);
  model->train();
  parallel::DataParallel ddp(model.ptr(), group, parallel::DataParallelOptions{});
  torch::optim::AdamW adamw(model->parameters(), trainer_adamw_options());
  at::Generator generator = at::detail::createCPUGenerator(options.seed + 3);
  std::vector<TrainingStepTiming> rows;
  for (const auto& [micro_batch, seconds] : time_steps(options, generator, [&](const at::Tensor& idx, const at::Tensor& targets) {
         at::Tensor loss = model->loss(idx, targets);
         loss.backward();
         optim::clip_grad_norm(model->parameters(), 1.0);
         adamw.step();
         adamw.zero_grad();
         std::vector<at::Tensor> closing{at::tensor({loss.item<double>(), 0.0}, at::TensorOptions(at::kDouble))};
         dist::run_collective("profile step all-reduce", [&] { return group->allreduce(closing); });
       }))
    rows.push_back({micro_batch, seconds, static_cast<int>(group->getSize())});
  return rows;
}

std::vector<PipelineStepTiming> measure_pipeline_step(const LayerMeasureOptions& options,
                                                      const dist::Group& group, int micro_batches) {
  check_layer_options(options);
  TRIREME_CHECK(micro_batches >= 1, "a pipeline step needs at least one micro-batch");
  const int stages = static_cast<int>(group->getSize());
  const int stage = static_cast<int>(group->getRank());
  models::Gpt whole(options.model, options.seed);
  whole->train();
  const pipeline::LayerList layers = whole->layers();
  TRIREME_CHECK(static_cast<int>(layers.size()) >= stages, "a pipeline of ", stages, " stages needs as many layers");
  const std::vector<pipeline::LayerRange> split =
      pipeline::balance_partition(std::vector<double>(layers.size(), 1.0), stages);
  auto module = std::make_shared<pipeline::StageModule>(layers, std::vector<pipeline::LayerRange>{split[stage]});
  torch::optim::AdamW adamw(module->parameters(), trainer_adamw_options());
  const optim::NormSharing sharing{{group}, {}};
  const pipeline::ScheduleSpec spec{pipeline::ScheduleKind::kOneFOneB, stages, micro_batches, 1};
  const tensor::TensorParallel no_tp;
  at::Generator generator = at::detail::createCPUGenerator(options.seed + 4);
  std::vector<PipelineStepTiming> rows;
  for (const int64_t micro_batch : options.micro_batches) {
    pipeline::StageExecutor executor(
        spec, stage, module->parts(),
        [&](const at::Tensor& logits, const at::Tensor& targets) {
          return tensor::vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}),
                                                      no_tp);
        },
        pipeline::ActivationSpec{{micro_batch, options.model.seq_len, options.model.dim}, at::kFloat, at::kCPU},
        group);
    std::vector<pipeline::MicroBatch> inputs;
    for (int k = 0; k < micro_batches; ++k)
      inputs.push_back({at::randint(options.model.vocab, {micro_batch, options.model.seq_len}, generator, at::kLong),
                        at::randint(options.model.vocab, {micro_batch, options.model.seq_len}, generator, at::kLong)});
    std::vector<double> samples;
    for (int round = 0; round <= options.repeats; ++round) {  // round 0 warms up
      call(options.in_step);
      const double start_us = obs::now_us();
      const double loss = executor.run(inputs);
      optim::clip_grad_norm(module->parameters(), 1.0, sharing);
      adamw.step();
      adamw.zero_grad();
      std::vector<at::Tensor> closing{at::tensor({loss, 0.0}, at::TensorOptions(at::kDouble))};
      dist::run_collective("profile step all-reduce", [&] { return group->allreduce(closing); });
      if (round > 0) samples.push_back(seconds_since(start_us));
    }
    rows.push_back({micro_batch, micro_batches, stages, pipeline::format_split(split), median(samples)});
  }
  return rows;
}

std::vector<TensorParallelTimings> measure_tensor_parallel_layers(const LayerMeasureOptions& options,
                                                                  const tensor::TensorParallel& tp) {
  check_layer_options(options);
  TRIREME_CHECK(tp.active() && tp.group, "measuring tensor-parallel layers needs a group of at least 2 ranks");
  obs::CpuMemory::install();

  models::Gpt model(options.model, options.seed, tp);  // throws for heads or vocab not divisible
  model->train();
  model->set_split_backward(true);
  const pipeline::LayerList layers = model->layers();
  std::vector<TensorParallelTimings> out;
  for (auto& rows : time_layers(*model, layers, options)) out.push_back({tp.size, std::move(rows)});
  return out;
}

std::vector<int64_t> message_sizes() {
  std::vector<int64_t> sizes;
  for (int64_t n = 4; n <= 16 * 1024 * 1024; n *= 4) sizes.push_back(n);
  return sizes;
}

namespace {

// Times `operation` (issued and waited for) one by one, in `repeats` batches of
// `per_batch` back to back, each batch after a barrier of `group`, after one warm-up
// batch. Returns the median over every timed operation: a stall of the machine spoils the
// operations it hits, not a whole batch's average.
double time_operation(const dist::Group& group, int repeats, int per_batch,
                      const std::function<void()>& operation) {
  std::vector<double> times;
  for (int r = 0; r <= repeats; ++r) {
    dist::run_collective("profile barrier", [&] { return group->barrier(); });
    for (int i = 0; i < per_batch; ++i) {
      const double start = obs::now_us();
      operation();
      if (r > 0) times.push_back(seconds_since(start));
    }
  }
  return median(times);
}

void check_link_sizes(const dist::Group& group, const std::vector<int64_t>& sizes, int repeats,
                      int min_world) {
  TRIREME_CHECK(group->getSize() >= min_world, "measuring a link needs ", min_world,
                " ranks, the group has ", group->getSize());
  TRIREME_CHECK(sizes.size() >= 2, "a link fit needs at least two message sizes");
  TRIREME_CHECK(repeats >= 1, "profiling needs at least one repeat, got ", repeats);
  for (const int64_t n : sizes)
    TRIREME_CHECK(n >= 4 && n % 4 == 0, "message sizes are whole fp32 elements, got ", n, " bytes");
}

}  // namespace

LinkMeasurement measure_p2p(const dist::Group& group, const std::vector<int64_t>& sizes,
                            int repeats) {
  check_link_sizes(group, sizes, repeats, 2);
  const int rank = group->getRank();
  constexpr int kTag = 0;
  LinkMeasurement m;
  for (const int64_t n : sizes) {
    std::vector<at::Tensor> buffer{at::zeros({n / 4}, at::kFloat)};
    // One round trip: 0 -> 1 -> 0.
    const auto round_trip = [&] {
      if (rank == 0) {
        dist::run_collective("profile send", [&] { return group->send(buffer, 1, kTag); });
        dist::run_collective("profile receive", [&] { return group->recv(buffer, 1, kTag); });
      } else if (rank == 1) {
        dist::run_collective("profile receive", [&] { return group->recv(buffer, 0, kTag); });
        dist::run_collective("profile send", [&] { return group->send(buffer, 0, kTag); });
      }
    };
    m.bytes.push_back(static_cast<double>(n));
    m.seconds.push_back(time_operation(group, repeats, operations_per_batch(n), round_trip) / 2);
  }
  // The other ranks timed nothing: times flat in the size, which no link fits.
  if (rank <= 1) m.link = fit_link(m.bytes, m.seconds);
  return m;
}

LinkMeasurement measure_allreduce(const dist::Group& group, const std::vector<int64_t>& sizes,
                                  int repeats) {
  check_link_sizes(group, sizes, repeats, 2);
  const double w = group->getSize();
  LinkMeasurement m;
  std::vector<double> bus_bytes;
  for (const int64_t n : sizes) {
    std::vector<at::Tensor> buffer{at::zeros({n / 4}, at::kFloat)};
    const auto allreduce = [&] {
      dist::run_collective("profile all-reduce", [&] { return group->allreduce(buffer); });
    };
    m.bytes.push_back(static_cast<double>(n));
    bus_bytes.push_back(2 * (w - 1) / w * static_cast<double>(n));
    m.seconds.push_back(time_operation(group, repeats, operations_per_batch(n), allreduce));
  }
  m.link = fit_link(bus_bytes, m.seconds);
  return m;
}

Link fit_link(const std::vector<double>& bytes, const std::vector<double>& seconds) {
  TRIREME_CHECK(bytes.size() == seconds.size() && bytes.size() >= 2,
                "a link fit needs the time of at least two message sizes");
  // Minimise sum_i (a + b x_i - t_i)^2 / t_i: weighted least squares, weights 1/t_i.
  double s = 0, sx = 0, sxx = 0, st = 0, sxt = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    TRIREME_CHECK(seconds[i] > 0 && bytes[i] >= 0, "a link fit needs positive times, got ",
                  seconds[i], " s for ", bytes[i], " bytes");
    const double weight = 1 / seconds[i];
    s += weight;
    sx += weight * bytes[i];
    sxx += weight * bytes[i] * bytes[i];
    st += weight * seconds[i];
    sxt += weight * bytes[i] * seconds[i];
  }
  const double det = s * sxx - sx * sx;
  TRIREME_CHECK(det > 0, "a link fit needs at least two different message sizes");
  double slope = (s * sxt - sx * st) / det;
  double latency = (st - slope * sx) / s;
  if (latency < 0) {  // through the origin instead
    latency = 0;
    slope = sxt / sxx;
  }
  TRIREME_CHECK(slope > 0, "measured times do not grow with message size; the link cannot be fitted");
  return Link{latency, 1 / slope};
}

namespace {

// The overlap measurement's sizes (profiler.h): all-reduces of a gradient bucket's size,
// a compute job long enough that timer and barrier jitter (tens of microseconds) and a
// Gloo thread's wake-up are small beside it, and all-reduces taking about half of it, so
// that they can hide entirely.
constexpr int64_t kOverlapAllreduceBytes = 4 * 1024 * 1024;
constexpr double kOverlapMinComputeS = 0.040;
constexpr double kOverlapCommunicationShare = 0.5;
constexpr int kOverlapCalibrationRuns = 3;

void barrier(const dist::Group& group) {
  dist::run_collective("profile barrier", [&] { return group->barrier(); });
}

// The largest of each rank's values: what every rank decides from, so that they agree.
std::vector<double> max_over_ranks(const dist::Group& group, const std::vector<double>& values) {
  const at::Tensor t = dist::all_reduce(group, at::tensor(values, at::kDouble), c10d::ReduceOp::MAX, at::kCPU,
                                        "profile calibration all-reduce");
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

}  // namespace

double overlap_share(double compute_s, double communication_s, double both_s) {
  if (communication_s <= 0) return 0;
  return std::clamp(1 - (both_s - compute_s) / communication_s, 0.0, 1.0);
}

OverlapMeasurement measure_overlap(const dist::Group& group, const std::function<void()>& compute,
                                   int repeats) {
  TRIREME_CHECK(group && group->getSize() >= 2, "measuring overlap needs a group of at least 2 ranks");
  TRIREME_CHECK(repeats >= 1, "profiling needs at least one repeat, got ", repeats);
  TRIREME_CHECK(static_cast<bool>(compute), "measuring overlap needs a compute job");
  OverlapMeasurement m;
  m.allreduce_bytes = kOverlapAllreduceBytes;
  std::vector<at::Tensor> buckets;  // one tensor per all-reduce, so none waits on another's buffer

  // Issues `count` all-reduces; returns their work handles.
  const auto issue = [&](size_t count) {
    while (buckets.size() < count) buckets.push_back(at::zeros({kOverlapAllreduceBytes / 4}, at::kFloat));
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (size_t i = 0; i < count; ++i) {
      std::vector<at::Tensor> buffer{buckets[i]};
      try {
        works.push_back(group->allreduce(buffer));
      } catch (const std::exception& e) {
        TRIREME_THROW(CommError, "profile overlap all-reduce: ", dist::error_text(e));
      }
    }
    return works;
  };
  const auto wait_all = [](const std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
    for (const auto& work : works) dist::wait_work(work, "profile overlap all-reduce");
  };

  // Calibration: one job and one all-reduce, each the fastest of a few after a warm-up.
  double job_s = 1e30, allreduce_s = 1e30;
  for (int r = 0; r <= kOverlapCalibrationRuns; ++r) {
    barrier(group);
    double start = obs::now_us();
    compute();
    if (r > 0) job_s = std::min(job_s, seconds_since(start));
    barrier(group);
    start = obs::now_us();
    wait_all(issue(1));
    if (r > 0) allreduce_s = std::min(allreduce_s, seconds_since(start));
  }
  const std::vector<double> agreed = max_over_ranks(group, {job_s, allreduce_s});
  job_s = std::max(agreed[0], 1e-6);
  allreduce_s = std::max(agreed[1], 1e-6);
  m.compute_runs = static_cast<int>(
      std::ceil(std::max(kOverlapMinComputeS, 2 * allreduce_s) / job_s));
  m.allreduces = std::max(
      1, static_cast<int>(std::lround(kOverlapCommunicationShare * m.compute_runs * job_s / allreduce_s)));
  const auto job = [&] {
    for (int k = 0; k < m.compute_runs; ++k) compute();
  };

  std::vector<double> alone, communication, both;
  for (int r = 0; r <= repeats; ++r) {  // round 0 warms up
    barrier(group);
    double start = obs::now_us();
    job();
    const double c = seconds_since(start);
    barrier(group);
    start = obs::now_us();
    wait_all(issue(m.allreduces));
    const double a = seconds_since(start);
    barrier(group);
    start = obs::now_us();
    const auto works = issue(m.allreduces);
    job();
    wait_all(works);
    const double ab = seconds_since(start);
    if (r == 0) continue;
    alone.push_back(c);
    communication.push_back(a);
    both.push_back(ab);
  }
  m.compute_s = median(alone);
  m.communication_s = median(communication);
  m.both_s = median(both);
  m.overlap = overlap_share(m.compute_s, m.communication_s, m.both_s);
  return m;
}

std::function<void()> block_step_job(const models::GptConfig& model, int64_t micro_batch, uint64_t seed) {
  models::GptConfig one = model;
  one.layers = 1;
  models::Gpt gpt(one, seed);
  gpt->train();
  at::Generator generator = at::detail::createCPUGenerator(seed);
  const auto shape = std::vector<int64_t>{micro_batch, model.seq_len, model.dim};  // (b,T,C)
  const at::Tensor input = at::randn(shape, generator, at::kFloat);
  const at::Tensor output_grad =
      at::randn(shape, generator, at::kFloat) / std::sqrt(static_cast<double>(input.numel()));
  const std::shared_ptr<models::BlockImpl> block = gpt->h->ptr<models::BlockImpl>(0);
  return [block, input, output_grad] {
    block->forward(input.detach().requires_grad_(true)).backward(output_grad);
  };
}

double measure_matmul_tflops(int repeats, const std::function<void()>& in_step) {
  TRIREME_CHECK(repeats >= 1, "profiling needs at least one repeat, got ", repeats);
  constexpr int64_t kN = 512;
  at::Generator generator = at::detail::createCPUGenerator(7);
  const at::Tensor a = at::randn({kN, kN}, generator, at::kFloat);
  const at::Tensor b = at::randn({kN, kN}, generator, at::kFloat);
  at::Tensor c = at::empty({kN, kN}, at::kFloat);
  call(in_step);
  std::vector<double> times;
  for (int r = 0; r <= repeats; ++r) {
    const double start = obs::now_us();
    at::mm_out(c, a, b);
    if (r > 0) times.push_back(seconds_since(start));
  }
  const double flops = 2.0 * kN * kN * kN;
  return flops / median(times) / 1e12;
}

}  // namespace trireme::plan
