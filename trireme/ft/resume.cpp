// Saving and restoring a rank's training state; see resume.h.
#include "trireme/ft/resume.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>

#include "trireme/common/error.h"
#include "trireme/obs/clock.h"

namespace trireme::ft {
namespace {

using Optimizer = parallel::AdamWState;

// Rank `rank`'s snapshot directory in a node's snapshot area.
std::string rank_snapshot_dir(const std::string& area, int rank) { return area + "/rank-" + std::to_string(rank); }

// Whether this generation's workers were restarted (torchrun's TORCHELASTIC_RESTART_COUNT > 0).
bool world_restarted() {
  const char* count = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return count && std::atoi(count) > 0;
}

std::vector<int> share_owners(const TrainingState& s);

// AdamW's state of each local parameter, by TensorImpl. Under ZeRO a collective over the
// data-parallel group, which gathers the state only of the parameters whose checkpoint
// share is this replica's (share_owners; the only ones a checkpoint's pieces take): each
// rank holds that share's moments, not the whole model's.
std::map<const void*, Optimizer> optimizer_state(const TrainingState& s) {
  std::map<const void*, Optimizer> out;
  if (s.zero) {
    // (A tensor under two names, tied weights, is wanted when either name's share is ours.)
    std::map<const void*, bool> ours;
    const std::vector<int> owner = share_owners(s);
    for (size_t i = 0; i < s.parameters.size(); ++i)
      ours[s.parameters[i].second.unsafeGetTensorImpl()] |= owner[i] == s.dp_rank;
    const auto& params = s.zero->data_parallel().parameters();
    const auto states = s.zero->gather_state([&](size_t p) {
      const auto it = ours.find(params[p].unsafeGetTensorImpl());
      return it == ours.end() || it->second;
    });
    for (size_t p = 0; p < params.size(); ++p) out[params[p].unsafeGetTensorImpl()] = states[p];
    return out;
  }
  TRIREME_CHECK(s.adamw, "TrainingState has no optimizer: set adamw (or zero) to the one over its parameters");
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

// A parameter as this rank holds it: how it is split, its whole shape, and the boxes of
// the whole tensor that its local tensor concatenates (along spec.dim).
struct LocalShard {
  tensor::ShardSpec spec;
  std::vector<int64_t> shape;
  std::vector<Box> boxes;
};

LocalShard local_shard(const TrainingState& s, const std::string& name, const at::Tensor& param) {
  LocalShard shard{spec_of(s, name), {}, {}};
  shard.shape = tensor::full_shape(param.sizes(), shard.spec, s.tp);
  shard.boxes = shard_boxes(shard.shape, shard.spec.dim, shard.spec.blocks, s.tp_rank, s.tp);
  return shard;
}

// This rank's part of tensor KIND/NAME from `c`, shaped as its local tensor.
at::Tensor read_local(const Checkpoint& c, const std::string& kind, const std::string& name, const LocalShard& shard) {
  std::vector<at::Tensor> parts;
  for (const Box& box : shard.boxes) parts.push_back(c.read(kind + "/" + name, box));
  return parts.size() == 1 ? parts[0] : at::cat(parts, shard.spec.dim);
}

// The same, into `local` (a parameter): in place, one copy, when it is one box.
void read_local_into(const Checkpoint& c, const std::string& kind, const std::string& name, const LocalShard& shard,
                     const at::Tensor& local) {
  if (shard.boxes.size() == 1)
    c.read_into(kind + "/" + name, shard.boxes[0], local);
  else
    local.copy_(read_local(c, kind, name, shard));
}

// The generators this rank's training draws from, by checkpoint name: the CPU's, its GPU's
// when the parameters live on one (dropout and initialisation there), and the
// tensor-parallel dropout stream of the split regions.
std::vector<std::pair<std::string, at::Generator>> generators(const TrainingState& s) {
  const std::string rank = "/rank" + std::to_string(s.world->rank());
  std::vector<std::pair<std::string, at::Generator>> out{{"rng/cpu" + rank, at::detail::getDefaultCPUGenerator()}};
  const at::Device device = s.parameters.empty() ? at::Device(at::kCPU) : s.parameters.front().second.device();
  if (device.is_cuda()) out.emplace_back("rng/cuda" + rank, at::globalContext().defaultGenerator(device));
  if (s.split_rng) out.emplace_back("rng/tp-split" + rank, s.split_rng->split_generator());
  return out;
}

// The checkpoint name of this rank's gradient-bucket layout, when it has one to keep
// ("": none; ZeRO's buckets never move).
std::string bucket_key(const TrainingState& s) {
  if (!s.data_parallel || !s.data_parallel->options().rebuild_buckets) return "";
  return "buckets/rank" + std::to_string(s.world->rank());
}

// Restores this rank's generators and (with `buckets`) bucket layout from `c` when the same
// mesh wrote it. The bucket layout must be restored on every rank of a data-parallel group
// or on none (its first step rebuilds otherwise, through a broadcast): so only where every
// rank reads its own rank's state of one step (a checkpoint, or every rank's own snapshot).
void restore_rank_state(const TrainingState& s, const Checkpoint& c, bool buckets = true) {
  if (c.layout().mesh != s.layout.mesh) return;
  for (auto& [name, generator] : generators(s)) {  // each shares the default's state
    if (!c.has(name)) continue;
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(c.read(name, whole(c.shape(name))));
  }
  const std::string key = bucket_key(s);
  if (buckets && !key.empty() && c.has(key)) s.data_parallel->restore_bucket_state(c.read(key, whole(c.shape(key))));
}

// The checkpoint name of buffer NAME as rank `rank` holds it.
std::string buffer_key(int rank, const std::string& name) { return "buffer/rank" + std::to_string(rank) + "/" + name; }

// The tensor of `c` to restore this rank's buffer NAME from: its own rank's when the mesh
// that wrote `c` is this one, else the lowest rank's that `c` holds ("" when none).
std::string buffer_in(const TrainingState& s, const Checkpoint& c, const std::string& name) {
  const std::string own = buffer_key(s.world->rank(), name);
  if (c.layout().mesh == s.layout.mesh && c.has(own)) return own;
  const std::string prefix = "buffer/rank";
  int lowest = -1;
  for (const std::string& key : c.names(prefix)) {  // "buffer/rank<R>/NAME"
    const char* end = key.data() + key.size();
    int rank = 0;
    const auto [rest, error] = std::from_chars(key.data() + prefix.size(), end, rank);
    if (error == std::errc() && std::string_view(rest, static_cast<size_t>(end - rest)) == "/" + name &&
        (lowest < 0 || rank < lowest))
      lowest = rank;
  }
  return lowest < 0 ? "" : buffer_key(lowest, name);
}

// Whether `c` holds every buffer of this rank (see buffer_in).
bool holds_buffers(const TrainingState& s, const Checkpoint& c) {
  return std::all_of(s.buffers.begin(), s.buffers.end(),
                     [&](const auto& buffer) { return !buffer_in(s, c, buffer.first).empty(); });
}

// Restores this rank's buffers from `c`. Throws InvalidArgument when `c` lacks one or
// holds it with another shape.
void restore_buffers(const TrainingState& s, const Checkpoint& c) {
  at::NoGradGuard no_grad;
  for (const auto& [name, buffer] : s.buffers) {
    const std::string key = buffer_in(s, c, name);
    TRIREME_CHECK(!key.empty() && c.shape(key) == buffer.sizes().vec(), "checkpoint ", c.dir(),
                  " does not hold buffer '", name, "' as this model has it: it is of another model");
    c.read_into(key, whole(c.shape(key)), buffer.detach());
  }
}

// The whole-model name of one of this rank's parameters.
std::string name_of(const TrainingState& s, const at::Tensor& param) {
  for (const auto& [name, p] : s.parameters)
    if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return name;
  TRIREME_THROW(InvalidArgument, "a ZeRO parameter that is not among the training state's parameters");
}

// The key of a parameter's ZeRO state in a snapshot: its whole-model name and, under
// tensor parallelism, the tensor-parallel rank (the flattened parameter is that rank's
// shard, so the shards of one name differ in content).
std::string zero_key(const TrainingState& s, const std::string& name) {
  return s.tp > 1 ? name + "#tp" + std::to_string(s.tp_rank) : name;
}

// Which part of the training state a rank saves.
enum class Part {
  kCheckpoint,  // a shared checkpoint: replicated tensors from tensor-parallel rank 0,
                // and each replica writes its share of the tensors (share_owners)
  kOwn,         // a snapshot that restores this rank alone: all of its state (under
                // ZeRO its own pieces' optimizer state, 1/d of the whole, no gather)
  kReplicaShare,  // a snapshot shared by the data-parallel group (TrainingState::
                  // share_snapshots): the state of this replica's share of the tensors
                  // (share_owners), and the "share/dp" marker; the group restores it together
};

// Which replica of the data-parallel group saves each of this rank's parameters (and its
// optimizer state) when they share the work: the largest first, each to the replica with
// the fewest elements so far (ties: the lower replica), so that the shares are about
// equal in bytes. Every replica computes the same from the same shapes. (Assigning the
// i-th tensor to replica i mod dp instead gave one replica every weight matrix and the
// other every bias: weights and biases alternate.)
std::vector<int> share_owners(const TrainingState& s) {
  const size_t n = s.parameters.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return s.parameters[a].second.numel() > s.parameters[b].second.numel();
  });
  std::vector<int64_t> load(static_cast<size_t>(std::max(1, s.dp)), 0);
  std::vector<int> owner(n, 0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());
    owner[i] = static_cast<int>(least - load.begin());
    *least += s.parameters[i].second.numel();
  }
  return owner;
}

