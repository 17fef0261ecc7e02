// ZeRO on the data-parallel axis: each of the d ranks of a data-parallel group keeps the
// optimizer state (and under stage 2 the reduced gradients) of 1/d of the parameters.
//
// What a rank owns follows DataParallel's buckets (comm/shard.h): every bucket is cut into
// d chunks and rank r owns chunk r, i.e. the pieces of the bucket's parameters that fall
// into it. The pieces are views into the parameters, and libtorch's own AdamW runs on
// them: AdamW is elementwise and keeps its state (step, exp_avg, exp_avg_sq) per tensor,
// so updating the pieces is, element for element, the update AdamW would make to the
// whole parameters -- the same arithmetic, not a re-implementation. A piece whose
// parameter got no gradient in a step is skipped, exactly as AdamW skips the parameter.
//
//   stage 1   DataParallel all-reduces gradients as usual; each rank's pieces take their
//             gradients from views of the averaged .grad; optimizer state is 1/d.
//   stage 2   DataParallel reduce-scatters (Reduction::kReduceScatter): a rank receives
//             only its averaged chunks and releases the parameters' .grad, so gradients
//             held between backward and the optimizer step are 1/d as well. Not so during
//             backward: a launched bucket's reduce-scatter buffer is the whole bucket (d
//             chunks), and every launched bucket keeps it until the step ends, so at the
//             end of backward the buffers add up to all gradients, as under stage 1 (the
//             parameters' .grad are released as their buckets launch, so this replaces
//             rather than adds to them).
//
// After the pieces are updated, every bucket's chunks are all-gathered, so every rank
// holds the whole, updated parameters for the next forward; two buckets are gathered at
// a time, so the gather adds at most two buckets' worth of memory. Communication per step and
// rank, for N gradient elements: stage 1 = all-reduce (2(d-1)/d N) + all-gather
// ((d-1)/d N); stage 2 = reduce-scatter + all-gather = 2(d-1)/d N, the all-reduce's volume.
//
// Global-norm clipping sees only the pieces: norm_sharing() adds the data-parallel group
// to the groups whose partial squared norms are summed, so the norm is the whole model's.
#pragma once

#include <torch/optim/adamw.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "trireme/optim/clip.h"
#include "trireme/parallel/data/data_parallel.h"

namespace trireme::parallel {

// Bytes of AdamW state (exp_avg, exp_avg_sq, max_exp_avg_sq) held by `optimizer`.
int64_t adamw_state_bytes(const torch::optim::AdamW& optimizer);

// AdamW's state of one tensor, as checkpoints and snapshots keep it.
struct AdamWState {
  int64_t step = 0;  // 0: no state yet (the tensors are then undefined)
  at::Tensor exp_avg, exp_avg_sq;
};
// The state `optimizer` holds for the tensor whose TensorImpl is `key` (step 0 if none).
AdamWState adamw_state(const torch::optim::AdamW& optimizer, const void* key);
// Replaces that state with `state` (the tensors as given); step 0 removes it.
void set_adamw_state(torch::optim::AdamW& optimizer, const void* key, const AdamWState& state);

class ZeroOptimizer {
 public:
  // `dp` must use Reduction::kReduceScatter for stage 2, kAllReduce for stage 1, and keep
  // its buckets (rebuild_buckets off: what a rank owns must not move). Throws
  // InvalidArgument otherwise, for a stage other than 1 or 2, or for amsgrad (its
  // max_exp_avg_sq is neither gathered nor saved).
  ZeroOptimizer(DataParallel& dp, int stage, const torch::optim::AdamWOptions& options);

  int stage() const { return stage_; }
  DataParallel& data_parallel() const { return dp_; }
  // This rank's pieces; after attach_gradients() each carries its averaged gradient (or
  // none, when no rank had one for its parameter).
  const std::vector<at::Tensor>& parameters() const { return pieces_; }
  // Points the pieces' gradients at this step's averaged gradients. Call after the step's
  // gradients are synchronised (DataParallel's step ended).
  void attach_gradients();
  // NormSharing for parameters(), from `whole`'s, which describes `params` (the data
  // parallel module's parameters, any order): a piece counts where its parameter counts,
  // and the data-parallel group joins the groups summed over.
  optim::NormSharing norm_sharing(const std::vector<at::Tensor>& params, const optim::NormSharing& whole) const;
  void set_lr(double lr);
  // AdamW on the pieces, then the all-gather that gives every rank the whole parameters.
  void step();
  // Drops the gradients: the pieces', and the parameters' (stage 1).
  void zero_grad();

  // AdamW's state of one whole (rank-local) parameter, for checkpoints.
  using ParamState = AdamWState;
  // Every parameter's state, assembled from the ranks' pieces (aligned with
  // dp.parameters()). A collective over the data-parallel group: every rank calls it, each
  // with its own `wanted`. Only parameters p with wanted(p) (all, when `wanted` is empty)
  // get their state allocated and filled; the others are left with step 0 and undefined
  // moments. A checkpoint where each replica saves a share of the parameters passes its
  // share, and holds 2x that share's elements plus one bucket's gathered chunks at a time,
  // instead of the whole model's state.
  std::vector<ParamState> gather_state(const std::function<bool(size_t)>& wanted = {});
  // Takes each piece's part of `states` (aligned with dp.parameters()); parameters with
  // step 0 get no state.
  void load_state(const std::vector<ParamState>& states);

  // The AdamW state of this rank's own pieces (aligned with parameters()), and its
  // restoration: what a snapshot of the same layout keeps, without any communication.
  std::vector<ParamState> piece_states() const;
  void load_piece_states(const std::vector<ParamState>& states);

  const torch::optim::AdamW& optimizer() const { return *adamw_; }
  int64_t optimizer_state_bytes() const { return adamw_state_bytes(*adamw_); }
  // Where each of this rank's pieces lies (aligned with parameters()): elements
  // [offset, offset + length) of dp.parameters()[param], flattened. What a snapshot
  // records, so that another layout can find every element's state.
  struct PieceSpan {
    size_t param = 0;
    int64_t offset = 0, length = 0;
  };
  std::vector<PieceSpan> piece_spans() const;
  // Elements this rank owns (its share of the parameters).
  int64_t owned_elements() const { return owned_; }

 private:
  struct Piece {
    size_t bucket = 0;
    size_t param = 0;  // index into dp.parameters()
    size_t k = 0;      // index within the bucket
    int64_t param_offset = 0, chunk_offset = 0, length = 0;
  };

  // All-gathers, bucket by bucket (two in flight), the chunks built from value(piece
  // index) into destination(parameter index) (a flat view of a dp.parameters()-shaped
  // tensor; an undefined one skips that parameter).
  void all_gather_chunks(const std::function<at::Tensor(size_t)>& value,
                         const std::function<at::Tensor(size_t)>& destination, const char* what);

  DataParallel& dp_;
  int stage_;
  std::vector<Piece> layout_;
  std::vector<at::Tensor> pieces_;
  std::vector<int64_t> chunk_of_bucket_;
  std::unique_ptr<torch::optim::AdamW> adamw_;
  int64_t owned_ = 0;
};

}  // namespace trireme::parallel
