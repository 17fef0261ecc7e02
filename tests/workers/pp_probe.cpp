// Launched by tests/integration/test_pp_parity.py: trains the reference GPT for a few steps
// with pipeline (and data) parallelism through StageExecutor, and writes, per stage, the
// final parameters of its layers and the per-step losses, for comparison with one process.
//   pp_probe PP DP SCHEDULE MICRO_BATCHES CHUNKS OUT_PREFIX
// Layers of the GPT as a list: 0 = embeddings, 1..L = blocks, L+1 = final norm and head.
#include <torch/optim/adamw.h>

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <set>

#include "trireme/data/batch.h"
#include "trireme/data/corpus.h"
#include "trireme/data/sampler.h"
#include "trireme/dist/world.h"
#include "trireme/models/gpt.h"
#include "trireme/obs/param_dump.h"
#include "trireme/parallel/pipeline/deferred_linear.h"
#include "trireme/parallel/pipeline/executor.h"
#include "trireme/parallel/pipeline/partition.h"

using namespace trireme;

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: pp_probe PP DP SCHEDULE MICRO_BATCHES CHUNKS OUT_PREFIX\n");
    return 2;
  }
  const int pp = std::atoi(argv[1]), dp = std::atoi(argv[2]);
  const pipeline::ScheduleSpec spec{pipeline::parse_schedule(argv[3]), pp, std::atoi(argv[4]),
                                    std::atoi(argv[5])};
  const std::string out = argv[6];
  at::set_num_threads(1);
  dist::World world = dist::World::from_env();
  const dist::Mesh mesh = dist::Mesh::from_sizes(dp, 1, pp, "tp-dp-pp");
  dist::MeshGroups groups = world.mesh_groups(mesh);
  const int stage = groups.coord("pp"), dp_rank = groups.coord("dp");

  models::GptConfig config;
  config.layers = 4, config.dim = 32, config.heads = 2, config.seq_len = 16;
  const int64_t batch = 8, steps = 3;
  models::Gpt model(config, /*seed=*/7);
  model->set_split_backward(spec.kind == pipeline::ScheduleKind::kZbH1);

  // The layer list and its parts (balanced by parameter count).
  std::vector<std::vector<torch::nn::Module*>> layer_modules;
  std::vector<pipeline::PartForward> layer_forward;
  layer_modules.push_back({model->wte.get(), model->wpe.get()});
  layer_forward.push_back([&](const at::Tensor& idx) {
    return model->wte->forward(idx) + model->wpe->forward(at::arange(idx.size(1), idx.options()));
  });
  for (int64_t l = 0; l < config.layers; ++l) {
    auto block = model->h[l]->as<models::BlockImpl>();
    layer_modules.push_back({block});
    layer_forward.push_back([block](const at::Tensor& x) { return block->forward(x); });
  }
  layer_modules.push_back({model->ln_f.get(), model->head.get()});
  const bool split = spec.kind == pipeline::ScheduleKind::kZbH1;
  layer_forward.push_back([&, split](const at::Tensor& x) {
    const at::Tensor h = model->ln_f->forward(x);
    return split ? pipeline::deferred_linear(h, model->head->weight, at::Tensor()) : model->head->forward(h);
  });
  std::vector<double> costs;
  for (const auto& modules : layer_modules) {
    double n = 0;
    for (auto* m : modules)
      for (const auto& p : m->parameters()) n += static_cast<double>(p.numel());
    costs.push_back(n);
  }
  const auto ranges = pipeline::balance_partition(costs, pp * spec.chunks);

  std::vector<pipeline::PartForward> parts;
  std::set<const void*> mine;  // this stage's parameters
  std::vector<at::Tensor> params;
  for (int c = 0; c < spec.chunks; ++c) {
    const auto range = ranges[c * pp + stage];
    parts.push_back([range, &layer_forward](const at::Tensor& x) {
      at::Tensor y = x;
      for (int l = range.begin; l < range.end; ++l) y = layer_forward[l](y);
      return y;
    });
    for (int l = range.begin; l < range.end; ++l)
      for (auto* m : layer_modules[l])
        for (const auto& p : m->parameters())
          if (mine.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
  }
  const int64_t micro = batch / dp / spec.micro_batches;
  pipeline::StageExecutor executor(
      spec, stage, parts,
      [&](const at::Tensor& logits, const at::Tensor& targets) {
        return at::cross_entropy_loss(logits.reshape({-1, config.vocab}), targets.reshape({-1}));
      },
      {{micro, config.seq_len, config.dim}, at::kFloat}, groups.axis("pp"));
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).weight_decay(0.1));

  const data::Corpus corpus = data::Corpus::load(data::default_corpus_path());
  const data::BatchSampler sampler(corpus.size(), config.seq_len, batch, 7);
  const dist::Group& dp_group = groups.axis("dp");
  std::ofstream losses(out + ".losses.stage" + std::to_string(stage) + ".dp" + std::to_string(dp_rank));
  for (int64_t step = 0; step < steps; ++step) {
    const auto offsets = sampler.shard(step, dp_rank, dp);
    std::vector<pipeline::MicroBatch> micro_batches;
    for (int m = 0; m < spec.micro_batches; ++m) {
      std::vector<uint64_t> part(offsets.begin() + m * micro, offsets.begin() + (m + 1) * micro);
      const data::Batch b = data::make_batch(corpus, part, config.seq_len);
      micro_batches.push_back({b.inputs, b.targets});
    }
    const double loss = executor.run(micro_batches, [&] {
      if (dp == 1) return;
      for (auto& p : params) {  // plain averaging; the overlapped path is DataParallel's
        std::vector<at::Tensor> g{p.grad()};
        dist::run_collective("dp gradient all-reduce", [&] { return dp_group->allreduce(g); });
        p.grad().div_(dp);
      }
    });
    std::vector<at::Tensor> l{at::full({1}, loss, at::kDouble)};
    if (dp > 1) dist::run_collective("loss all-reduce", [&] { return dp_group->allreduce(l); });
    losses << std::setprecision(17) << l[0].item<double>() / dp << "\n";
    optimizer.step();
    optimizer.zero_grad();
  }
  if (dp_rank == 0) {  // one copy of each stage's parameters
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const auto& item : model->named_parameters())
      if (mine.count(item.value().unsafeGetTensorImpl())) named.emplace_back(item.key(), item.value());
    obs::write_parameter_dump(out + ".params.stage" + std::to_string(stage), named);
  }
  return 0;
}