// This rank's part of the training state as boxes of whole-model tensors.
std::vector<SavedPiece> state_pieces(const TrainingState& s, Part part) {
  const int dp = s.dp, dp_rank = s.dp_rank;
  const bool everything = part != Part::kCheckpoint;
  const bool own_pieces = everything && s.zero;
  const std::map<const void*, Optimizer> optimizer =
      own_pieces ? std::map<const void*, Optimizer>() : optimizer_state(s);
  std::vector<SavedPiece> pieces;
  const auto named = s.parameters;
  const std::vector<int> owner = share_owners(s);
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, param] = named[i];
    const LocalShard shard = local_shard(s, name, param);
    if (part != Part::kOwn && owner[i] != dp_rank) continue;
    if (!everything && shard.spec.replicated() && s.tp_rank != 0) continue;
    const auto add = [&](const std::string& kind, const at::Tensor& local) {
      const auto parts = split_local(local.detach(), shard.spec, shard.boxes.size());
      for (size_t k = 0; k < shard.boxes.size(); ++k)
        pieces.push_back({kind + "/" + name, shard.shape, shard.boxes[k], parts[k]});
    };
    add("param", param);
    auto state = optimizer.find(param.unsafeGetTensorImpl());
    if (state == optimizer.end() || state->second.step == 0) continue;
    add("exp_avg", state->second.exp_avg);
    add("exp_avg_sq", state->second.exp_avg_sq);
    if (everything || s.tp_rank == 0)
      pieces.push_back({"step/" + name, {1}, whole({1}), at::full({1}, state->second.step, at::kLong)});
  }
  if (own_pieces) {
    // Each piece as a box of its flattened (rank-local) parameter: zero/exp_avg/KEY, of
    // shape {numel}; readable under another data-parallel size (load_from_memory).
    const auto states = s.zero->piece_states();
    const auto spans = s.zero->piece_spans();
    const auto& params = s.zero->data_parallel().parameters();
    pieces.push_back({"zero/pieces", {1}, whole({1}), at::full({1}, static_cast<int64_t>(states.size()), at::kLong)});
    for (size_t i = 0; i < states.size(); ++i) {
      if (states[i].step == 0) continue;
      const at::Tensor& param = params[spans[i].param];
      const std::string key = zero_key(s, name_of(s, param));
      const Box box{{spans[i].offset}, {spans[i].length}};
      pieces.push_back({"zero/exp_avg/" + key, {param.numel()}, box, states[i].exp_avg.reshape(-1)});
      pieces.push_back({"zero/exp_avg_sq/" + key, {param.numel()}, box, states[i].exp_avg_sq.reshape(-1)});
      pieces.push_back({"zero/step/" + key, {1}, whole({1}), at::full({1}, states[i].step, at::kLong)});
    }
  }
  if (part == Part::kReplicaShare)
    pieces.push_back({"share/dp", {2}, whole({2}), at::tensor({static_cast<int64_t>(dp), static_cast<int64_t>(dp_rank)})});
  // Buffers (every rank its own, in every part) are copied now: the next forward pass may
  // change them (a BatchNorm's running statistics) before before_update(), which only
  // guards the parameters and optimizer state until the next optimizer step. They are small.
  for (const auto& [name, buffer] : s.buffers) {
    const std::vector<int64_t> shape = buffer.sizes().vec();
    pieces.push_back({buffer_key(s.world->rank(), name), shape, whole(shape), buffer.detach().clone()});
  }
  for (auto& [name, generator] : generators(s)) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    const at::Tensor rng = generator.get_state();  // a CPU byte tensor, also for a GPU's
    pieces.push_back({name, {rng.numel()}, whole({rng.numel()}), rng});
  }
  const std::string buckets = bucket_key(s);
  if (!buckets.empty()) {
    const at::Tensor order = s.data_parallel->bucket_state();
    pieces.push_back({buckets, {order.numel()}, whole({order.numel()}), order});
  }
  return pieces;
}

