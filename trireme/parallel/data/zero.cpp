// ZeroOptimizer: AdamW on this rank's pieces, then an all-gather per bucket; see zero.h.
#include "trireme/parallel/data/zero.h"

#include <algorithm>
#include <map>

#include "trireme/comm/shard.h"
#include "trireme/common/error.h"
#include "trireme/dist/backend.h"

namespace trireme::parallel {

int64_t adamw_state_bytes(const torch::optim::AdamW& optimizer) {
  int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
    for (const at::Tensor* t : {&s.exp_avg(), &s.exp_avg_sq(), &s.max_exp_avg_sq()})
      if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  }
  return bytes;
}

AdamWState adamw_state(const torch::optim::AdamW& optimizer, const void* key) {
  auto it = optimizer.state().find(const_cast<void*>(key));
  if (it == optimizer.state().end()) return {};
  const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
  return {s.step(), s.exp_avg(), s.exp_avg_sq()};
}

void set_adamw_state(torch::optim::AdamW& optimizer, const void* key, const AdamWState& state) {
  optimizer.state().erase(const_cast<void*>(key));
  if (state.step == 0) return;
  auto kept = std::make_unique<torch::optim::AdamWParamState>();
  kept->step(state.step);
  kept->exp_avg(state.exp_avg);
  kept->exp_avg_sq(state.exp_avg_sq);
  optimizer.state()[const_cast<void*>(key)] = std::move(kept);
}

ZeroOptimizer::ZeroOptimizer(DataParallel& dp, int stage, const torch::optim::AdamWOptions& options)
    : dp_(dp), stage_(stage) {
  TRIREME_CHECK(stage == 1 || stage == 2, "--zero ", stage, " is not a ZeRO stage; use 1 or 2");
  TRIREME_CHECK(!options.amsgrad(), "ZeRO does not support AdamW's amsgrad: its max_exp_avg_sq is neither gathered "
                "nor saved, so a checkpoint or snapshot would lose it; use amsgrad(false)");
  using Reduction = DataParallelOptions::Reduction;
  TRIREME_CHECK(dp.options().reduction == (stage == 2 ? Reduction::kReduceScatter : Reduction::kAllReduce),
                "ZeRO-", stage, " needs DataParallel with ",
                stage == 2 ? "Reduction::kReduceScatter" : "Reduction::kAllReduce");
  TRIREME_CHECK(!dp.options().rebuild_buckets,
                "ZeRO needs DataParallel with rebuild_buckets = false (each rank's shard follows the buckets)");
  const int d = dp.group()->getSize();
  const int rank = dp.group()->getRank();
  const auto& params = dp.parameters();
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < dp.buckets().size(); ++b) {
    const auto& bucket = dp.buckets()[b];
    std::vector<int64_t> numels;
    int64_t total = 0;
    for (size_t p : bucket) {
      numels.push_back(params[p].numel());
      total += params[p].numel();
    }
    chunk_of_bucket_.push_back(comm::chunk_length(total, d));
    for (const comm::ShardPiece& piece : comm::owned_pieces(numels, d, rank)) {
      const size_t p = bucket[piece.param];
      TRIREME_CHECK(params[p].is_contiguous(), "ZeRO needs contiguous parameters");
      layout_.push_back({b, p, piece.param, piece.param_offset, piece.chunk_offset, piece.length});
      pieces_.push_back(params[p].detach().view(-1).narrow(0, piece.param_offset, piece.length));
      owned_ += piece.length;
    }
  }
  adamw_ = std::make_unique<torch::optim::AdamW>(pieces_, options);
}

void ZeroOptimizer::attach_gradients() {
  const auto& params = dp_.parameters();
  for (size_t i = 0; i < layout_.size(); ++i) {
    const Piece& piece = layout_[i];
    at::Tensor grad;
    if (stage_ == 2) {
      if (dp_.had_gradient(piece.bucket, piece.k))
        grad = dp_.gradient_shard(piece.bucket).narrow(0, piece.chunk_offset, piece.length);
    } else if (params[piece.param].grad().defined()) {
      grad = params[piece.param].grad().view(-1).narrow(0, piece.param_offset, piece.length);
    }
    pieces_[i].mutable_grad() = grad;
  }
}

