// Helpers the engines of `trireme train gpt` share; see cli/train_engine.h.
#include "trireme/cli/train_engine.h"

#include <chrono>
#include <thread>

#include "trireme/plan/plan.h"

namespace trireme::cli {

EmulatedSlowdown::EmulatedSlowdown(const TrainOptions& options, int rank)
    : factor_(plan::slowdown_of(options.emulate_slowdown, rank)) {}

void EmulatedSlowdown::after(double seconds) const {
  if (factor_ > 1 && seconds > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>((factor_ - 1) * seconds));
}

tensor::TensorParallel tensor_parallel(const dist::MeshGroups& groups, uint64_t seed, at::Device device) {
  tensor::TensorParallel tp;
  tp.size = groups.size("tp");
  tp.rank = groups.coord("tp");
  if (tp.size > 1) {
    tp.group = groups.axis("tp");
    tp.rng = std::make_shared<tensor::RngTracker>(
        tensor::split_stream_seed(seed, groups.coord("dp"), groups.coord("pp")), tp.rank, device);
  }
  return tp;
}

optim::NormSharing norm_sharing(const std::vector<at::Tensor>& params,
                                const std::vector<std::pair<std::string, at::Tensor>>& named,
                                const std::map<std::string, tensor::ShardSpec>& specs,
                                const tensor::TensorParallel& tp, std::vector<dist::Group> split_groups) {
  optim::NormSharing sharing;
  if (tp.active()) {
    sharing.groups.push_back(tp.group);
    std::map<const void*, std::string> name_of;
    for (const auto& [name, tensor] : named) name_of[tensor.unsafeGetTensorImpl()] = name;
    for (const at::Tensor& p : params) {
      auto spec = specs.find(name_of.at(p.unsafeGetTensorImpl()));
      const bool replicated = spec == specs.end() || spec->second.replicated();
      sharing.counted.push_back(!replicated || tp.rank == 0);
    }
  }
  for (auto& g : split_groups)
    if (g && g->getSize() > 1) sharing.groups.push_back(std::move(g));
  return sharing;
}

std::vector<std::pair<std::string, at::Tensor>> gather_parameters(
    const std::vector<std::pair<std::string, at::Tensor>>& named,
    const std::map<std::string, tensor::ShardSpec>& specs, const tensor::TensorParallel& tp, bool keep) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, tensor] : named) {
    auto spec = specs.find(name);
    at::Tensor whole = tp.active() && spec != specs.end() && !spec->second.replicated()
                           ? tensor::gather_shards(tensor.detach(), spec->second, tp)
                           : tensor;
    if (keep) out.emplace_back(name, whole);
  }
  return out;
}

}  // namespace trireme::cli