// Restores parameters, optimizer state and (same mesh) the generator from `checkpoint`.
void load_from(const TrainingState& s, const Checkpoint& checkpoint) {
  const std::string& chosen = checkpoint.dir();
  std::map<const void*, Optimizer> optimizer;
  at::NoGradGuard no_grad;
  for (const auto& [name, param] : s.parameters) {
    const LocalShard shard = local_shard(s, name, param);
    TRIREME_CHECK(checkpoint.has("param/" + name), "checkpoint ", chosen, " has no parameter '", name,
                  "': it is of another model; train it with its own --layers/--dim/--heads/--seq or start afresh");
    TRIREME_CHECK(checkpoint.shape("param/" + name) == shard.shape, "checkpoint ", chosen, ": parameter '", name,
                  "' has another shape than this model's; use the flags of the run that wrote it");
    read_local_into(checkpoint, "param", name, shard, param.detach());
    if (checkpoint.has("exp_avg/" + name)) {
      const int64_t step = checkpoint.read("step/" + name, whole({1})).item<int64_t>();
      optimizer[param.unsafeGetTensorImpl()] = {step, read_local(checkpoint, "exp_avg", name, shard).to(param.device()),
                                                read_local(checkpoint, "exp_avg_sq", name, shard).to(param.device())};
    }
  }
  if (s.zero && checkpoint.has("zero/pieces")) {
    // A snapshot of this very layout: each piece's own state.
    const auto spans = s.zero->piece_spans();
    const auto& params = s.zero->data_parallel().parameters();
    std::vector<parallel::ZeroOptimizer::ParamState> states(spans.size());
    for (size_t i = 0; i < spans.size(); ++i) {
      const std::string key = zero_key(s, name_of(s, params[spans[i].param]));
      if (!checkpoint.has("zero/step/" + key)) continue;
      const Box box{{spans[i].offset}, {spans[i].length}};
      states[i] = {checkpoint.read("zero/step/" + key, whole({1})).item<int64_t>(),
                   checkpoint.read("zero/exp_avg/" + key, box), checkpoint.read("zero/exp_avg_sq/" + key, box)};
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
  restore_buffers(s, checkpoint);
  restore_rank_state(s, checkpoint);
}

// `values` reduced element-wise by `op` over `group` (a collective), on the parameters'
// device.
at::Tensor reduce_over(const TrainingState& s, const dist::Group& group, const at::Tensor& values,
                       c10d::ReduceOp::RedOpType op, const char* what = "snapshot agreement") {
  return dist::all_reduce(group, values, op, s.parameters.front().second.device(), what);
}

int64_t reduce_over(const TrainingState& s, const dist::Group& group, int64_t value, c10d::ReduceOp::RedOpType op) {
  return reduce_over(s, group, at::full({1}, value, at::kLong), op).cpu().item<int64_t>();
}

// Another replica's share of step `step` in this node's memory, its rank directory a
// sibling of `own_dir`: a complete snapshot marked as replica `root`'s share of this
// group's size whose slices cover the boxes of every tensor of that share (so of this
// stage and tensor-parallel rank). nullopt when the node holds none.
std::optional<Checkpoint> local_share(const TrainingState& s, const std::vector<int>& owner, const std::string& own_dir,
                                      int64_t step, int root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fs::path(own_dir).parent_path(), ec)) {
    const std::string dir = entry.path().string();
    if (entry.path().filename().string().rfind("rank-", 0) != 0 || dir == own_dir) continue;
    if (!fs::exists(dir + "/" + std::to_string(step) + "/manifest.json", ec)) continue;  // not complete
    try {
      // (Verified: it is read after the group has agreed who reads what.)
      Checkpoint c = Checkpoint::open(dir + "/" + std::to_string(step), /*verify_data=*/true);
      if (!c.has("share/dp")) continue;
      const at::Tensor share = c.read("share/dp", whole({2}));
      if (share[0].item<int64_t>() != s.dp || share[1].item<int64_t>() != root) continue;
      bool covers = true;
      for (size_t i = 0; i < s.parameters.size() && covers; ++i) {
        if (owner[i] != root) continue;
        const auto& [name, param] = s.parameters[i];
        const LocalShard shard = local_shard(s, name, param);
        for (const Box& box : shard.boxes) covers = covers && c.covers("param/" + name, box);
      }
      if (covers) return c;
    } catch (const CheckpointCorrupt&) {
      // a damaged copy serves nothing; the group's broadcast will
    }
  }
  return std::nullopt;
}

// Reads share `root` (param, and AdamW's state where its step is above 0) from `c` into
// the parameters and `states`, which must hold tensors for that state.
void read_share(const TrainingState& s, const std::vector<int>& owner, const Checkpoint& c, int root,
                std::vector<Optimizer>& states) {
  for (size_t i = 0; i < s.parameters.size(); ++i) {
    if (owner[i] != root) continue;
    const auto& [name, param] = s.parameters[i];
    const LocalShard shard = local_shard(s, name, param);
    read_local_into(c, "param", name, shard, param.detach());
    if (states[i].step == 0) continue;
    read_local_into(c, "exp_avg", name, shard, states[i].exp_avg);
    read_local_into(c, "exp_avg_sq", name, shard, states[i].exp_avg_sq);
  }
}

