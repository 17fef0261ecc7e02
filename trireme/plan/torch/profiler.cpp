// Timing layers, optimizer steps, links and a matmul for `trireme profile`; see profiler.h.
#include "trireme/plan/torch/profiler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>

#include "trireme/common/error.h"
#include "trireme/models/gpt.h"
#include "trireme/obs/clock.h"
#include "trireme/obs/memory.h"
#include "trireme/parallel/pipeline/deferred_linear.h"

namespace trireme::plan {
namespace {

// The trainer's AdamW (cli/train_options.h defaults: --lr 3e-3, --weight-decay 0.1, and
// train_worker.cpp's betas): the step costs the same whatever the values, but weight decay
// on or off changes its work.
torch::optim::AdamWOptions trainer_adamw_options() {
  return torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).weight_decay(0.1);
}

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
    const int64_t before = obs::CpuMemory::current_bytes();
    const at::Tensor kept = forward(output);
    *activation = obs::CpuMemory::current_bytes() - before;
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

double time_optimizer(const std::vector<at::Tensor>& params, int repeats) {
  for (const auto& p : params)
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
  torch::optim::AdamW adamw(params, trainer_adamw_options());
  std::vector<double> times;
  for (int r = 0; r <= repeats; ++r) {  // step 0 allocates the moments
    const double start = obs::now_us();
    adamw.step();
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

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

std::vector<LayerProfile> measure_layers(const LayerMeasureOptions& options) {
  options.model.validate();
  check_micro_batches(options.micro_batches);
  TRIREME_CHECK(options.repeats >= 1, "profiling needs at least one repeat, got ", options.repeats);
  obs::CpuMemory::install();

  models::Gpt model(options.model, options.seed);
  model->train();
  model->set_split_backward(true);
  const pipeline::LayerList layers = model->layers();
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
  std::vector<LayerProfile> profiles(n);
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
      LayerRunner runner{layers[l], kind, *model, inputs[l], targets, output_grad, {}, {}};
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
    for (size_t l = 0; l < n; ++l) profiles[l].timings.push_back(cells[l].timing(micro_batch));
  }

  for (size_t l = 0; l < n; ++l) {
    LayerProfile& profile = profiles[l];
    profile.name = layers[l].name;
    const std::vector<at::Tensor> params = layer_parameters(layers[l]);
    for (const auto& p : params) profile.parameters += p.numel();
    call(options.in_step);
    profile.optimizer_s = time_optimizer(params, options.repeats);
    for (const auto& p : params) p.mutable_grad() = at::Tensor();
    if (options.on_layer) options.on_layer(profile);
  }
  return profiles;
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
  m.link = fit_link(m.bytes, m.seconds);
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
