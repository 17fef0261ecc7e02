// Layer lists and stage modules; see parallel/pipeline/stage.h.
#include "trireme/parallel/pipeline/stage.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "trireme/common/error.h"
#include "trireme/obs/clock.h"

namespace trireme::pipeline {

std::vector<double> parameter_costs(const LayerList& layers) {
  std::vector<double> costs;
  for (const auto& layer : layers) {
    double n = 0;
    for (const auto& [name, module] : layer.modules)
      for (const auto& p : module->parameters()) n += static_cast<double>(p.numel());
    costs.push_back(n);
  }
  return costs;
}

std::vector<double> measured_costs(const LayerList& layers, const at::Tensor& input, int reps) {
  TRIREME_CHECK(reps >= 1, "measured_costs needs at least one repetition");
  std::vector<double> costs;
  at::Tensor x = input;
  for (const auto& layer : layers) {
    std::vector<double> times;
    at::Tensor out;
    for (int r = 0; r <= reps; ++r) {  // run 0 warms up
      at::Tensor in = x.is_floating_point() ? x.detach().requires_grad_(true) : x;
      const double start = obs::now_us();
      out = layer.forward(in);
      out.backward(at::ones_like(out));
      if (r > 0) times.push_back((obs::now_us() - start) / 1e3);
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    costs.push_back(times[times.size() / 2]);
    x = out.detach();
    for (const auto& [name, module] : layer.modules)
      for (auto& p : module->parameters()) p.mutable_grad() = at::Tensor();
  }
  return costs;
}

StageModule::StageModule(const LayerList& layers, std::vector<LayerRange> ranges)
    : ranges_(std::move(ranges)) {
  const int n = static_cast<int>(layers.size());
  // Tied weights (one parameter in two layers) would be stepped twice on one stage, and on
  // two stages trained as two untied copies: refused until the pipeline sums their gradients.
  std::map<const void*, std::string> owner;
  for (const auto& layer : layers)
    for (const auto& [name, module] : layer.modules)
      for (const auto& item : module->named_parameters()) {
        const auto [it, fresh] = owner.emplace(item.value().unsafeGetTensorImpl(), layer.name);
        TRIREME_CHECK(fresh || it->second == layer.name, "layers ", it->second, " and ", layer.name,
                      " share parameter '", name, ".", item.key(),
                      "': tied weights are not supported in a pipeline yet; untie them or train without --pp");
      }
  for (const auto& range : ranges_) {
    TRIREME_CHECK(range.begin >= 0 && range.begin < range.end && range.end <= n, "layer range ",
                  range.begin, ":", range.end, " is outside the model's ", n, " layers");
    first_kept_.push_back(static_cast<int>(layers_.size()));
    for (int l = range.begin; l < range.end; ++l) {
      layers_.push_back(layers[l]);
      for (const auto& [name, module] : layers[l].modules) {
        std::string key = name;
        std::replace(key.begin(), key.end(), '.', '_');  // submodule names cannot hold dots
        register_module(key, module);
      }
    }
  }
}

std::vector<PartForward> StageModule::parts() const {
  std::vector<PartForward> parts;
  for (size_t c = 0; c < ranges_.size(); ++c) {
    const int count = ranges_[c].end - ranges_[c].begin;
    std::vector<PartForward> forwards;
    for (int k = 0; k < count; ++k) forwards.push_back(layers_[first_kept_[c] + k].forward);
    parts.push_back([forwards](const at::Tensor& x) {
      at::Tensor y = x;
      for (const auto& forward : forwards) y = forward(y);
      return y;
    });
  }
  return parts;
}

std::vector<std::pair<std::string, at::Tensor>> StageModule::named_model_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& layer : layers_)
    for (const auto& [name, module] : layer.modules)
      for (const auto& item : module->named_parameters()) named.emplace_back(name + "." + item.key(), item.value());
  return named;
}

std::string StageModule::describe_chunk(int chunk) const {
  std::string out;
  const LayerRange& range = ranges_.at(chunk);
  for (int k = 0; k < range.end - range.begin; ++k)
    out += (k ? "," : "") + layers_[first_kept_[chunk] + k].name;
  return out;
}

}  // namespace trireme::pipeline