// Restores a snapshot shared by the data-parallel group (Part::kReplicaShare): each
// replica reads the tensors it holds from `own`, its own snapshot (in `own_dir`), and the
// other replicas' shares from their snapshots where this node holds them; a share some
// replica's node lacks is broadcast by its holder, all of it in one buffer. A collective
// over the group.
void load_shared(const TrainingState& s, const Checkpoint& own, const std::string& own_dir) {
  const dist::Group group = s.dp_group ? s.dp_group : s.world->group();
  TRIREME_CHECK(s.adamw, "snapshot ", own.dir(), " is shared by the data-parallel group, which ZeRO snapshots are not; "
                "resume with the flags of the run that wrote it");
  TRIREME_CHECK(group->getSize() == s.dp && group->getRank() == s.dp_rank,
                "load_snapshot: TrainingState::dp_group does not match dp and dp_rank");
  const at::Tensor share = own.read("share/dp", whole({2}));
  TRIREME_CHECK(share[0].item<int64_t>() == s.dp && share[1].item<int64_t>() == s.dp_rank, "snapshot ", own.dir(),
                " is replica ", share[1].item<int64_t>(), "'s share of ", share[0].item<int64_t>(),
                ", but this rank is replica ", s.dp_rank, " of ", s.dp, "; restart with the layout that wrote it");
  at::NoGradGuard no_grad;
  const size_t n = s.parameters.size();
  const at::Device device = n ? s.parameters.front().second.device() : at::Device(at::kCPU);
  // Each parameter's optimizer step, from the replica that holds it (0: no state yet).
  at::Tensor steps = at::zeros({static_cast<int64_t>(n)}, at::kLong);
  const std::vector<int> owner = share_owners(s);
  for (size_t i = 0; i < n; ++i) {
    if (owner[i] != s.dp_rank) continue;
    const auto& [name, param] = s.parameters[i];
    TRIREME_CHECK(own.has("param/" + name) && own.shape("param/" + name) == local_shard(s, name, param).shape,
                  "snapshot ", own.dir(), " does not hold parameter '", name,
                  "' as this model has it; use the flags of the run that wrote it");
    if (own.has("exp_avg/" + name)) steps[static_cast<int64_t>(i)] = own.read("step/" + name, whole({1})).item<int64_t>();
  }
  // The other shares: from this node's memory where it holds them (lacking[root] 0), by a
  // broadcast from their holder where some replica's node does not.
  at::Tensor lacking = at::zeros({s.dp}, at::kLong);
  std::vector<std::optional<Checkpoint>> here(static_cast<size_t>(s.dp));
  here[static_cast<size_t>(s.dp_rank)] = own;
  for (int root = 0; root < s.dp; ++root) {
    if (root == s.dp_rank) continue;
    here[static_cast<size_t>(root)] = local_share(s, owner, own_dir, own.step(), root);
    if (!here[static_cast<size_t>(root)]) lacking[root] = 1;
  }
  // One all-reduce: the optimizer steps (each from its holder) and who lacks what.
  const at::Tensor both = reduce_over(s, group, at::cat({steps, lacking}), c10d::ReduceOp::SUM, "snapshot share").cpu();
  steps = both.narrow(0, 0, static_cast<int64_t>(n));
  lacking = both.narrow(0, static_cast<int64_t>(n), s.dp);
  std::vector<Optimizer> states(n);
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor param = s.parameters[i].second.detach();
    const int64_t step = steps[static_cast<int64_t>(i)].item<int64_t>();
    if (step > 0) states[i] = {step, at::empty_like(param), at::empty_like(param)};
  }
  for (int root = 0; root < s.dp; ++root) {
    // The holder reads its own share; the others read it where every node holds it, and
    // else take the holder's broadcast.
    const bool everywhere = lacking[root].item<int64_t>() == 0;
    if (root == s.dp_rank || everywhere) read_share(s, owner, *here[static_cast<size_t>(root)], root, states);
    if (everywhere) continue;
    std::vector<at::Tensor> tensors;  // of root's share, in order
    for (size_t i = 0; i < n; ++i) {
      if (owner[i] != root) continue;
      const int64_t step = steps[static_cast<int64_t>(i)].item<int64_t>();
      tensors.push_back(s.parameters[i].second.detach());
      if (step > 0) {
        tensors.push_back(states[i].exp_avg);
        tensors.push_back(states[i].exp_avg_sq);
      }
    }
    // Back to back in one byte buffer, each at an offset aligned to its element size.
    const auto aligned = [](int64_t offset, const at::Tensor& t) {
      const auto element = static_cast<int64_t>(t.element_size());
      return (offset + element - 1) / element * element;
    };
    int64_t bytes = 0;
    for (const at::Tensor& t : tensors) bytes = aligned(bytes, t) + t.numel() * static_cast<int64_t>(t.element_size());
    std::vector<at::Tensor> buffer{at::empty({bytes}, at::TensorOptions(at::kByte).device(device))};
    // fn(tensor, its slot): the slot a contiguous view of the tensor's dtype and sizes, so
    // that a copy into the tensor writes it, whatever its strides (a reshape(-1) of a
    // non-contiguous parameter would be a copy, and the restore would write that).
    const auto each = [&](const auto& fn) {
      int64_t offset = 0;
      for (const at::Tensor& t : tensors) {
        offset = aligned(offset, t);
        const int64_t size = t.numel() * static_cast<int64_t>(t.element_size());
        fn(t, buffer[0].narrow(0, offset, size).view(t.scalar_type()).view(t.sizes()));
        offset += size;
      }
    };
    if (root == s.dp_rank) each([](const at::Tensor& t, const at::Tensor& slot) { slot.copy_(t); });
    c10d::BroadcastOptions from;
    from.rootRank = root;
    dist::run_collective("snapshot share", [&] { return group->broadcast(buffer, from); });
    if (root != s.dp_rank) each([](const at::Tensor& t, const at::Tensor& slot) { t.copy_(slot); });
  }
  for (size_t i = 0; i < n; ++i)
    parallel::set_adamw_state(*s.adamw, s.parameters[i].second.unsafeGetTensorImpl(), states[i]);
  restore_buffers(s, own);  // every rank's snapshot holds all of its own
  restore_rank_state(s, own);
}

// MIN of `value` over the world (a collective).
int64_t world_min(const TrainingState& s, int64_t value) {
  return reduce_over(s, s.world->group(), value, c10d::ReduceOp::MIN);
}

// A complete snapshot in this node's memory (see load_from_memory).
struct Source {
  int64_t step = 0;
  std::string dir;
  bool own = false;  // this rank's own snapshot
};

std::vector<Source> memory_sources(const std::string& area, int rank) {
  namespace fs = std::filesystem;
  std::vector<Source> sources;
  std::error_code ec;
  const std::string own = "rank-" + std::to_string(rank);
  for (const auto& entry : fs::directory_iterator(area, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank-", 0) != 0) continue;
    for (int64_t step : Snapshotter::complete_steps(entry.path().string()))
      sources.push_back({step, entry.path().string() + "/" + std::to_string(step), name == own});
  }
  for (int64_t step : checkpoint_steps(area + "/protected")) {  // not the .tmp-* of a round
    std::error_code inner;
    for (const auto& rank_dir : fs::directory_iterator(area + "/protected/" + std::to_string(step), inner))
      if (fs::exists(rank_dir.path() / "manifest.json")) sources.push_back({step, rank_dir.path().string(), false});
  }
  std::stable_sort(sources.begin(), sources.end(), [](const Source& a, const Source& b) { return a.own > b.own; });
  return sources;
}

// For each of this rank's parameters, a source of step `step` whose slices cover all of
// its shard's boxes (own snapshot first). Empty when some parameter has none.
std::vector<const Checkpoint*> cover(const TrainingState& s, const std::vector<Checkpoint>& opened) {
  std::vector<const Checkpoint*> chosen;
  for (const auto& [name, param] : s.parameters) {
    const LocalShard shard = local_shard(s, name, param);
    const std::vector<Box>& boxes = shard.boxes;
    const Checkpoint* found = nullptr;
    for (const Checkpoint& c : opened) {
      if (c.has("param/" + name) && c.shape("param/" + name) != shard.shape) continue;
      if (std::all_of(boxes.begin(), boxes.end(), [&](const Box& b) { return c.covers("param/" + name, b); }) &&
          (!c.has("exp_avg/" + name) ||
           std::all_of(boxes.begin(), boxes.end(), [&](const Box& b) { return c.covers("exp_avg/" + name, b); }))) {
        found = &c;
        break;
      }
    }
    if (!found) return {};
    chosen.push_back(found);
  }
  return chosen;
}

}  // namespace

void save_checkpoint(const TrainingState& s, const std::string& root, int64_t steps_done, int keep) {
  write_checkpoint(root, steps_done, s.layout, state_pieces(s, Part::kCheckpoint), *s.world, keep);
}

// Both count the listing of the state (views, generator states) as part of the hold.
double save_checkpoint_async(const TrainingState& s, BackgroundWriter& writer, int64_t steps_done) {
  const double start = obs::now_us();
  writer.take(steps_done, state_pieces(s, Part::kCheckpoint));
  return obs::now_us() - start;
}

