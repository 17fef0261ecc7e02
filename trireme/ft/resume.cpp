// Saving and restoring a rank's training state; see resume.h.
#include "trireme/ft/resume.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "trireme/common/error.h"

namespace trireme::ft {
namespace {

using Optimizer = parallel::AdamWState;

// AdamW's state of each local parameter, by TensorImpl. Under ZeRO a collective over the
// data-parallel group.
std::map<const void*, Optimizer> optimizer_state(const TrainingState& s) {
  std::map<const void*, Optimizer> out;
  if (s.zero) {
    const auto states = s.zero->gather_state();
    const auto& params = s.zero->data_parallel().parameters();
    for (size_t p = 0; p < params.size(); ++p) out[params[p].unsafeGetTensorImpl()] = states[p];
    return out;
  }
  for (const auto& [key, state] : s.adamw->state()) out[key] = parallel::adamw_state(*s.adamw, key);
  return out;
}

tensor::ShardSpec spec_of(const TrainingState& s, const std::string& name) {
  auto it = s.specs.find(name);
  return it == s.specs.end() ? tensor::ShardSpec{} : it->second;
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
std::vector<SavedPiece> state_pieces(const TrainingState& s, bool everything) {
  const int tp = s.tp, tp_rank = s.tp_rank;
  const int dp = s.dp, dp_rank = s.dp_rank;
  // A snapshot under ZeRO keeps this rank's own pieces' state (1/d of it, no gather).
  const bool own_pieces = everything && s.zero;
  const std::map<const void*, Optimizer> optimizer =
      own_pieces ? std::map<const void*, Optimizer>() : optimizer_state(s);
  std::vector<SavedPiece> pieces;
  const auto named = s.parameters;
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, param] = named[i];
    const tensor::ShardSpec spec = spec_of(s, name);
    if (!everything && static_cast<int>(i % static_cast<size_t>(dp)) != dp_rank) continue;
    if (!everything && spec.replicated() && tp_rank != 0) continue;
    const std::vector<int64_t> shape = tensor::full_shape(param.sizes(), spec, tp);
    const std::vector<Box> boxes = shard_boxes(shape, spec.dim, spec.blocks, tp_rank, tp);
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
      pieces.push_back({"step/" + name, {1}, whole({1}), at::full({1}, state->second.step, at::kLong)});
  }
  if (own_pieces) {
    const auto states = s.zero->piece_states();
    pieces.push_back({"zero/pieces", {1}, whole({1}), at::full({1}, static_cast<int64_t>(states.size()), at::kLong)});
    for (size_t i = 0; i < states.size(); ++i) {
      if (states[i].step == 0) continue;
      const std::string name = "zero/" + std::to_string(i) + "/";
      const int64_t n = states[i].exp_avg.numel();
      pieces.push_back({name + "exp_avg", {n}, whole({n}), states[i].exp_avg});
      pieces.push_back({name + "exp_avg_sq", {n}, whole({n}), states[i].exp_avg_sq});
      pieces.push_back({name + "step", {1}, whole({1}), at::full({1}, states[i].step, at::kLong)});
    }
  }
  at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  pieces.push_back({"rng/cpu/rank" + std::to_string(s.world->rank()), {rng.numel()}, whole({rng.numel()}), rng});
  return pieces;
}

// Restores parameters, optimizer state and (same mesh) the generator from `checkpoint`.
void load_from(const TrainingState& s, const Checkpoint& checkpoint) {
  const std::string& chosen = checkpoint.dir();
  const int tp = s.tp, tp_rank = s.tp_rank;
  std::map<const void*, Optimizer> optimizer;
  at::NoGradGuard no_grad;
  for (const auto& [name, param] : s.parameters) {
    const tensor::ShardSpec spec = spec_of(s, name);
    const std::vector<int64_t> shape = tensor::full_shape(param.sizes(), spec, tp);
    TRIREME_CHECK(checkpoint.has("param/" + name), "checkpoint ", chosen, " has no parameter '", name,
                  "': it is of another model; train it with its own --layers/--dim/--heads/--seq or start afresh");
    TRIREME_CHECK(checkpoint.shape("param/" + name) == shape, "checkpoint ", chosen, ": parameter '", name,
                  "' has another shape than this model's; use the flags of the run that wrote it");
    const std::vector<Box> boxes = shard_boxes(shape, spec.dim, spec.blocks, tp_rank, tp);
    const auto local = [&](const std::string& kind) {
      std::vector<at::Tensor> parts;
      for (const Box& box : boxes) parts.push_back(checkpoint.read(kind + "/" + name, box));
      return parts.size() == 1 ? parts[0] : at::cat(parts, spec.dim);
    };
    param.detach().copy_(local("param"));
    if (checkpoint.has("exp_avg/" + name)) {
      const int64_t step = checkpoint.read("step/" + name, whole({1})).item<int64_t>();
      optimizer[param.unsafeGetTensorImpl()] = {step, local("exp_avg").to(param.device()),
                                                local("exp_avg_sq").to(param.device())};
    }
  }
  if (s.zero && checkpoint.has("zero/pieces")) {
    // A snapshot of this very layout: each piece's own state.
    const int64_t count = checkpoint.read("zero/pieces", whole({1})).item<int64_t>();
    std::vector<parallel::ZeroOptimizer::ParamState> states(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      const std::string name = "zero/" + std::to_string(i) + "/";
      if (!checkpoint.has(name + "step")) continue;
      states[i] = {checkpoint.read(name + "step", whole({1})).item<int64_t>(),
                   checkpoint.read(name + "exp_avg", whole(checkpoint.shape(name + "exp_avg"))),
                   checkpoint.read(name + "exp_avg_sq", whole(checkpoint.shape(name + "exp_avg_sq")))};
    }
    s.zero->load_piece_states(states);
  } else if (s.zero) {
    const auto& params = s.zero->data_parallel().parameters();
    std::vector<parallel::ZeroOptimizer::ParamState> states(params.size());
    for (size_t p = 0; p < params.size(); ++p) {
      auto it = optimizer.find(params[p].unsafeGetTensorImpl());
      if (it != optimizer.end()) states[p] = it->second;
    }
    s.zero->load_state(states);
  } else {
    for (const auto& [name, param] : s.parameters) {
      const void* key = param.unsafeGetTensorImpl();
      auto it = optimizer.find(key);
      parallel::set_adamw_state(*s.adamw, key, it == optimizer.end() ? Optimizer{} : it->second);
    }
  }
  const std::string rng = "rng/cpu/rank" + std::to_string(s.world->rank());
  if (checkpoint.layout().mesh == s.layout.mesh && checkpoint.has(rng)) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();  // shares the default's state
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(checkpoint.read(rng, whole(checkpoint.shape(rng))));
  }
}

