#include "trireme/plan/profile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <numeric>

#include "trireme/common/error.h"
#include "trireme/parallel/pipeline/partition.h"
#include "trireme/plan/json_reader.h"

namespace trireme::plan {

namespace {

// The most ranks a profile's whole-step rows may have measured on (one machine's), and the
// most micro-batches (trireme train's --micro-batches bound).
constexpr int64_t kMaxProfiledRanks = 4096;
constexpr int64_t kMaxProfiledMicroBatches = 1 << 20;

double work_of(const LayerTiming& row, Work work) {
  switch (work) {
    case Work::kForward: return row.forward_s;
    case Work::kBackwardInput: return row.backward_input_s;
    case Work::kBackwardWeight: return row.backward_weight_s;
  }
  return 0;
}

// Linear in b through two rows (or through the origin and one row).
template <typename Value>
double interpolate(const std::vector<LayerTiming>& rows, double b, Value value) {
  TRIREME_CHECK(!rows.empty(), "a profiled layer has no timing rows");
  if (rows.size() == 1) return value(rows[0]) * b / static_cast<double>(rows[0].micro_batch);
  size_t hi = 1;
  while (hi + 1 < rows.size() && static_cast<double>(rows[hi].micro_batch) < b) ++hi;
  const LayerTiming& a = rows[hi - 1];
  const LayerTiming& c = rows[hi];
  const double slope =
      (value(c) - value(a)) / static_cast<double>(c.micro_batch - a.micro_batch);
  return std::max(0.0, value(a) + slope * (b - static_cast<double>(a.micro_batch)));
}

nlohmann::ordered_json link_json(const Link& link) {
  return {{"latency_s", link.latency_s}, {"bandwidth_Bps", link.bandwidth_Bps}};
}

Link read_link(const Field& f) {
  f.only({"latency_s", "bandwidth_Bps", "world"});
  return Link{f.at("latency_s").non_negative(), f.at("bandwidth_Bps").positive()};
}

std::vector<LayerTiming> read_rows(const Field& rows) {
  std::vector<LayerTiming> out;
  for (const Field& tf : rows.items()) {
    tf.only({"micro_batch", "forward_s", "backward_input_s", "backward_weight_s", "activation_bytes",
             "output_bytes"});
    LayerTiming t;
    t.micro_batch = tf.at("micro_batch").integer(1);
    if (!out.empty() && t.micro_batch <= out.back().micro_batch)
      tf.at("micro_batch").fail("must be larger than the row before it (rows ascend)");
    t.forward_s = tf.at("forward_s").non_negative();
    t.backward_input_s = tf.at("backward_input_s").non_negative();
    t.backward_weight_s = tf.at("backward_weight_s").non_negative();
    t.activation_bytes = tf.at("activation_bytes").integer(0);
    t.output_bytes = tf.at("output_bytes").integer(0);
    out.push_back(t);
  }
  if (out.empty()) rows.fail("is empty; a layer needs at least one row");
  return out;
}

}  // namespace

double layer_time(const LayerProfile& layer, Work work, double micro_batch) {
  return rows_time(layer.timings, work, micro_batch);
}

double rows_time(const std::vector<LayerTiming>& rows, Work work, double micro_batch) {
  return interpolate(rows, micro_batch, [work](const LayerTiming& row) { return work_of(row, work); });
}

std::vector<double> layer_costs(const Profile& profile, double micro_batch) {
  std::vector<double> costs;
  for (const LayerProfile& layer : profile.layers)
    costs.push_back(layer_time(layer, Work::kForward, micro_batch) + layer_time(layer, Work::kBackwardInput, micro_batch) +
                    layer_time(layer, Work::kBackwardWeight, micro_batch));
  return costs;
}

double in_place_factor(const Profile& profile, double micro_batch) {
  if (profile.whole_model.empty()) return 1.0;
  // The whole-model rows as timing rows (forward_s carries the time) to reuse interpolate.
  std::vector<LayerTiming> rows;
  for (const WholeModelTiming& w : profile.whole_model) {
    LayerTiming t;
    t.micro_batch = w.micro_batch;
    t.forward_s = w.forward_backward_s;
    rows.push_back(t);
  }
  const std::vector<double> costs = layer_costs(profile, micro_batch);
  const double parts = std::accumulate(costs.begin(), costs.end(), 0.0);
  const double whole = rows_time(rows, Work::kForward, micro_batch);
  return parts > 0 && whole > 0 ? whole / parts : 1.0;
}

const std::vector<LayerTiming>* tensor_parallel_rows(const LayerProfile& layer, int tp) {
  for (const TensorParallelTimings& t : layer.tensor_parallel)
    if (t.tp == tp) return &t.timings;
  return nullptr;
}

double layer_activation_bytes(const LayerProfile& layer, double micro_batch) {
  return rows_activation_bytes(layer.timings, micro_batch);
}

double rows_activation_bytes(const std::vector<LayerTiming>& rows, double micro_batch) {
  return interpolate(rows, micro_batch, [](const LayerTiming& row) { return static_cast<double>(row.activation_bytes); });
}

double layer_output_bytes(const LayerProfile& layer, double micro_batch) {
  return interpolate(layer.timings, micro_batch,
                     [](const LayerTiming& row) { return static_cast<double>(row.output_bytes); });
}

std::string to_json(const Profile& p) {
  auto rows_json = [](const std::vector<LayerTiming>& timings) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const LayerTiming& t : timings)
      rows.push_back({{"micro_batch", t.micro_batch},
                      {"forward_s", t.forward_s},
                      {"backward_input_s", t.backward_input_s},
                      {"backward_weight_s", t.backward_weight_s},
                      {"activation_bytes", t.activation_bytes},
                      {"output_bytes", t.output_bytes}});
    return rows;
  };
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const LayerProfile& layer : p.layers) {
    nlohmann::ordered_json entry = {{"name", layer.name},
                                    {"parameters", layer.parameters},
                                    {"optimizer_s", layer.optimizer_s},
                                    {"timings", rows_json(layer.timings)}};
    if (!layer.tensor_parallel.empty()) {
      nlohmann::ordered_json tps = nlohmann::ordered_json::array();
      for (const TensorParallelTimings& t : layer.tensor_parallel)
        tps.push_back({{"tp", t.tp}, {"timings", rows_json(t.timings)}});
      entry["tensor_parallel"] = tps;
    }
    layers.push_back(entry);
  }
  nlohmann::ordered_json allreduce = link_json(p.allreduce);
  allreduce["world"] = p.allreduce_world;
  nlohmann::ordered_json out = {
      {"format", p.format},
      {"source", p.source},
      {"device", p.device},
      {"reference_tflops", p.reference_tflops},
      {"threads", p.threads},
      {"model", model_json(p.model)},
      {"state_bytes",
       {{"param", p.state.param}, {"grad", p.state.grad}, {"optimizer", p.state.optimizer}}},
      {"p2p", link_json(p.p2p)},
      {"allreduce", allreduce},
      {"overlap", p.overlap},
      {"repeats", p.repeats},
      {"layers", layers}};
  if (!p.whole_model.empty()) {
    nlohmann::ordered_json whole = nlohmann::ordered_json::array();
    for (const WholeModelTiming& w : p.whole_model)
      whole.push_back({{"micro_batch", w.micro_batch}, {"forward_backward_s", w.forward_backward_s}});
    out["whole_model"] = whole;
  }
  if (!p.training_step.empty()) {
    nlohmann::ordered_json steps = nlohmann::ordered_json::array();
    for (const TrainingStepTiming& t : p.training_step)
      steps.push_back({{"micro_batch", t.micro_batch}, {"step_s", t.step_s}, {"data_parallel", t.data_parallel}});
    out["training_step"] = steps;
  }
  if (!p.pipeline_step.empty()) {
    nlohmann::ordered_json steps = nlohmann::ordered_json::array();
    for (const PipelineStepTiming& t : p.pipeline_step)
      steps.push_back({{"micro_batch", t.micro_batch}, {"micro_batches", t.micro_batches}, {"stages", t.stages},
                       {"split", t.split}, {"step_s", t.step_s}});
    out["pipeline_step"] = steps;
  }
  return out.dump(1) + "\n";
}