std::unique_ptr<BackgroundWriter> checkpoint_writer(const TrainingState& s, const std::string& root, int keep,
                                                    std::function<void(int64_t)> before_write) {
  const dist::Store store = s.world->store();
  const int rank = s.world->rank(), size = s.world->size();
  const CheckpointLayout layout = s.layout;
  // Rank 0 commits: it holds the root for the writer's life. A restarted job's leader waits
  // a little for its killed predecessor's lock to go, then goes on without it; a new job
  // waits 2 s (a run resumed right after the last one ended, its writer finishing).
  const bool restarted = world_restarted();
  const auto wait = std::chrono::milliseconds(restarted ? 10000 : 2000);
  const std::shared_ptr<const WriterLock> lock =
      rank == 0 ? std::make_shared<const WriterLock>(root, wait, restarted) : nullptr;
  return std::make_unique<BackgroundWriter>(
      [=](int64_t step, const std::vector<SavedPiece>& pieces) {
        (void)lock;  // held as long as the writer
        if (before_write) before_write(step);
        write_checkpoint_through_store(root, step, layout, pieces, store, rank, size, keep);
      });
}

double take_snapshot(const TrainingState& s, Snapshotter& snapshotter, int64_t steps_done) {
  const double start = obs::now_us();
  snapshotter.take(steps_done, state_pieces(s, s.share_snapshots && !s.zero && s.dp > 1 ? Part::kReplicaShare : Part::kOwn));
  return obs::now_us() - start;
}

namespace {

// What rank 0's `choose()` returns, as every rank sees it (through the store under `key`;
// a collective).
std::string decided_by_rank0(const TrainingState& s, const std::string& key,
                             const std::function<std::string()>& choose) {
  if (s.world->rank() == 0) {
    const std::string chosen = choose();
    s.world->store()->set(key, std::vector<uint8_t>(chosen.begin(), chosen.end()));
  }
  dist::run_collective("resume barrier", [&] { return s.world->group()->barrier(); });
  const std::vector<uint8_t> bytes = s.world->store()->get(key);
  return {bytes.begin(), bytes.end()};
}

// Loads the checkpoint `chosen` (verified by rank 0) and returns its step.
int64_t load_chosen(const TrainingState& s, const std::string& chosen) {
  const Checkpoint checkpoint = Checkpoint::open(chosen, /*verify_data=*/false);
  const std::string& model = checkpoint.layout().model;
  TRIREME_CHECK(model.empty() || s.layout.model.empty() || model == s.layout.model, "checkpoint ", chosen,
                " is of another model (", model, "; this run has ", s.layout.model,
                "): resume with the flags that wrote it, or start afresh with another --checkpoint-dir");
  const std::string& data = checkpoint.layout().data;
  if (s.world->rank() == 0 && !data.empty() && !s.layout.data.empty() && data != s.layout.data)
    std::fprintf(stderr,
                 "trireme: checkpoint %s was trained on other data (%s; this run reads %s): the batches from here "
                 "on differ from those of the run it continues\n",
                 chosen.c_str(), data.c_str(), s.layout.data.c_str());
  load_from(s, checkpoint);
  return checkpoint.step();
}

}  // namespace

int64_t load_checkpoint(const TrainingState& s, const std::string& root) {
  // Rank 0 picks the newest checkpoint that verifies; everyone opens that one.
  const std::string chosen = decided_by_rank0(s, "resume/chosen", [&] {
    std::vector<std::string> skipped;
    const auto latest = Checkpoint::find_latest(root, &skipped);
    for (const auto& why : skipped) std::fprintf(stderr, "trireme: skipping a damaged checkpoint: %s\n", why.c_str());
    return latest ? latest->dir() : std::string();
  });
  return chosen.empty() ? 0 : load_chosen(s, chosen);
}

int64_t load_newer_checkpoint(const TrainingState& s, const std::string& root, int64_t in_memory, int64_t* floor) {
  // Rank 0's answer: "<dir>" of a newer checkpoint that verifies, or "=<step>" of the floor.
  // Only a checkpoint that would serve has its data read: the newest at or below the
  // snapshots' step needs its manifest alone, to bound them.
  const std::string chosen = decided_by_rank0(s, "resume/newer", [&] {
    for (int64_t step : checkpoint_steps(root)) {
      const std::string dir = root + "/" + std::to_string(step);
      try {
        Checkpoint::open(dir, /*verify_data=*/step > in_memory);
        return step > in_memory ? dir : "=" + std::to_string(step);
      } catch (const CheckpointCorrupt& e) {
        if (step > in_memory) std::fprintf(stderr, "trireme: skipping a damaged checkpoint: %s\n", e.what());
      }
    }
    return std::string("=0");
  });
  *floor = 0;
  if (chosen.rfind('=', 0) != 0) return load_chosen(s, chosen);
  *floor = std::stoll(chosen.substr(1));
  return 0;
}

int64_t load_snapshot(const TrainingState& s, const std::string& dir, bool* shared_out, int64_t at_least) {
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
    if (agreed < 0 || agreed < at_least) return 0;
    // Its data verified before the vote: a slice that fails its CRC later, in the middle
    // of the restore's collectives, would fail this rank alone, and every restart after it
    // would agree on the same damaged step again.
    std::optional<Checkpoint> own;
    if (std::find(mine.begin(), mine.end(), agreed) != mine.end()) {
      try {
        own = Checkpoint::open(dir + "/" + std::to_string(agreed), /*verify_data=*/true);
      } catch (const CheckpointCorrupt& e) {
        std::fprintf(stderr, "trireme: skipping a damaged snapshot: %s\n", e.what());
      }
    }
    if (world_min(s, own ? 1 : 0) == 1) {
      // Shared by the data-parallel group (every rank's or none: the same flags wrote them).
      const int64_t shared = own->has("share/dp") ? 1 : 0;
      if (world_min(s, shared) != -world_min(s, -shared))
        TRIREME_THROW(Error, "the snapshots of step ", agreed, " are shared by the data-parallel group on some ranks "
                             "and not on others; resume from a checkpoint");
      if (shared_out) *shared_out = shared != 0;
      if (shared)
        load_shared(s, *own, dir);
      else
        load_from(s, *own);
      return agreed;
    }
    bound = agreed - 1;
  }
  return 0;
}