// MIN of `value` over the world (a collective).
int64_t world_min(const TrainingState& s, int64_t value) {
  if (s.world->size() == 1) return value;
  const at::Device device = s.parameters.front().second.device();
  std::vector<at::Tensor> buffer{at::full({1}, value, at::kLong).to(device)};
  c10d::AllreduceOptions min;
  min.reduceOp = c10d::ReduceOp::MIN;
  dist::run_collective("snapshot agreement", [&] { return s.world->group()->allreduce(buffer, min); });
  return buffer[0].cpu().item<int64_t>();
}

}  // namespace

void save_checkpoint(const TrainingState& s, const std::string& root, int64_t steps_done, int keep) {
  write_checkpoint(root, steps_done, s.layout, state_pieces(s, false), *s.world, keep);
}

double save_checkpoint_async(const TrainingState& s, BackgroundWriter& writer, int64_t steps_done) {
  return writer.take(steps_done, state_pieces(s, false));
}

std::unique_ptr<BackgroundWriter> checkpoint_writer(const TrainingState& s, const std::string& root, int keep) {
  const dist::Store store = s.world->store();
  const int rank = s.world->rank(), size = s.world->size();
  const CheckpointLayout layout = s.layout;
  return std::make_unique<BackgroundWriter>(
      [=](int64_t step, const std::vector<SavedPiece>& pieces) {
        write_checkpoint_through_store(root, step, layout, pieces, store, rank, size, keep);
      });
}

double take_snapshot(const TrainingState& s, Snapshotter& snapshotter, int64_t steps_done) {
  return snapshotter.take(steps_done, state_pieces(s, true));
}

