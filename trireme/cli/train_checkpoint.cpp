// Saving and loading training checkpoints; see train_checkpoint.h.
#include "trireme/cli/train_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>
#include <mutex>

#include "trireme/common/error.h"
#include "trireme/ft/checkpoint.h"
#include "trireme/ft/snapshot.h"

namespace trireme::cli {
namespace {

struct Optimizer {
  int64_t step = 0;  // 0: no state
  at::Tensor exp_avg, exp_avg_sq;
};

// AdamW's state of each local parameter, by TensorImpl. Under ZeRO a collective over the
// data-parallel group.
std::map<const void*, Optimizer> optimizer_state(const TrainState& s) {
  std::map<const void*, Optimizer> out;
  if (s.zero) {
    const auto states = s.zero->gather_state();
    const auto& params = s.engine.data_parallel().parameters();
    for (size_t p = 0; p < params.size(); ++p)
      out[params[p].unsafeGetTensorImpl()] = {states[p].step, states[p].exp_avg, states[p].exp_avg_sq};
    return out;
  }
  for (const auto& [key, state] : s.adamw->state()) {
    const auto& a = static_cast<const torch::optim::AdamWParamState&>(*state);
    out[key] = {a.step(), a.exp_avg(), a.exp_avg_sq()};
  }
  return out;
}

tensor::ShardSpec spec_of(const TrainState& s, const std::string& name) {
  auto it = s.engine.shard_specs().find(name);
  return it == s.engine.shard_specs().end() ? tensor::ShardSpec{} : it->second;
}

// The local tensor's pieces, one per box of its shard (in the order they are concatenated).
std::vector<at::Tensor> split_local(const at::Tensor& local, const tensor::ShardSpec& spec, size_t boxes) {
  if (boxes == 1) return {local};
  return local.chunk(static_cast<int64_t>(boxes), spec.dim);
}

// This rank's part of the training state as boxes of whole-model tensors. For a shared
// checkpoint (`everything` false) the work is split: replicated tensors come from
// tensor-parallel rank 0 and replica (i mod dp) writes the i-th tensor. A snapshot
// (`everything` true) holds all of this rank's own state, so it can restore itself alone.
std::vector<ft::SavedPiece> state_pieces(const TrainState& s, bool everything) {
  const int tp = s.options.tp, tp_rank = s.groups.coord("tp");
  const int dp = s.options.dp, dp_rank = s.groups.coord("dp");
  const std::map<const void*, Optimizer> optimizer = optimizer_state(s);
  std::vector<ft::SavedPiece> pieces;
  const auto named = s.engine.named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, param] = named[i];
    const tensor::ShardSpec spec = spec_of(s, name);
    if (!everything && static_cast<int>(i % static_cast<size_t>(dp)) != dp_rank) continue;
    if (!everything && spec.replicated() && tp_rank != 0) continue;
    const std::vector<int64_t> shape = tensor::full_shape(param.sizes(), spec, tp);
    const std::vector<ft::Box> boxes = ft::shard_boxes(shape, spec.dim, spec.blocks, tp_rank, tp);
    const auto add = [&](const std::string& kind, const at::Tensor& local) {
      const auto parts = split_local(local.detach(), spec, boxes.size());
      for (size_t k = 0; k < boxes.size(); ++k) pieces.push_back({kind + "/" + name, shape, boxes[k], parts[k]});
    };
    add("param", param);
    auto state = optimizer.find(param.unsafeGetTensorImpl());
    if (state == optimizer.end() || state->second.step == 0) continue;
    add("exp_avg", state->second.exp_avg);
    add("exp_avg_sq", state->second.exp_avg_sq);
    if (everything || tp_rank == 0)
      pieces.push_back({"step/" + name, {1}, ft::whole({1}), at::full({1}, state->second.step, at::kLong)});
  }
  at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  pieces.push_back({"rng/cpu/rank" + std::to_string(s.world.rank()), {rng.numel()}, ft::whole({rng.numel()}), rng});
  return pieces;
}

ft::CheckpointLayout layout_of(const TrainState& s) {
  return {s.groups.mesh.describe(), s.options.dp, s.options.tp, s.options.pp, s.options.zero};
}

