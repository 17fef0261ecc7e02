// A model given as an ordered list of layers, and the part of it one pipeline stage holds.
//
//   Layer          a named step of the model's forward (embeddings, one block, the head)
//                  with the modules it owns; its forward maps the previous layer's output
//                  to its own. A model exposes itself as a LayerList (e.g. GptImpl::layers)
//   StageModule    the layers of one stage's chunks (LayerRange per chunk, partition.h),
//                  registered as submodules, so its parameters() are exactly the stage's.
//                  Build the whole model, take its layer list, build the StageModule and
//                  drop the rest: the other stages' layers are then freed. (Building the
//                  whole model first is what makes every stage's initial values equal, slice
//                  for slice, to the one-process model with the same seed; its cost is the
//                  whole model's memory once, at start-up.)
//   layer costs    for balance_partition: parameter counts, or measured forward+backward
//                  time per layer
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trireme/parallel/pipeline/executor.h"
#include "trireme/parallel/pipeline/partition.h"

namespace trireme::pipeline {

struct Layer {
  std::string name;  // e.g. "h.3"
  // The modules the layer owns, with their names in the whole model ("wte", "h.3").
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules;
  PartForward forward;
};
using LayerList = std::vector<Layer>;

// Parameter count of each layer.
std::vector<double> parameter_costs(const LayerList& layers);

// Milliseconds of forward plus backward of each layer, median of `reps` runs (after one
// warm-up), feeding each layer the previous layer's output for `input`. Gradients the
// measurement produced are cleared.
std::vector<double> measured_costs(const LayerList& layers, const at::Tensor& input, int reps);

class StageModule : public torch::nn::Module {
 public:
  // ranges[c] are the layers of chunk c. Throws InvalidArgument for a range outside the list.
  StageModule(const LayerList& layers, std::vector<LayerRange> ranges);

  // One forward per chunk, for StageExecutor.
  std::vector<PartForward> parts() const;
  // The stage's parameters named as in the whole model, e.g. "h.3.attn.qkv.weight".
  std::vector<std::pair<std::string, at::Tensor>> named_model_parameters() const;
  const std::vector<LayerRange>& ranges() const { return ranges_; }
  // "embeddings,h.0,h.1" for chunk c.
  std::string describe_chunk(int chunk) const;

 private:
  std::vector<LayerRange> ranges_;
  std::vector<Layer> layers_;  // the kept layers, in model order
  std::vector<int> first_kept_;  // per chunk: index into layers_ of its first layer
};

}  // namespace trireme::pipeline