int64_t load_checkpoint(const TrainingState& s, const std::string& root) {
  // Rank 0 picks the newest checkpoint that verifies; everyone opens that one.
  std::string chosen;
  if (s.world->rank() == 0) {
    std::vector<std::string> skipped;
    const auto latest = Checkpoint::find_latest(root, &skipped);
    for (const auto& why : skipped)
      std::fprintf(stderr, "trireme: skipping a damaged checkpoint: %s\n", why.c_str());
    if (latest) chosen = latest->dir();
    s.world->store()->set("resume/chosen", std::vector<uint8_t>(chosen.begin(), chosen.end()));
  }
  dist::run_collective("resume barrier", [&] { return s.world->group()->barrier(); });
  const std::vector<uint8_t> bytes = s.world->store()->get("resume/chosen");
  chosen.assign(bytes.begin(), bytes.end());
  if (chosen.empty()) return 0;
  const Checkpoint checkpoint = Checkpoint::open(chosen, /*verify_data=*/false);
  load_from(s, checkpoint);
  return checkpoint.step();
}

int64_t load_snapshot(const TrainingState& s, const std::string& dir) {
  // The newest step every rank has a complete snapshot of (each keeps two).
  const std::vector<int64_t> mine = Snapshotter::complete_steps(dir);
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
      load_from(s, Checkpoint::open(dir + "/" + std::to_string(agreed), /*verify_data=*/false));
      return agreed;
    }
    bound = agreed - 1;
  }
  return 0;
}

namespace {
bool world_restarted() {
  const char* count = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return count && std::atoi(count) > 0;
}
}  // namespace

int64_t snapshot_interval(int64_t requested, const std::string& snapshot_dir) {
  const char* max_restarts = std::getenv("TORCHELASTIC_MAX_RESTARTS");
  const int64_t every = requested >= 0 ? requested
                                       : (max_restarts && std::atoi(max_restarts) > 0 && !snapshot_dir.empty() ? 1 : 0);
  TRIREME_CHECK(every == 0 || !snapshot_dir.empty(),
                "in-memory snapshots (--snapshot-every) need the snapshot area of `trireme run` (TRIREME_SNAPSHOT_DIR)");
  return every;
}

std::string snapshot_dir_from_env(int rank) {
  const char* root = std::getenv("TRIREME_SNAPSHOT_DIR");
  return root && *root ? std::string(root) + "/rank-" + std::to_string(rank) : "";
}

Resumable::Resumable(dist::World& world, torch::nn::Module& model, torch::optim::AdamW& optimizer,
                     ResumableOptions options)
    : options_(std::move(options)) {
  state_.world = &world;
  for (const auto& item : model.named_parameters()) state_.parameters.emplace_back(item.key(), item.value());
  state_.dp = world.size();
  state_.dp_rank = world.rank();
  state_.adamw = &optimizer;
  state_.layout = {"dp=" + std::to_string(world.size()), world.size(), 1, 1, 0};
  snapshot_dir_ = snapshot_dir_from_env(world.rank());
  snapshot_every_ = snapshot_interval(options_.snapshot_every, snapshot_dir_);
  CheckpointLayout own = state_.layout;
  own.rank = world.rank();
  if (snapshot_every_ > 0) snapshotter_ = std::make_unique<Snapshotter>(snapshot_dir_, own);
  if (options_.checkpoint_every > 0 && !options_.checkpoint_dir.empty())
    checkpointer_ = checkpoint_writer(state_, options_.checkpoint_dir, options_.keep_checkpoints);
}

int64_t Resumable::resume() {
  int64_t step = 0;
  if (world_restarted() && !snapshot_dir_.empty()) step = load_snapshot(state_, snapshot_dir_);
  if (step == 0 && !options_.checkpoint_dir.empty()) step = load_checkpoint(state_, options_.checkpoint_dir);
  return step;
}

void Resumable::step_done(int64_t steps_done) {
  if (snapshotter_ && steps_done % snapshot_every_ == 0) take_snapshot(state_, *snapshotter_, steps_done);
  if (checkpointer_ && steps_done % options_.checkpoint_every == 0)
    save_checkpoint_async(state_, *checkpointer_, steps_done);
}

void Resumable::wait() {
  if (snapshotter_) snapshotter_->wait();
  if (checkpointer_) checkpointer_->wait();
}

}  // namespace trireme::ft