Profile parse_profile(const std::string& text, const std::string& origin) {
  const nlohmann::json doc = Field::parse(text, origin);
  const Field root(doc, "", origin);
  root.only({"format", "source", "device", "reference_tflops", "threads", "model", "state_bytes",
             "p2p", "allreduce", "overlap", "repeats", "layers", "whole_model", "training_step",
             "pipeline_step"});
  Profile p;
  p.format = root.at("format").bounded(1);
  if (p.format != 1) root.at("format").fail("is " + std::to_string(p.format) +
                                            "; this trireme reads format 1: re-run trireme profile");
  p.source = root.str_or("source", p.source);
  p.device = root.str_or("device", p.device);
  p.reference_tflops = root.at("reference_tflops").positive();
  p.threads = root.bounded_or("threads", 1, 1);
  p.model = read_model(root.at("model"));
  if (root.has("state_bytes")) {
    const Field s = root.at("state_bytes");
    s.only({"param", "grad", "optimizer"});
    p.state = StateBytes{s.at("param").positive(), s.at("grad").positive(),
                         s.at("optimizer").non_negative()};
  }
  p.p2p = read_link(root.at("p2p"));
  p.allreduce = read_link(root.at("allreduce"));
  p.allreduce_world = root.at("allreduce").bounded_or("world", 2, 2);
  p.overlap = root.has("overlap") ? root.at("overlap").number() : -1;
  if (p.overlap > 1) root.at("overlap").fail("must be at most 1 (a share of the communication time)");
  p.repeats = root.bounded_or("repeats", 0, 0);
  for (const Field& lf : root.at("layers").items()) {
    lf.only({"name", "parameters", "optimizer_s", "timings", "tensor_parallel"});
    LayerProfile layer;
    layer.name = lf.at("name").str();
    layer.parameters = lf.at("parameters").integer(0);
    layer.optimizer_s = lf.non_negative_or("optimizer_s", 0);
    layer.timings = read_rows(lf.at("timings"));
    if (lf.has("tensor_parallel"))
      for (const Field& tpf : lf.at("tensor_parallel").items()) {
        tpf.only({"tp", "timings"});
        layer.tensor_parallel.push_back(
            {tpf.at("tp").bounded(2), read_rows(tpf.at("timings"))});
      }
    p.layers.push_back(std::move(layer));
  }
  if (root.has("whole_model"))
    for (const Field& wf : root.at("whole_model").items()) {
      wf.only({"micro_batch", "forward_backward_s"});
      WholeModelTiming w{wf.at("micro_batch").integer(1), wf.at("forward_backward_s").positive()};
      if (!p.whole_model.empty() && w.micro_batch <= p.whole_model.back().micro_batch)
        wf.at("micro_batch").fail("must be larger than the row before it (rows ascend)");
      p.whole_model.push_back(w);
    }
  if (root.has("training_step"))
    for (const Field& tf : root.at("training_step").items()) {
      tf.only({"micro_batch", "step_s", "data_parallel"});
      // Calibration replays the step on as many ranks: a count no machine runs (2e9) would
      // allocate per rank until it failed, not name the field.
      TrainingStepTiming t{tf.at("micro_batch").bounded(1), tf.at("step_s").positive(),
                           tf.has("data_parallel") ? tf.at("data_parallel").bounded(1, kMaxProfiledRanks) : 2};
      if (!p.training_step.empty() && t.micro_batch <= p.training_step.back().micro_batch)
        tf.at("micro_batch").fail("must be larger than the row before it (rows ascend)");
      p.training_step.push_back(t);
    }
  if (root.has("pipeline_step"))
    for (const Field& tf : root.at("pipeline_step").items()) {
      tf.only({"micro_batch", "micro_batches", "stages", "split", "step_s"});
      PipelineStepTiming t;
      t.micro_batch = tf.at("micro_batch").bounded(1);
      t.micro_batches = tf.at("micro_batches").bounded(1, kMaxProfiledMicroBatches);
      t.stages = tf.at("stages").bounded(2, kMaxProfiledRanks);
      t.split = tf.at("split").str();
      t.step_s = tf.at("step_s").positive();
      try {
        pipeline::parse_split(t.split, static_cast<int>(p.model.layers + 2), t.stages);
      } catch (const InvalidArgument& e) {
        tf.at("split").fail(std::string("is not a split of the model: ") + e.what());
      }
      if (!p.pipeline_step.empty() && t.micro_batch <= p.pipeline_step.back().micro_batch)
        tf.at("micro_batch").fail("must be larger than the row before it (rows ascend)");
      p.pipeline_step.push_back(t);
    }
  const int64_t expected = p.model.layers + 2;
  if (static_cast<int64_t>(p.layers.size()) != expected)
    root.at("layers").fail("has " + std::to_string(p.layers.size()) + " entries but model.layers " +
                           std::to_string(p.model.layers) + " needs " + std::to_string(expected) +
                           " (embeddings, the blocks, head)");
  return p;
}