namespace {

constexpr int64_t kNone = INT64_MAX;

// Whether `c` holds ZeRO pieces this rank can take: written under the same tp and pp
// (their keys and flattened shards are those of this layout's stages and shards).
bool zero_source(const TrainingState& s, const Checkpoint& c) {
  return c.has("zero/pieces") && c.layout().tp == s.tp && c.layout().pp == s.layout.pp;
}

// For each rank of the layout that wrote the ZeRO snapshots in `opened` (all of one step),
// the lowest rank of this world whose node holds that rank's snapshot, or kNone. A
// collective over the world.
std::vector<int64_t> zero_piece_owners(const TrainingState& s, const std::vector<Checkpoint>& opened) {
  int64_t writers = 0;
  for (const Checkpoint& c : opened)
    if (zero_source(s, c)) writers = std::max<int64_t>(writers, c.layout().dp * c.layout().tp * c.layout().pp);
  writers = reduce_over(s, s.world->group(), writers, c10d::ReduceOp::MAX);
  at::Tensor owner = at::full({std::max<int64_t>(writers, 1)}, kNone, at::kLong);
  for (const Checkpoint& c : opened)
    if (zero_source(s, c) && c.layout().rank >= 0 && c.layout().rank < writers)
      owner[c.layout().rank] = static_cast<int64_t>(s.world->rank());
  const at::Tensor result = reduce_over(s, s.world->group(), owner, c10d::ReduceOp::MIN).cpu();
  return std::vector<int64_t>(result.data_ptr<int64_t>(), result.data_ptr<int64_t>() + writers);
}

// The ZeRO pieces of the rank that wrote snapshot `c`, for a broadcast: one line per piece,
// "KEY START LENGTH STEP", and the values, each piece's exp_avg then its exp_avg_sq.
std::pair<std::string, at::Tensor> zero_pieces_of(const Checkpoint& c) {
  const std::string prefix = "zero/exp_avg/";
  std::string header;
  std::vector<at::Tensor> values;
  for (const std::string& tensor : c.names(prefix)) {
    const std::string key = tensor.substr(prefix.size());
    const int64_t step = c.read("zero/step/" + key, whole({1})).item<int64_t>();
    for (const Box& box : c.boxes(tensor)) {
      header += key + " " + std::to_string(box.start[0]) + " " + std::to_string(box.size[0]) + " " +
                std::to_string(step) + "\n";
      values.push_back(c.read(tensor, box));
      values.push_back(c.read("zero/exp_avg_sq/" + key, box));
    }
  }
  return {header, values.empty() ? at::empty({0}) : at::cat(values)};
}

// Every parameter's AdamW state (aligned with the ZeRO data-parallel module's parameters),
// assembled from the old ranks' pieces under any layout that keeps tp and pp: each old
// rank's pieces are broadcast over the world by the rank that owns its snapshot
// (zero_piece_owners), and the ranks whose parameters they belong to (same stage, same
// tensor-parallel rank) copy them in. The pieces of one layout never overlap, so each
// element is written once, bit for bit. *complete: whether every parameter that received
// a piece received all of its elements. A collective over the world.
std::vector<Optimizer> gather_zero_state(const TrainingState& s, const std::vector<Checkpoint>& opened,
                                         const std::vector<int64_t>& owner, bool* complete) {
  const auto& params = s.zero->data_parallel().parameters();
  std::map<std::string, size_t> index;  // ZeRO key -> position among params
  for (size_t p = 0; p < params.size(); ++p) index[zero_key(s, name_of(s, params[p]))] = p;
  const at::Device device = params.front().device();
  const dist::Group& world = s.world->group();
  std::vector<Optimizer> states(params.size());
  std::vector<int64_t> filled(params.size(), 0);  // elements written, per parameter
  for (size_t r = 0; r < owner.size(); ++r) {
    const int root = static_cast<int>(owner[r]);
    std::pair<std::string, at::Tensor> sent;
    if (root == s.world->rank())
      for (const Checkpoint& c : opened)
        if (zero_source(s, c) && c.layout().rank == static_cast<int>(r)) {
          sent = zero_pieces_of(c);
          sent.second = sent.second.to(device, params.front().scalar_type());  // what the others expect
          break;
        }
    c10d::BroadcastOptions from;
    from.rootRank = root;
    const auto broadcast = [&](at::Tensor t) {
      std::vector<at::Tensor> one{t};
      dist::run_collective("optimizer state gather", [&] { return world->broadcast(one, from); });
      return one[0];
    };
    const at::Tensor sizes =
        broadcast(at::tensor({static_cast<int64_t>(sent.first.size()), sent.second.numel()}, at::kLong).to(device))
            .cpu();
    const int64_t header_bytes = sizes[0].item<int64_t>(), count = sizes[1].item<int64_t>();
    if (header_bytes == 0) continue;  // a writer before its first step: no state yet
    at::Tensor header = at::empty({header_bytes}, at::kByte);
    if (root == s.world->rank()) std::memcpy(header.data_ptr(), sent.first.data(), sent.first.size());
    header = broadcast(header.to(device)).cpu();
    const at::Tensor values =
        broadcast(root == s.world->rank() ? sent.second
                                          : at::empty({count}, at::TensorOptions(params.front().scalar_type()).device(device)));
    std::istringstream lines(std::string(static_cast<const char*>(header.data_ptr()), static_cast<size_t>(header_bytes)));
    std::string key;
    int64_t start = 0, length = 0, step = 0, at = 0;
    while (lines >> key >> start >> length >> step) {
      auto it = index.find(key);
      if (it != index.end()) {
        Optimizer& state = states[it->second];
        if (state.step == 0) {
          const at::Tensor& param = params[it->second];
          state = {step, at::zeros_like(param.detach()), at::zeros_like(param.detach())};
        }
        state.exp_avg.view(-1).narrow(0, start, length).copy_(values.narrow(0, at, length));
        state.exp_avg_sq.view(-1).narrow(0, start, length).copy_(values.narrow(0, at + length, length));
        filled[it->second] += length;
      }
      at += 2 * length;
    }
  }
  *complete = true;
  for (size_t p = 0; p < params.size(); ++p)
    if (filled[p] != 0 && filled[p] != params[p].numel()) *complete = false;
  return states;
}

}  // namespace