// Restores parameters, optimizer state and (same mesh) the generator from `checkpoint`.
void load_from(const TrainState& s, const ft::Checkpoint& checkpoint) {
  const std::string& chosen = checkpoint.dir();
  const int tp = s.options.tp, tp_rank = s.groups.coord("tp");
  std::map<const void*, Optimizer> optimizer;
  at::NoGradGuard no_grad;
  for (const auto& [name, param] : s.engine.named_parameters()) {
    const tensor::ShardSpec spec = spec_of(s, name);
    const std::vector<int64_t> shape = tensor::full_shape(param.sizes(), spec, tp);
    TRIREME_CHECK(checkpoint.has("param/" + name), "checkpoint ", chosen, " has no parameter '", name,
                  "': it is of another model; train it with its own --layers/--dim/--heads/--seq or start afresh");
    TRIREME_CHECK(checkpoint.shape("param/" + name) == shape, "checkpoint ", chosen, ": parameter '", name,
                  "' has another shape than this model's; use the flags of the run that wrote it");
    const std::vector<ft::Box> boxes = ft::shard_boxes(shape, spec.dim, spec.blocks, tp_rank, tp);
    const auto local = [&](const std::string& kind) {
      std::vector<at::Tensor> parts;
      for (const ft::Box& box : boxes) parts.push_back(checkpoint.read(kind + "/" + name, box));
      return parts.size() == 1 ? parts[0] : at::cat(parts, spec.dim);
    };
    param.detach().copy_(local("param"));
    if (checkpoint.has("exp_avg/" + name)) {
      const int64_t step = checkpoint.read("step/" + name, ft::whole({1})).item<int64_t>();
      optimizer[param.unsafeGetTensorImpl()] = {step, local("exp_avg").to(param.device()),
                                                local("exp_avg_sq").to(param.device())};
    }
  }
  if (s.zero) {
    const auto& params = s.engine.data_parallel().parameters();
    std::vector<parallel::ZeroOptimizer::ParamState> states(params.size());
    for (size_t p = 0; p < params.size(); ++p) {
      auto it = optimizer.find(params[p].unsafeGetTensorImpl());
      if (it != optimizer.end()) states[p] = {it->second.step, it->second.exp_avg, it->second.exp_avg_sq};
    }
    s.zero->load_state(states);
  } else {
    for (const at::Tensor& param : s.engine.parameters()) {
      void* key = param.unsafeGetTensorImpl();
      s.adamw->state().erase(key);
      auto it = optimizer.find(key);
      if (it == optimizer.end()) continue;
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(it->second.step);
      state->exp_avg(it->second.exp_avg);
      state->exp_avg_sq(it->second.exp_avg_sq);
      s.adamw->state()[key] = std::move(state);
    }
  }
  const std::string rng = "rng/cpu/rank" + std::to_string(s.world.rank());
  if (checkpoint.layout().mesh == s.groups.mesh.describe() && checkpoint.has(rng)) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();  // shares the default's state
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(checkpoint.read(rng, ft::whole(checkpoint.shape(rng))));
  }
}

// MIN of `value` over the world (a collective).
int64_t world_min(const TrainState& s, int64_t value) {
  if (s.world.size() == 1) return value;
  const at::Device device = s.engine.parameters().front().device();
  std::vector<at::Tensor> buffer{at::full({1}, value, at::kLong).to(device)};
  c10d::AllreduceOptions min;
  min.reduceOp = c10d::ReduceOp::MIN;
  dist::run_collective("snapshot agreement", [&] { return s.world.group()->allreduce(buffer, min); });
  return buffer[0].cpu().item<int64_t>();
}

}  // namespace

void save_checkpoint(const TrainState& s, int64_t steps_done) {
  ft::write_checkpoint(s.options.checkpoint_dir, steps_done, layout_of(s), state_pieces(s, false), s.world,
                       static_cast<int>(s.options.keep_checkpoints));
}

double take_snapshot(const TrainState& s, ft::Snapshotter& snapshotter, int64_t steps_done) {
  return snapshotter.take(steps_done, state_pieces(s, true));
}

int64_t load_checkpoint(const TrainState& s) {
  // Rank 0 picks the newest checkpoint that verifies; everyone opens that one.
  std::string chosen;
  if (s.world.rank() == 0) {
    std::vector<std::string> skipped;
    const auto latest = ft::Checkpoint::find_latest(s.options.checkpoint_dir, &skipped);
    for (const auto& why : skipped)
      std::fprintf(stderr, "trireme train: skipping a damaged checkpoint: %s\n", why.c_str());
    if (latest) chosen = latest->dir();
    s.world.store()->set("resume/chosen", std::vector<uint8_t>(chosen.begin(), chosen.end()));
  }
  dist::run_collective("resume barrier", [&] { return s.world.group()->barrier(); });
  const std::vector<uint8_t> bytes = s.world.store()->get("resume/chosen");
  chosen.assign(bytes.begin(), bytes.end());
  if (chosen.empty()) return 0;
  const ft::Checkpoint checkpoint = ft::Checkpoint::open(chosen, /*verify_data=*/false);
  load_from(s, checkpoint);
  return checkpoint.step();
}

int64_t load_snapshot(const TrainState& s, const std::string& dir) {
  // The newest step every rank has a complete snapshot of (each keeps two).
  const std::vector<int64_t> mine = ft::Snapshotter::complete_steps(dir);
  int64_t bound = INT64_MAX;
  for (int attempt = 0; attempt < 3; ++attempt) {
    int64_t candidate = -1;
    for (int64_t step : mine)
      if (step <= bound) {
        candidate = step;
        break;
      }
    const int64_t agreed = world_min(s, candidate);
    if (agreed < 0) return 0;
    const bool have = std::find(mine.begin(), mine.end(), agreed) != mine.end();
    if (world_min(s, have ? 1 : 0) == 1) {
      load_from(s, ft::Checkpoint::open(dir + "/" + std::to_string(agreed), /*verify_data=*/false));
      return agreed;
    }
    bound = agreed - 1;
  }
  return 0;
}

}  // namespace trireme::cli