optim::NormSharing ZeroOptimizer::norm_sharing(const std::vector<at::Tensor>& params,
                                              const optim::NormSharing& whole) const {
  std::map<const void*, bool> counted;
  for (size_t i = 0; i < params.size(); ++i)
    counted[params[i].unsafeGetTensorImpl()] = whole.counted.empty() || whole.counted[i];
  optim::NormSharing out;
  out.groups = whole.groups;
  if (dp_.group()->getSize() > 1) out.groups.push_back(dp_.group());
  const auto& dp_params = dp_.parameters();
  for (const Piece& piece : layout_) {
    const auto it = counted.find(dp_params[piece.param].unsafeGetTensorImpl());
    out.counted.push_back(it == counted.end() || it->second);
  }
  return out;
}

void ZeroOptimizer::set_lr(double lr) {
  for (auto& group : adamw_->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
}

void ZeroOptimizer::step() {
  adamw_->step();
  if (dp_.group()->getSize() == 1) return;
  const auto& params = dp_.parameters();
  all_gather_chunks([&](size_t i) { return pieces_[i]; },
                    [&](size_t p) { return params[p].detach().view(-1); }, "ZeRO parameter all-gather");
}

void ZeroOptimizer::all_gather_chunks(const std::function<at::Tensor(size_t)>& value,
                                      const std::function<at::Tensor(size_t)>& destination, const char* what) {
  const int d = dp_.group()->getSize();
  at::NoGradGuard no_grad;
  const auto& params = dp_.parameters();
  const size_t n = dp_.buckets().size();
  std::vector<std::vector<size_t>> pieces_of(n);  // bucket -> indices into layout_
  for (size_t i = 0; i < layout_.size(); ++i) pieces_of[layout_[i].bucket].push_back(i);
  // Two buckets in flight at a time: bucket b+1's gather runs while b's is unpacked, and
  // each gathered buffer (d chunks, the whole bucket) goes as soon as it is unpacked. The
  // result is the same bytes whatever the window: a gather only moves them.
  constexpr size_t kInFlight = 2;
  std::vector<at::Tensor> gathered(n);
  std::vector<c10::intrusive_ptr<c10d::Work>> works(n);
  const auto issue = [&](size_t b) {
    const at::Tensor& first = params[dp_.buckets()[b].front()];
    at::Tensor mine = at::zeros({chunk_of_bucket_[b]}, first.options().requires_grad(false));
    for (size_t i : pieces_of[b]) mine.narrow(0, layout_[i].chunk_offset, layout_[i].length).copy_(value(i));
    gathered[b] = at::empty({d * chunk_of_bucket_[b]}, mine.options());
    try {
      works[b] = dp_.group()->_allgather_base(gathered[b], mine);
    } catch (const std::exception& e) {
      TRIREME_THROW(CommError, what, " of bucket ", b, " could not be issued: ", dist::error_text(e));
    }
  };
  for (size_t b = 0; b < std::min(n, kInFlight); ++b) issue(b);
  for (size_t b = 0; b < n; ++b) {
    dist::wait_work(works[b], what);
    works[b].reset();
    int64_t begin = 0;
    for (size_t p : dp_.buckets()[b]) {
      const int64_t numel = params[p].numel();
      at::Tensor flat = destination(p);
      if (flat.defined())  // undefined: not wanted here
        for (const comm::Segment& s : comm::split_by_chunks(begin, numel, chunk_of_bucket_[b]))
          flat.narrow(0, s.offset, s.length)
              .copy_(gathered[b].narrow(0, s.chunk * chunk_of_bucket_[b] + s.chunk_offset, s.length));
      begin += numel;
    }
    gathered[b] = at::Tensor();
    if (b + kInFlight < n) issue(b + kInFlight);
  }
}

std::vector<ZeroOptimizer::ParamState> ZeroOptimizer::gather_state(const std::function<bool(size_t)>& wanted) {
  const auto& params = dp_.parameters();
  std::vector<ParamState> states(params.size());
  const auto keep = [&](size_t p) { return !wanted || wanted(p); };
  // Steps: each piece's owner reports its parameter's step; the maximum is the step.
  at::Tensor steps = at::zeros({static_cast<int64_t>(params.size())}, at::kLong);
  std::vector<AdamWState> own;  // this rank's pieces'
  for (const at::Tensor& piece : pieces_) own.push_back(adamw_state(*adamw_, piece.unsafeGetTensorImpl()));
  for (size_t i = 0; i < layout_.size(); ++i)
    if (own[i].step > 0) steps[static_cast<int64_t>(layout_[i].param)] = own[i].step;
  steps = dist::all_reduce(dp_.group(), steps, c10d::ReduceOp::MAX, params.front().device(), "ZeRO step gather").cpu();
  const auto* step_of = steps.data_ptr<int64_t>();
  for (size_t p = 0; p < params.size(); ++p) {
    if (!keep(p) || step_of[p] == 0) continue;  // no state: step 0, undefined moments
    states[p].step = step_of[p];
    states[p].exp_avg = at::zeros_like(params[p].detach());
    states[p].exp_avg_sq = at::zeros_like(params[p].detach());
  }
  for (int moment = 0; moment < 2; ++moment) {
    const auto value = [&](size_t i) {
      if (own[i].step == 0) return at::zeros_like(pieces_[i]);
      return moment == 0 ? own[i].exp_avg : own[i].exp_avg_sq;
    };
    const auto destination = [&](size_t p) {  // undefined where not kept
      const at::Tensor& moment_p = moment == 0 ? states[p].exp_avg : states[p].exp_avg_sq;
      return moment_p.defined() ? moment_p.view(-1) : at::Tensor();
    };
    if (dp_.group()->getSize() > 1) {
      all_gather_chunks(value, destination, "ZeRO optimizer-state gather");
    } else {
      for (size_t i = 0; i < layout_.size(); ++i) {
        at::Tensor flat = destination(layout_[i].param);
        if (flat.defined()) flat.narrow(0, layout_[i].param_offset, layout_[i].length).copy_(value(i));
      }
    }
  }
  return states;
}

std::vector<ZeroOptimizer::ParamState> ZeroOptimizer::piece_states() const {
  std::vector<ParamState> out(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) out[i] = adamw_state(*adamw_, pieces_[i].unsafeGetTensorImpl());
  return out;
}

std::vector<ZeroOptimizer::PieceSpan> ZeroOptimizer::piece_spans() const {
  std::vector<PieceSpan> out;
  for (const Piece& piece : layout_) out.push_back({piece.param, piece.param_offset, piece.length});
  return out;
}

void ZeroOptimizer::load_piece_states(const std::vector<ParamState>& states) {
  TRIREME_CHECK(states.size() == pieces_.size(), "ZeRO: ", states.size(), " piece states for ", pieces_.size(),
                " pieces (a snapshot of another layout)");
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const ParamState& s = states[i];
    TRIREME_CHECK(s.step == 0 || s.exp_avg.numel() == pieces_[i].numel(), "ZeRO: piece ", i, " has ",
                  pieces_[i].numel(), " elements, its saved state ", s.exp_avg.numel());
    const at::Device device = pieces_[i].device();
    set_adamw_state(*adamw_, pieces_[i].unsafeGetTensorImpl(),
                    s.step == 0 ? AdamWState{} : AdamWState{s.step, s.exp_avg.to(device), s.exp_avg_sq.to(device)});
  }
}

void ZeroOptimizer::load_state(const std::vector<ParamState>& states) {
  TRIREME_CHECK(states.size() == dp_.parameters().size(), "ZeRO load_state: ", states.size(),
                " parameter states for ", dp_.parameters().size(), " parameters");
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < layout_.size(); ++i) {
    const ParamState& s = states[layout_[i].param];
    const auto mine = [&](const at::Tensor& whole) {  // this piece's part of a parameter's moment
      return whole.reshape(-1).narrow(0, layout_[i].param_offset, layout_[i].length).clone();
    };
    set_adamw_state(*adamw_, pieces_[i].unsafeGetTensorImpl(),
                    s.step == 0 ? AdamWState{} : AdamWState{s.step, mine(s.exp_avg), mine(s.exp_avg_sq)});
  }
}

void ZeroOptimizer::zero_grad() {
  for (auto& piece : pieces_) piece.mutable_grad().reset();
  if (stage_ == 1)
    for (const auto& p : dp_.parameters()) p.mutable_grad().reset();
}

}  // namespace trireme::parallel