namespace {

// The newest step of this rank's own snapshots written by the current mesh (0: none).
int64_t newest_own_step(const TrainingState& s, const std::vector<Source>& sources) {
  int64_t newest = 0;
  for (const Source& source : sources) {
    if (!source.own || source.step <= newest) continue;
    try {
      if (Checkpoint::open(source.dir, /*verify_data=*/false).layout().mesh == s.layout.mesh) newest = source.step;
    } catch (const CheckpointCorrupt&) {
    }
  }
  return newest;
}

// load_from_memory() among the steps up to `bound`.
int64_t load_from_memory_up_to(const TrainingState& s, const std::vector<Source>& sources, int64_t bound,
                               int64_t at_least, std::string* from) {
  const dist::Group dp_group = s.dp_group ? s.dp_group : s.world->group();
  // The newest step at which every data-parallel group has a rank whose node holds all of
  // its state: candidates from the newest down, agreed over the world.
  for (int attempt = 0; attempt < 8; ++attempt) {
    int64_t candidate = -1;
    for (const Source& source : sources)
      if (source.step <= bound) candidate = std::max(candidate, source.step);
    const int64_t step = reduce_over(s, s.world->group(), candidate, c10d::ReduceOp::MAX);
    if (step <= 0 || step < at_least) return 0;
    std::vector<Checkpoint> opened;
    for (const Source& source : sources) {
      if (source.step != step) continue;
      try {
        // Verified now: the reads below come after the group's vote on who covers what.
        opened.push_back(Checkpoint::open(source.dir, /*verify_data=*/true));
      } catch (const CheckpointCorrupt& e) {
        std::fprintf(stderr, "trireme: skipping a damaged snapshot: %s\n", e.what());  // the others may serve
      }
    }
    const std::vector<const Checkpoint*> chosen = cover(s, opened);
    const Checkpoint* buffers_from = nullptr;  // the first source with all of this rank's buffers
    for (const Checkpoint& c : opened)
      if (!buffers_from && holds_buffers(s, c)) buffers_from = &c;
    const bool covered = (!chosen.empty() || s.parameters.empty()) && (buffers_from || s.buffers.empty());
    const int64_t donor = reduce_over(s, dp_group, covered ? dp_group->getRank() : kNone, c10d::ReduceOp::MIN);
    if (reduce_over(s, s.world->group(), donor == kNone ? 0 : 1, c10d::ReduceOp::MIN) == 0) {
      bound = step - 1;
      continue;
    }
    // Under ZeRO every old rank's pieces of the optimizer state must be in some node's
    // memory: each is gathered once, by the lowest rank whose node holds it.
    std::vector<int64_t> owner;
    if (s.zero) {
      owner = zero_piece_owners(s, opened);
      if (std::count(owner.begin(), owner.end(), kNone) > 0) {
        bound = step - 1;
        continue;
      }
    }
    // Load what this node holds, then the ranks that hold nothing get it from the donor.
    at::NoGradGuard no_grad;
    std::vector<Optimizer> states(s.parameters.size());
    if (covered) {
      for (size_t p = 0; p < s.parameters.size(); ++p) {
        const auto& [name, param] = s.parameters[p];
        const Checkpoint& c = *chosen[p];
        const LocalShard shard = local_shard(s, name, param);
        const auto local = [&](const std::string& kind) { return read_local(c, kind, name, shard).to(param.device()); };
        param.detach().copy_(local("param"));
        if (c.has("exp_avg/" + name))
          states[p] = {c.read("step/" + name, whole({1})).item<int64_t>(), local("exp_avg"), local("exp_avg_sq")};
      }
      if (buffers_from) restore_buffers(s, *buffers_from);
    }
    const bool someone_lacks = reduce_over(s, dp_group, covered ? 0 : 1, c10d::ReduceOp::MAX) == 1;
    if (someone_lacks) {
      c10d::BroadcastOptions root;
      root.rootRank = static_cast<int>(donor);
      // Through contiguous tensors (NCCL refuses others), copied back where they are not
      // the parameter's or the moments' own.
      const auto broadcast_into = [&](const at::Tensor& target) {
        std::vector<at::Tensor> one{target.contiguous()};
        dist::run_collective("state broadcast", [&] { return dp_group->broadcast(one, root); });
        if (one[0].data_ptr() != target.data_ptr()) target.copy_(one[0]);
      };
      for (size_t p = 0; p < s.parameters.size(); ++p) {
        const at::Tensor& param = s.parameters[p].second;
        std::vector<at::Tensor> step{at::full({1}, states[p].step, at::kLong).to(param.device())};
        broadcast_into(param.detach());
        dist::run_collective("state broadcast", [&] { return dp_group->broadcast(step, root); });
        const int64_t n = step[0].cpu().item<int64_t>();
        if (n == 0) continue;
        if (!covered) states[p] = {n, at::empty_like(param.detach()), at::empty_like(param.detach())};
        broadcast_into(states[p].exp_avg);
        broadcast_into(states[p].exp_avg_sq);
      }
      for (const auto& [name, buffer] : s.buffers) {  // the donor's; a rank that found its own keeps them
        std::vector<at::Tensor> value{buffer.detach().clone(at::MemoryFormat::Contiguous)};
        dist::run_collective("state broadcast", [&] { return dp_group->broadcast(value, root); });
        if (!covered) buffer.detach().copy_(value[0]);
      }
    }
    if (s.zero) {
      bool complete = false;
      std::vector<Optimizer> zero_states = gather_zero_state(s, opened, owner, &complete);
      if (world_min(s, complete ? 1 : 0) == 0) {  // pieces of mixed layouts: an older step
        bound = step - 1;
        continue;
      }
      s.zero->load_state(zero_states);
    } else {
      for (size_t p = 0; p < s.parameters.size(); ++p)
        parallel::set_adamw_state(*s.adamw, s.parameters[p].second.unsafeGetTensorImpl(), states[p]);
    }
    // This rank's own generators, when every rank's own snapshot of the same mesh is here. The
    // bucket layout too, but only when every rank has its own (a data-parallel group restores it
    // on all of its ranks or none, see restore_rank_state): a job whose membership did not
    // change, such as one that lost a worker process, then resumes bit for bit.
    // (From `opened`: verified, so that a damaged one fails no rank alone after the vote.)
    const Checkpoint* own = nullptr;
    for (const Source& source : sources)
      for (const Checkpoint& c : opened)
        if (!own && source.own && source.step == step && c.dir() == source.dir) own = &c;
    const std::string key = bucket_key(s);
    const bool own_buckets = own && own->layout().mesh == s.layout.mesh && !key.empty() && own->has(key);
    const bool buckets = world_min(s, own_buckets ? 1 : 0) == 1;
    // The generators likewise: a tensor-parallel group's ranks draw replicated regions'
    // dropout from equal streams, so one restoring its own while a peer without its own
    // snapshot keeps a fresh one would make their masks differ.
    const bool own_same_mesh = own && own->layout().mesh == s.layout.mesh;
    if (world_min(s, own_same_mesh ? 1 : 0) == 1) restore_rank_state(s, *own, buckets);
    if (from) {
      std::string where = covered ? chosen.empty() ? "nothing" : chosen.front()->dir() : "a replica's broadcast";
      *from = "memory (" + where + (someone_lacks ? ", with broadcasts to ranks whose node held nothing" : "") + ")";
    }
    return step;
  }
  return 0;
}

}  // namespace

int64_t load_from_memory(const TrainingState& s, const std::string& area, std::string* from, int64_t at_least) {
  const dist::Group dp_group = s.dp_group ? s.dp_group : s.world->group();
  TRIREME_CHECK(dp_group->getSize() == s.dp, "load_from_memory: TrainingState::dp_group is not set");
  const std::vector<Source> sources = memory_sources(area, s.world->rank());
  // When every rank holds its own snapshots of this mesh (the membership did not change:
  // a worker was lost, not a machine), the newest step they all hold comes first, even if
  // some node holds a newer one: every rank then restores its own generators and bucket
  // layout, and the run goes on bit for bit (at the cost of redoing that one newer step).
  const int64_t all_own = world_min(s, newest_own_step(s, sources));
  if (all_own > 0)
    if (const int64_t step = load_from_memory_up_to(s, sources, all_own, at_least, from)) return step;
  return load_from_memory_up_to(s, sources, INT64_MAX, at_least, from);
}

int64_t memory_step_bound(const TrainingState& s, const std::string& area, bool elastic) {
  if (elastic) {
    int64_t newest = 0;
    for (const Source& source : memory_sources(area, s.world->rank())) newest = std::max(newest, source.step);
    return reduce_over(s, s.world->group(), newest, c10d::ReduceOp::MAX);
  }
  const std::vector<int64_t> mine = Snapshotter::complete_steps(rank_snapshot_dir(area, s.world->rank()));
  return std::max<int64_t>(0, world_min(s, mine.empty() ? 0 : mine.front()));
}

