// ZeroOptimizer: AdamW on this rank's pieces, then an all-gather per bucket; see zero.h.
#include "trireme/parallel/data/zero.h"

#include <map>

#include "trireme/comm/shard.h"
#include "trireme/common/error.h"

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

ZeroOptimizer::ZeroOptimizer(DataParallel& dp, int stage, const torch::optim::AdamWOptions& options)
    : dp_(dp), stage_(stage) {
  TRIREME_CHECK(stage == 1 || stage == 2, "--zero ", stage, " is not a ZeRO stage; use 1 or 2");
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
  const int d = dp_.group()->getSize();
  if (d == 1) return;
  at::NoGradGuard no_grad;
  const auto& params = dp_.parameters();
  // Every bucket's chunk goes out at once; each is unpacked as it arrives.
  std::vector<at::Tensor> gathered(dp_.buckets().size());
  std::vector<c10::intrusive_ptr<c10d::Work>> works(dp_.buckets().size());
  std::vector<at::Tensor> mine(dp_.buckets().size());
  for (size_t b = 0; b < dp_.buckets().size(); ++b) {
    const at::Tensor& first = params[dp_.buckets()[b].front()];
    mine[b] = at::zeros({chunk_of_bucket_[b]}, first.options().requires_grad(false));
    gathered[b] = at::empty({d * chunk_of_bucket_[b]}, mine[b].options());
  }
  for (size_t i = 0; i < layout_.size(); ++i)
    mine[layout_[i].bucket].narrow(0, layout_[i].chunk_offset, layout_[i].length).copy_(pieces_[i]);
  for (size_t b = 0; b < works.size(); ++b) {
    try {
      works[b] = dp_.group()->_allgather_base(gathered[b], mine[b]);
    } catch (const std::exception& e) {
      TRIREME_THROW(CommError, "ZeRO parameter all-gather of bucket ", b, " could not be issued: ",
                    dist::error_text(e));
    }
  }
  for (size_t b = 0; b < works.size(); ++b) {
    dist::wait_work(works[b], "ZeRO parameter all-gather");
    const auto& bucket = dp_.buckets()[b];
    int64_t begin = 0;
    for (size_t p : bucket) {
      at::Tensor flat = params[p].detach().view(-1);
      for (const comm::Segment& s : comm::split_by_chunks(begin, flat.numel(), chunk_of_bucket_[b]))
        flat.narrow(0, s.offset, s.length)
            .copy_(gathered[b].narrow(0, s.chunk * chunk_of_bucket_[b] + s.chunk_offset, s.length));
      begin += flat.numel();
    }
  }
}

void ZeroOptimizer::zero_grad() {
  for (auto& piece : pieces_) piece.mutable_grad().reset();
  if (stage_ == 1)
    for (const auto& p : dp_.parameters()) p.mutable_grad().reset();
}

}  // namespace trireme::parallel