Profile read_profile(const std::string& path) {
  return parse_profile(read_text_file(path), path);
}

Profile analytic_profile(const models::GptConfig& m, const std::string& device, double tflops,
                         double utilisation) {
  TRIREME_CHECK(tflops > 0 && utilisation > 0 && utilisation <= 1,
                "an analytic profile needs tflops > 0 and 0 < utilisation <= 1");
  Profile p;
  p.source = "analytic: model FLOPs at " + std::to_string(static_cast<int>(utilisation * 100)) +
             "% of " + device + " peak";
  p.device = device;
  p.reference_tflops = tflops;
  p.model = m;
  p.state = StateBytes{2, 2, 12};
  // Links come from the cluster file for analytic studies; these are placeholders that the
  // cluster's figures replace (a 100 Gb/s network).
  p.p2p = Link{10e-6, 12.5e9};
  p.allreduce = Link{20e-6, 12.5e9};
  p.repeats = 0;
  const double flops_per_s = tflops * 1e12 * utilisation;
  const double T = static_cast<double>(m.seq_len), C = static_cast<double>(m.dim);
  const double V = static_cast<double>(m.vocab), R = static_cast<double>(m.mlp_ratio);
  const double matmul = (8 + 4 * R) * T * C * C;  // per sequence: qkv, proj, fc, proj2
  const double attention = 4 * T * T * C;          // QK^T and AV
  auto row = [&](double f, double b, double w, double act, double out) {
    LayerTiming t;
    t.micro_batch = 1;
    t.forward_s = f / flops_per_s;
    t.backward_input_s = b / flops_per_s;
    t.backward_weight_s = w / flops_per_s;
    t.activation_bytes = static_cast<int64_t>(act);
    t.output_bytes = static_cast<int64_t>(out);
    return t;
  };
  const double hidden_bytes = 2 * T * C;  // one (T,C) activation in 16-bit
  p.layers.push_back({"embeddings", static_cast<int64_t>(V * C + T * C), 0,
                      {row(0, 0, 0, 0, hidden_bytes)}, {}});
  for (int64_t l = 0; l < m.layers; ++l)
    p.layers.push_back({"h." + std::to_string(l),
                        static_cast<int64_t>((4 + 2 * R) * C * C + (9 + R) * C), 0,
                        {row(matmul + attention, matmul + 2 * attention, matmul, 34 * T * C, hidden_bytes)}, {}});
  p.layers.push_back({"head", static_cast<int64_t>(C * V + 2 * C), 0,
                      {row(2 * T * C * V, 2 * T * C * V, 2 * T * C * V, T * V * 6, 0)}, {}});
  return p;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

}  // namespace trireme::plan