int64_t snapshot_interval(int64_t requested, const std::string& snapshot_dir) {
  const char* max_restarts = std::getenv("TORCHELASTIC_MAX_RESTARTS");
  const int64_t every = requested >= 0 ? requested
                                       : (max_restarts && std::atoi(max_restarts) > 0 && !snapshot_dir.empty() ? 1 : 0);
  TRIREME_CHECK(every == 0 || !snapshot_dir.empty(),
                "in-memory snapshots (--snapshot-every) need the snapshot area of `trireme run` (TRIREME_SNAPSHOT_DIR)");
  return every;
}

std::string snapshot_area_from_env() {
  const char* area = std::getenv("TRIREME_SNAPSHOT_DIR");
  return area ? area : "";
}

std::string snapshot_dir_from_env(int rank) {
  const std::string area = snapshot_area_from_env();
  return area.empty() ? "" : rank_snapshot_dir(area, rank);
}

std::string snapshot_area_on_every_node(const TrainingState& s) {
  const std::string area = snapshot_area_from_env();
  if (s.world->size() < 2) return area;
  const int64_t mine = area.empty() ? 0 : 1;
  const at::Tensor both = reduce_over(s, s.world->group(), at::tensor(std::vector<int64_t>{mine, -mine}, at::kLong),
                                      c10d::ReduceOp::MAX, "snapshot area check")
                              .cpu();
  const bool some = both[0].item<int64_t>() == 1, all = both[1].item<int64_t>() == -1;
  if (all) return area;
  if (some && s.world->rank() == 0)
    std::fprintf(stderr, "trireme: a node has no snapshot area (see its agent's message): no rank snapshots to memory, "
                         "and a restart resumes from the checkpoint directory\n");
  return "";
}

bool elastic_from_env() {
  const char* elastic = std::getenv("TRIREME_ELASTIC");
  return elastic && std::string(elastic) == "1";
}

Resumable::Resumable(dist::World& world, torch::nn::Module& model, torch::optim::AdamW& optimizer,
                     ResumableOptions options)
    : options_(std::move(options)) {
  TRIREME_CHECK(options_.keep_checkpoints >= 1, "Resumable: keep_checkpoints must be >= 1, got ",
                options_.keep_checkpoints);
  TRIREME_CHECK(options_.checkpoint_every >= 0, "Resumable: checkpoint_every must be >= 0 (0: no checkpoints), got ",
                options_.checkpoint_every);
  TRIREME_CHECK(options_.checkpoint_every == 0 || !options_.checkpoint_dir.empty(), "Resumable: checkpoint_every is ",
                options_.checkpoint_every, " but checkpoint_dir is empty; name the directory to write them to");
  TRIREME_CHECK(options_.snapshot_every >= -1,
                "Resumable: snapshot_every must be >= 0, or -1 (every step under --max-restarts), got ",
                options_.snapshot_every);
  for (const auto& group : optimizer.param_groups())
    TRIREME_CHECK(!static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad(),
                  "Resumable: AdamW's amsgrad is not supported (its max_exp_avg_sq is not saved, so a resume "
                  "would lose it); use amsgrad(false)");
  state_.world = &world;
  state_.data_parallel = options_.data_parallel;
  for (const auto& item : model.named_parameters()) {
    const at::ScalarType dtype = item.value().scalar_type();
    TRIREME_CHECK(dtype == at::kFloat || dtype == at::kDouble, "Resumable: parameter '", item.key(), "' is ",
                  c10::toString(dtype), "; snapshots and checkpoints hold float32 and float64 parameters");
    state_.parameters.emplace_back(item.key(), item.value());
  }
  TRIREME_CHECK(!state_.parameters.empty(), "Resumable: the model has no parameters; give it the model it trains");
  for (const auto& item : model.named_buffers()) {
    if (!item.value().defined()) continue;
    TRIREME_CHECK(checkpoint_dtype_supported(item.value().scalar_type()), "Resumable: buffer '", item.key(),
                  "' is ", c10::toString(item.value().scalar_type()),
                  "; snapshots and checkpoints hold float32, float64, int64 and uint8 tensors");
    state_.buffers.emplace_back(item.key(), item.value());
  }
  state_.dp = world.size();
  state_.dp_rank = world.rank();
  state_.adamw = &optimizer;
  state_.layout = {"dp=" + std::to_string(world.size()), world.size(), 1, 1, 0, -1, "", ""};
  state_.share_snapshots = options_.share_snapshots && !elastic_from_env();
  area_ = snapshot_area_on_every_node(state_);
  snapshot_dir_ = area_.empty() ? "" : snapshot_dir_from_env(world.rank());
  snapshot_every_ = snapshot_interval(options_.snapshot_every, snapshot_dir_);
  CheckpointLayout own = state_.layout;
  own.rank = world.rank();
  if (snapshot_every_ > 0) snapshotter_ = std::make_unique<Snapshotter>(snapshot_dir_, own);
  if (options_.checkpoint_every > 0)
    checkpointer_ = checkpoint_writer(state_, options_.checkpoint_dir, options_.keep_checkpoints);
}

Resumable::~Resumable() = default;  // each writer's destructor finishes its write in flight

int64_t Resumable::resume() {
  int64_t step = 0, floor = 0;
  const std::string& area = area_;
  const bool elastic = elastic_from_env();
  if (world_restarted() && !area.empty() && (elastic || !snapshot_dir_.empty()) && !options_.checkpoint_dir.empty())
    step = load_newer_checkpoint(state_, options_.checkpoint_dir, memory_step_bound(state_, area, elastic), &floor);
  if (step == 0 && world_restarted() && elastic && !area.empty())
    step = load_from_memory(state_, area, nullptr, floor);  // the membership may have changed
  else if (step == 0 && world_restarted() && !snapshot_dir_.empty())
    step = load_snapshot(state_, snapshot_dir_, nullptr, floor);
  if (step == 0 && !options_.checkpoint_dir.empty()) step = load_checkpoint(state_, options_.checkpoint_dir);
  last_step_ = step;
  return step;
}

void Resumable::step_done(int64_t steps_done) {
  TRIREME_CHECK(steps_done > last_step_, "Resumable::step_done(", steps_done, ") after step ", last_step_,
                ": each call names a later step (the steps done, counted from 0 or from the step resume() returned)");
  last_step_ = steps_done;
  // The program's next optimizer step is out of sight, so the copies are finished at once:
  // a GPU's are waited for (ft/host_copy.h), host state the writer thread has not copied
  // yet is copied here (ft/snapshot.h).
  if (snapshotter_ && steps_done % snapshot_every_ == 0) {
    take_snapshot(state_, *snapshotter_, steps_done);
    snapshotter_->before_update();
  }
  if (checkpointer_ && steps_done % options_.checkpoint_every == 0) {
    save_checkpoint_async(state_, *checkpointer_, steps_done);
    checkpointer_->before_update();
  }
}

void Resumable::wait() {
  if (snapshotter_) snapshotter_->wait();
  if (checkpointer_) checkpointer_->wait();
}

}  // namespace trireme::ft
