#include "trireme/plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "trireme/common/error.h"

namespace trireme::plan {

namespace {

using pipeline::BackwardInput;
using pipeline::BackwardWeight;
using pipeline::Forward;
using pipeline::Instruction;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The profile's all-reduce link is a bus figure measured at world size w0: an all-reduce
// of n bytes took latency + 2(w0-1)/w0 n / bandwidth, which is a ring of 2(w0-1) steps of
// n/w0 bytes at that bandwidth; per step the latency is latency / (2(w0-1)).
Link ring_step_link(const Profile& profile) {
  const double w0 = std::max(2, profile.allreduce_world);
  return Link{profile.allreduce.latency_s / (2 * (w0 - 1)), profile.allreduce.bandwidth_Bps};
}

Link intra_link(const Profile& profile, const MachineGroup& g, bool collective) {
  if (g.intra.bandwidth_Bps > 0) return g.intra;
  return collective ? ring_step_link(profile) : profile.p2p;
}

Link inter_link(const Profile& profile, const MachineGroup& a, const MachineGroup& b,
                bool collective) {
  if (a.inter.bandwidth_Bps > 0 && b.inter.bandwidth_Bps > 0)
    return Link{std::max(a.inter.latency_s, b.inter.latency_s),
                std::min(a.inter.bandwidth_Bps, b.inter.bandwidth_Bps)};
  return collective ? ring_step_link(profile) : profile.p2p;
}

Link slower(const Link& a, const Link& b) {
  return Link{std::max(a.latency_s, b.latency_s), std::min(a.bandwidth_Bps, b.bandwidth_Bps)};
}

double ring(int w, const Link& step, double bytes) {
  return w <= 1 ? 0.0 : 2.0 * (w - 1) * (step.latency_s + bytes / w / step.bandwidth_Bps);
}

void check_layout(const Profile& profile, const Cluster& cluster, const Layout& layout) {
  TRIREME_CHECK(layout.dp >= 1 && layout.tp >= 1 && layout.pp >= 1 && layout.chunks >= 1,
                "a layout needs dp, tp, pp and chunks >= 1");
  TRIREME_CHECK(layout.micro_batches >= 1 && layout.micro_batch_size >= 1,
                "a layout needs micro_batches and micro_batch_size >= 1");
  if (!layout.replica_micro_batch_sizes.empty()) {
    TRIREME_CHECK(static_cast<int>(layout.replica_micro_batch_sizes.size()) == layout.dp, "the layout gives ",
                  layout.replica_micro_batch_sizes.size(), " per-replica micro-batch sizes but dp is ", layout.dp);
    for (int b : layout.replica_micro_batch_sizes)
      TRIREME_CHECK(b >= 1, "a replica's micro-batch size must be >= 1, got ", b);
  }
  TRIREME_CHECK(layout.zero >= 0 && layout.zero <= 2, "zero must be 0, 1 or 2");
  TRIREME_CHECK(layout.zero == 0 || layout.dp > 1, "ZeRO shards over the data-parallel group, which has 1 rank; use dp 2 or more, or zero 0");
  TRIREME_CHECK(layout.chunks == 1 || layout.pp > 1, "chunks ", layout.chunks, " need a pipeline (pp 2 or more, interleaved)");
  TRIREME_CHECK(profile.model.heads % layout.tp == 0 && profile.model.vocab % layout.tp == 0, "tp ", layout.tp,
                " does not divide the model's heads (", profile.model.heads, ") and vocabulary (", profile.model.vocab, ")");
  TRIREME_CHECK(static_cast<int>(layout.ranks.size()) == layout.world(), "the layout places ",
                layout.ranks.size(), " ranks but dp*tp*pp = ", layout.world());
  for (const DeviceSlot& d : layout.ranks) {
    TRIREME_CHECK(d.group >= 0 && d.group < static_cast<int>(cluster.groups.size()),
                  "a rank is placed on group ", d.group, " but the cluster has ",
                  cluster.groups.size(), " groups");
    const MachineGroup& g = cluster.groups[d.group];
    TRIREME_CHECK(d.machine >= 0 && d.machine < g.machines && d.device >= 0 &&
                      d.device < g.devices_per_machine,
                  "a rank is placed on machine ", d.machine, " device ", d.device, " of group ",
                  g.name, ", which has ", g.machines, " x ", g.devices_per_machine);
  }
  const int parts = layout.pp * layout.chunks;
  TRIREME_CHECK(static_cast<int>(layout.split.size()) == parts, "the layer split has ",
                layout.split.size(), " parts but pp*chunks = ", parts);
  int next = 0;
  for (const auto& r : layout.split) {
    TRIREME_CHECK(r.begin == next && r.end > r.begin, "the layer split is not contiguous at layer ", next);
    next = r.end;
  }
  TRIREME_CHECK(next == static_cast<int>(profile.layers.size()), "the layer split covers ", next,
                " layers but the profile has ", profile.layers.size());
  if (layout.pp > 1)
    pipeline::validate({layout.schedule, layout.pp, layout.micro_batches, layout.chunks});
}

std::string gib(double bytes) {
  std::ostringstream out;
  out.precision(bytes < 10 * kGiB ? 2 : 3);
  out << bytes / kGiB << " GiB";
  return out.str();
}

}  // namespace

double Estimate::peak_memory_bytes() const {
  double peak = 0;
  for (const StageCost& s : stages) peak = std::max(peak, s.memory_bytes());
  return peak;
}

double allreduce_time(const Profile& profile, const Cluster& cluster,
                      const std::vector<DeviceSlot>& members, double bytes, int sharing) {
  const int w = static_cast<int>(members.size());
  if (w <= 1 || bytes <= 0) return 0.0;
  std::map<std::pair<int, int>, int> per_machine;
  Link intra{0, 1e300};
  Link inter{0, 1e300};
  std::vector<int> groups;
  for (const DeviceSlot& d : members) {
    ++per_machine[{d.group, d.machine}];
    if (std::find(groups.begin(), groups.end(), d.group) == groups.end()) groups.push_back(d.group);
  }
  for (int g : groups) {
    intra = slower(intra, intra_link(profile, cluster.groups[g], true));
    for (int h : groups) inter = slower(inter, inter_link(profile, cluster.groups[g], cluster.groups[h], true));
  }
  const int machines = static_cast<int>(per_machine.size());
  if (machines == 1) return ring(w, intra, bytes);
  inter.bandwidth_Bps /= std::max(1, sharing);
  int k = 0;
  for (const auto& [machine, count] : per_machine) k = std::max(k, count);
  const double flat = ring(w, slower(intra, inter), bytes);
  // Inside each machine a reduce-scatter and an all-gather among its k devices; across
  // machines an all-reduce of each device's n/k, the k of them sharing the machine's link.
  const double hierarchical =
      ring(k, intra, bytes) + 2.0 * (machines - 1) * (inter.latency_s + bytes / machines / inter.bandwidth_Bps);
  return std::min(flat, hierarchical);
}

double p2p_time(const Profile& profile, const Cluster& cluster, const DeviceSlot& from,
                const DeviceSlot& to, double bytes, int sharing) {
  const MachineGroup& a = cluster.groups[from.group];
  const MachineGroup& b = cluster.groups[to.group];
  const bool inside = same_machine(from, to);
  Link link = inside ? intra_link(profile, a, false) : inter_link(profile, a, b, false);
  if (!inside) link.bandwidth_Bps /= std::max(1, sharing);
  return link.time(bytes);
}

namespace {

// How many transfers across each pipeline boundary leave a machine at once: every replica
// and tensor-parallel rank sends its copy of the activations at the same point of the
// schedule, and those that leave the same machine share its link. Built once per layout.
class BoundarySharing {
 public:
  explicit BoundarySharing(const Layout& layout) : layout_(layout), parts_(layout.pp * layout.chunks) {
    leaving_.resize(2 * static_cast<size_t>(parts_));
    for (int vs = 0; vs < parts_; ++vs)
      for (int to : {vs + 1, vs - 1}) {
        if (to < 0 || to >= parts_) continue;
        auto& count = leaving_[index(vs, to)];
        for (int q = 0; q < layout.dp; ++q)
          for (int t = 0; t < layout.tp; ++t) {
            const DeviceSlot& from = sender(vs, q, t);
            const DeviceSlot& dest = sender(to, q, t);
            if (!same_machine(from, dest)) ++count[{from.group, from.machine}];
          }
      }
  }
  // The transfers that share the link of replica r's sender from `vs` to `to`.
  int at(int r, int vs, int to) const {
    const DeviceSlot& me = sender(vs, r, 0);
    const auto& count = leaving_[index(vs, to)];
    const auto it = count.find({me.group, me.machine});
    return it == count.end() ? 1 : it->second;
  }

 private:
  const DeviceSlot& sender(int vs, int r, int t) const {
    return layout_.ranks[layout_.rank_of(vs % layout_.pp, r, t)];
  }
  size_t index(int vs, int to) const { return static_cast<size_t>(to > vs ? vs : parts_ + vs); }

  const Layout& layout_;
  int parts_;
  std::vector<std::map<std::pair<int, int>, int>> leaving_;  // by boundary and direction
};

}  // namespace

ReplayResult replay(const pipeline::ScheduleSpec& spec, const InstructionTimes& times) {
  const int p = spec.stages, v = spec.chunks, m = spec.micro_batches;
  const int virtual_stages = p * v;
  std::vector<std::vector<Instruction>> order(p);
  for (int s = 0; s < p; ++s) order[s] = pipeline::compute_order(spec, s);
  // done[micro][virtual stage]: end of F / of B (input gradient); -1 while unknown.
  std::vector<std::vector<double>> forward_done(m, std::vector<double>(virtual_stages, -1));
  std::vector<std::vector<double>> backward_done = forward_done;
  ReplayResult r;
  r.end_s.assign(p, 0);
  r.busy_s.assign(p, 0);
  r.peak_live.assign(p, 0);
  r.peak_activation_bytes.assign(p, 0);
  r.last_backward.assign(p, std::vector<std::pair<double, double>>(v, {0, 0}));
  std::vector<size_t> next(p, 0);
  std::vector<int> live(p, 0);
  std::vector<double> live_bytes(p, 0);
  auto act = [&](int s, int c) {
    return times.activation_bytes.empty() ? 0.0 : times.activation_bytes[s][c];
  };
  size_t remaining = 0;
  for (const auto& o : order) remaining += o.size();
  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < order[s].size()) {
        const Instruction& in = order[s][next[s]];
        const auto [micro, chunk] = pipeline::micro_and_chunk(in);
        const int vs = chunk * p + s;
        double ready = 0, duration = 0;
        if (std::holds_alternative<Forward>(in)) {
          if (vs > 0) {
            const double prev = forward_done[micro][vs - 1];
            if (prev < 0) break;
            ready = prev + times.send_forward[vs - 1];
          }
          duration = times.forward[s][chunk];
        } else if (const auto* b = std::get_if<BackwardInput>(&in)) {
          if (vs + 1 < virtual_stages) {
            const double after = backward_done[micro][vs + 1];
            if (after < 0) break;
            ready = after + times.send_backward[vs + 1];
          }
          duration = b->with_weights ? times.backward_full[s][chunk] : times.backward_input[s][chunk];
        } else {
          duration = times.backward_weight[s][chunk];
        }
        const double start = std::max(ready, r.end_s[s]);
        const double end = start + duration;
        r.end_s[s] = end;
        r.busy_s[s] += duration;
        if (std::holds_alternative<Forward>(in)) {
          forward_done[micro][vs] = end;
          r.peak_live[s] = std::max(r.peak_live[s], ++live[s]);
          live_bytes[s] += act(s, chunk);
          r.peak_activation_bytes[s] = std::max(r.peak_activation_bytes[s], live_bytes[s]);
        } else if (const auto* b = std::get_if<BackwardInput>(&in)) {
          backward_done[micro][vs] = end;
          --live[s];
          // A split backward keeps the linear layers' inputs for W: the bytes stay live
          // until then (an upper bound: B frees the rest).
          if (b->with_weights) {
            live_bytes[s] -= act(s, chunk);
            r.last_backward[s][chunk] = {start, end};
          }
        } else {
          live_bytes[s] -= act(s, chunk);
          r.last_backward[s][chunk] = {start, end};
        }
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    TRIREME_CHECK(progressed, "internal: the pipeline replay of ", pipeline::schedule_name(spec.kind),
                  " p=", p, " m=", m, " v=", v, " deadlocked");
  }
  r.makespan_s = *std::max_element(r.end_s.begin(), r.end_s.end());
  return r;
}

namespace {

// The bytes one rank keeps for backward of `layer` (micro-batch b) under tensor parallelism
// of `tp`: as measured at that tp when the profile has it; otherwise, with no sequence
// parallelism, a block keeps its LayerNorm inputs and residual stream whole on every rank,
// (10 + 24/t)/34 of its bytes at tp 1 by Megatron's count (measured here: 65% at t=2); the
// embeddings' output stays whole; the head's vocabulary-split logits are divided by t.
double tp_activation_bytes(const LayerProfile& layer, double b, int tp) {
  if (tp == 1) return layer_activation_bytes(layer, b);
  if (const std::vector<LayerTiming>* rows = tensor_parallel_rows(layer, tp)) {
    const double bytes = rows_activation_bytes(*rows, b);
    if (bytes > 0) return bytes;
  }
  const double whole = layer_activation_bytes(layer, b);
  if (layer.name.rfind("h.", 0) == 0) return whole * (10.0 + 24.0 / tp) / 34.0;
  if (layer.name == "embeddings") return whole;
  return whole / tp;
}

// Bytes of one activation element: the embeddings' (b,T,C) output over its elements, 4
// (fp32) when the profile has no output sizes.
double tp_element_bytes(const Profile& profile, double b) {
  const double elements = b * profile.model.seq_len * profile.model.dim;
  const double bytes = profile.layers.empty() ? 0 : layer_output_bytes(profile.layers.front(), b);
  return bytes > 0 && elements > 0 ? bytes / elements : 4.0;
}

// One replica's pipeline on its own devices at its own micro-batch size: the instruction
// times the replay needs, the tensor-parallel collectives modelled per stage and the
// longest boundary transfer.
struct ReplicaPipeline {
  InstructionTimes times;
  std::vector<double> tp_comm;
  double p2p_s = 0;
};

ReplicaPipeline replica_pipeline(const Profile& profile, const Cluster& cluster, const Layout& layout, int r,
                                 double in_place, const BoundarySharing& sharing) {
  const int p = layout.pp, v = layout.chunks, tp = layout.tp;
  const double b = layout.micro_batch_size_of(r);
  ReplicaPipeline out;
  InstructionTimes& times = out.times;
  times.forward.assign(p, std::vector<double>(v, 0));
  times.backward_input = times.backward_weight = times.backward_full = times.activation_bytes = times.forward;
  out.tp_comm.assign(p, 0);
  for (int s = 0; s < p; ++s) {
    double speed = 1e300;
    std::vector<DeviceSlot> tp_members;
    for (int t = 0; t < tp; ++t) {
      const DeviceSlot& d = layout.ranks[layout.rank_of(s, r, t)];
      tp_members.push_back(d);
      speed = std::min(speed, cluster.groups[d.group].speed(profile));
    }
    for (int c = 0; c < v; ++c) {
      const pipeline::LayerRange range = layout.split[c * p + s];
      // Measured at this tp (collectives included) when the profile has it; otherwise the
      // tp=1 time split tp ways plus the modelled all-reduces.
      bool measured_tp = tp > 1;
      for (int l = range.begin; l < range.end; ++l)
        measured_tp = measured_tp && tensor_parallel_rows(profile.layers[l], tp) != nullptr;
      const double scale = in_place / (speed * (measured_tp ? 1 : tp));
      auto work_sum = [&](Work work) {
        double t = 0;
        for (int l = range.begin; l < range.end; ++l)
          t += measured_tp ? rows_time(*tensor_parallel_rows(profile.layers[l], tp), work, b)
                           : layer_time(profile.layers[l], work, b);
        return t;
      };
      double tp_forward = 0, tp_backward = 0;
      if (tp > 1 && !measured_tp) {
        // Megatron's collectives, as parallel/tensor runs them: a block all-reduces its
        // (b,T,C) output of attention and of the MLP in forward and their input gradients
        // in backward; the vocabulary-parallel embedding all-reduces its output; the head's
        // column-parallel input gradient is all-reduced in backward, and its
        // vocabulary-parallel loss all-reduces two (b,T) tensors in forward. All of them in
        // the activations' type, which the embeddings' (b,T,C) output gives (2-byte
        // elements in a 16-bit profile); fp32 where a profile lacks it.
        const double tokens = b * profile.model.seq_len;
        const double element = tp_element_bytes(profile, b);
        const double hidden_t = allreduce_time(profile, cluster, tp_members, tokens * profile.model.dim * element);
        const double small_t = allreduce_time(profile, cluster, tp_members, tokens * element);
        for (int l = range.begin; l < range.end; ++l) {
          const std::string& name = profile.layers[l].name;
          if (name.rfind("h.", 0) == 0) {
            tp_forward += 2 * hidden_t;
            tp_backward += 2 * hidden_t;
          } else if (name == "embeddings") {
            tp_forward += hidden_t;
          } else if (name == "head") {
            tp_forward += 2 * small_t;
            tp_backward += hidden_t;
          }
        }
      }
      times.forward[s][c] = work_sum(Work::kForward) * scale + tp_forward;
      times.backward_input[s][c] = work_sum(Work::kBackwardInput) * scale + tp_backward;
      times.backward_weight[s][c] = work_sum(Work::kBackwardWeight) * scale;
      times.backward_full[s][c] = times.backward_input[s][c] + times.backward_weight[s][c];
      double act = 0;
      for (int l = range.begin; l < range.end; ++l) act += tp_activation_bytes(profile.layers[l], b, tp);
      times.activation_bytes[s][c] = act;
      out.tp_comm[s] += (tp_forward + tp_backward) * layout.micro_batches;
    }
  }
  const int parts = p * v;
  times.send_forward.assign(parts, 0);
  times.send_backward.assign(parts, 0);
  for (int vs = 0; vs < parts; ++vs) {
    const int s = vs % p;
    if (vs + 1 < parts) {
      const double bytes = layer_output_bytes(profile.layers[layout.split[vs].end - 1], b);
      times.send_forward[vs] = p2p_time(profile, cluster, layout.ranks[layout.rank_of(s, r, 0)],
                                        layout.ranks[layout.rank_of((vs + 1) % p, r, 0)], bytes,
                                        sharing.at(r, vs, vs + 1));
      out.p2p_s = std::max(out.p2p_s, times.send_forward[vs]);
    }
    if (vs > 0) {
      const double bytes = layer_output_bytes(profile.layers[layout.split[vs - 1].end - 1], b);
      times.send_backward[vs] = p2p_time(profile, cluster, layout.ranks[layout.rank_of(s, r, 0)],
                                         layout.ranks[layout.rank_of((vs - 1 + p) % p, r, 0)], bytes,
                                         sharing.at(r, vs, vs - 1));
    }
  }
  return out;
}

// What replica_pipeline reads of replica r's placement: its micro-batch size, each rank's
// group, how its tensor-parallel groups sit on machines, and which boundaries stay inside
// a machine. Replicas with equal keys have equal pipelines (and replay once).
std::vector<int> replica_key(const Layout& layout, int r, const BoundarySharing& sharing) {
  const int p = layout.pp, tp = layout.tp;
  std::vector<int> key{layout.micro_batch_size_of(r)};
  for (int s = 0; s < p; ++s) {
    std::map<std::pair<int, int>, int> per_machine;
    for (int t = 0; t < tp; ++t) {
      const DeviceSlot& d = layout.ranks[layout.rank_of(s, r, t)];
      key.push_back(d.group);
      ++per_machine[{d.group, d.machine}];
    }
    key.push_back(static_cast<int>(per_machine.size()));
    for (const auto& [machine, count] : per_machine) key.push_back(count);
    const DeviceSlot& a = layout.ranks[layout.rank_of(s, r, 0)];
    const DeviceSlot& b = layout.ranks[layout.rank_of((s + 1) % p, r, 0)];
    key.push_back(same_machine(a, b));
  }
  for (int vs = 0; vs < p * layout.chunks; ++vs) {  // the links its transfers share
    if (vs + 1 < p * layout.chunks) key.push_back(sharing.at(r, vs, vs + 1));
    if (vs > 0) key.push_back(sharing.at(r, vs, vs - 1));
  }
  return key;
}

}  // namespace

int world_size(int dp, int tp, int pp) {
  int64_t w = int64_t{dp} * tp;  // below 2^62 in magnitude, and so is w * pp while w fits an int
  const int64_t most = std::numeric_limits<int>::max();
  if (w >= -most && w <= most) w *= pp;
  TRIREME_CHECK(w >= -most && w <= most, "dp ", dp, " x tp ", tp, " x pp ", pp, " is more than ", most, " ranks");
  return static_cast<int>(w);
}

Estimate estimate(const Profile& profile, const Cluster& cluster, const Layout& layout,
                  const CostOptions& options) {
  check_layout(profile, cluster, layout);
  const int p = layout.pp, v = layout.chunks, dp = layout.dp, tp = layout.tp;
  const pipeline::ScheduleSpec spec{p > 1 ? layout.schedule : pipeline::ScheduleKind::kOneFOneB, p,
                                    layout.micro_batches, p > 1 ? v : 1};
  auto stage_ranks = [&](int s, bool all_tp) {
    std::vector<DeviceSlot> out;
    for (int r = 0; r < dp; ++r)
      for (int t = 0; t < (all_tp ? tp : 1); ++t) out.push_back(layout.ranks[layout.rank_of(s, r, t)]);
    return out;
  };

  Estimate e;
  e.stages.resize(p);
  for (int s = 0; s < p; ++s) {
    StageCost& sc = e.stages[s];
    sc.speed = 1e300;
    sc.device_memory_bytes = 1e300;
    for (const DeviceSlot& d : stage_ranks(s, true)) {
      sc.speed = std::min(sc.speed, cluster.groups[d.group].speed(profile));
      sc.device_memory_bytes = std::min(sc.device_memory_bytes, cluster.groups[d.group].memory_bytes);
    }
  }
  // (1) Each replica's pipeline replayed on its own devices at its own micro-batch size
  // (replicas that would replay the same numbers share one replay); synchronous training
  // waits for the slowest.
  // By micro-batch size: the layers' parts as a whole step, and in training (calibration).
  std::map<int, double> in_place;
  std::map<std::vector<int>, ReplayResult> replays;
  std::vector<const ReplayResult*> rep(dp);
  std::vector<double> tp_comm(p, 0);
  const BoundarySharing sharing(layout);
  for (int r = 0; r < dp; ++r) {
    std::vector<int> key = replica_key(layout, r, sharing);
    auto it = replays.find(key);
    if (it == replays.end()) {
      const int b = layout.micro_batch_size_of(r);
      if (!in_place.count(b)) in_place[b] = in_place_factor(profile, b) * training_factor(profile, p > 1);
      const ReplicaPipeline rp = replica_pipeline(profile, cluster, layout, r, in_place[b], sharing);
      it = replays.emplace(std::move(key), replay(spec, rp.times)).first;
      e.p2p_s = std::max(e.p2p_s, rp.p2p_s);
      for (int s = 0; s < p; ++s) tp_comm[s] = std::max(tp_comm[s], rp.tp_comm[s]);
    }
    rep[r] = &it->second;
    e.makespan_s = std::max(e.makespan_s, rep[r]->makespan_s);
  }
  e.tp_comm_s = *std::max_element(tp_comm.begin(), tp_comm.end());

  // Two scalar all-reduces close every step: the gradient norm's and the loss's.
  const double closing_s = 2 * allreduce_time(profile, cluster, layout.ranks, 8);
  double bubble = 0;
  for (int s = 0; s < p; ++s) {
    StageCost& sc = e.stages[s];
    for (int r = 0; r < dp; ++r) {
      sc.compute_s = std::max(sc.compute_s, rep[r]->busy_s[s]);
      sc.pipeline_end_s = std::max(sc.pipeline_end_s, rep[r]->end_s[s]);
      sc.peak_live = std::max(sc.peak_live, rep[r]->peak_live[s]);
      sc.activation_bytes = std::max(sc.activation_bytes, rep[r]->peak_activation_bytes[s]);
    }
    bubble += e.makespan_s > 0 ? (e.makespan_s - sc.compute_s) / e.makespan_s : 0;
    double params = 0, optimizer_s = 0;
    for (int c = 0; c < v; ++c) {
      const pipeline::LayerRange range = layout.split[c * p + s];
      for (int l = range.begin; l < range.end; ++l) {
        params += static_cast<double>(profile.layers[l].parameters) / tp;
        optimizer_s += profile.layers[l].optimizer_s / (sc.speed * tp);
      }
    }
    const std::vector<DeviceSlot> dp_members = stage_ranks(s, false);
    // (2) buckets, chunk by chunk in the order their last backward ends, last layer first;
    // a layer's gradient is ready when every replica's backward has passed it.
    if (dp > 1) {
      std::vector<std::vector<double>> layer_ready(v);
      std::vector<double> chunk_end(v, 0);
      std::map<std::pair<const ReplayResult*, int>, bool> seen;
      for (int r = 0; r < dp; ++r) {
        const int b = layout.micro_batch_size_of(r);
        if (!seen.emplace(std::make_pair(rep[r], b), true).second) continue;
        for (int c = 0; c < v; ++c) {
          const pipeline::LayerRange range = layout.split[c * p + s];
          layer_ready[c].resize(range.end - range.begin, 0);
          const auto [start, end] = rep[r]->last_backward[s][c];
          chunk_end[c] = std::max(chunk_end[c], end);
          double work_total = 0;
          for (int l = range.begin; l < range.end; ++l)
            work_total += layer_time(profile.layers[l], Work::kBackwardInput, b) +
                          layer_time(profile.layers[l], Work::kBackwardWeight, b);
          double work_done = 0;
          for (int l = range.end - 1; l >= range.begin; --l) {
            work_done += layer_time(profile.layers[l], Work::kBackwardInput, b) +
                         layer_time(profile.layers[l], Work::kBackwardWeight, b);
            const double ready = start + (end - start) * (work_total > 0 ? work_done / work_total : 1.0);
            double& slot = layer_ready[c][l - range.begin];
            slot = std::max(slot, ready);
          }
        }
      }
      std::vector<int> chunk_order(v);
      for (int c = 0; c < v; ++c) chunk_order[c] = c;
      std::sort(chunk_order.begin(), chunk_order.end(), [&](int a, int c) { return chunk_end[a] < chunk_end[c]; });
      const double grad_per_param = profile.state.grad;
      const double collective_share = layout.zero == 2 ? 0.5 : 1.0;  // reduce-scatter: half
      double comm_free = 0, bucket_bytes = 0, bucket_ready = 0;
      double cap = options.first_bucket_mb * 1024 * 1024;
      auto flush = [&] {
        if (bucket_bytes <= 0) return;
        const double t = collective_share * allreduce_time(profile, cluster, dp_members, bucket_bytes, tp);
        comm_free = std::max(comm_free, bucket_ready) + t;
        sc.sync_total_s += t;
        bucket_bytes = 0;
        cap = options.bucket_mb * 1024 * 1024;
      };
      for (int c : chunk_order) {
        const pipeline::LayerRange range = layout.split[c * p + s];
        for (int l = range.end - 1; l >= range.begin; --l) {
          bucket_bytes += static_cast<double>(profile.layers[l].parameters) / tp * grad_per_param;
          bucket_ready = std::max(bucket_ready, layer_ready[c][l - range.begin]);
          if (bucket_bytes >= cap) flush();
        }
      }
      flush();
      const double exposed = std::max(0.0, comm_free - sc.pipeline_end_s);
      sc.sync_exposed_s = exposed + (1 - options.overlap) * (sc.sync_total_s - std::min(sc.sync_total_s, exposed));
    }
    // (3) the optimizer, on 1/dp of the parameters under ZeRO, then their all-gather.
    sc.optimizer_s = optimizer_s;
    if (layout.zero > 0 && dp > 1) {
      sc.optimizer_s = optimizer_s / dp +
                       0.5 * allreduce_time(profile, cluster, dp_members, params * profile.state.param, tp);
    }
    // (set below: the gradient norm's all-reduce is a barrier before any optimizer step)
    sc.end_s = sc.pipeline_end_s + sc.sync_exposed_s;

    const double shard = (layout.zero > 0 && dp > 1) ? dp : 1;
    sc.param_bytes = params * profile.state.param;
    // The gradients, and DataParallel's flat bucket buffers beside them (all-reduced in
    // place): two gradient-sized copies. ZeRO-2 hands each bucket's gradients over to its
    // packed reduce-scatter buffer, which lives until the end of backward (and gradients
    // accumulate whole across micro-batches), so at its peak it holds one whole copy
    // besides its 1/dp shards; the shards alone are what it keeps between steps.
    sc.grad_bytes = params * profile.state.grad;
    if (dp > 1) sc.grad_bytes += params * profile.state.grad / (layout.zero == 2 ? dp : 1);
    sc.optimizer_bytes = params * profile.state.optimizer / shard;
    // Each replica's activations on its own devices (replicas of unequal batches differ).
    const double state_bytes = sc.param_bytes + sc.grad_bytes + sc.optimizer_bytes;
    for (int r = 0; r < dp && e.fits; ++r) {
      double device_bytes = 1e300;
      for (int t = 0; t < tp; ++t)
        device_bytes = std::min(device_bytes, cluster.groups[layout.ranks[layout.rank_of(s, r, t)].group].memory_bytes);
      const double usable = device_bytes * (1 - options.memory_reserve);
      const double activations = rep[r]->peak_activation_bytes[s];
      if (state_bytes + activations <= usable) continue;
      e.fits = false;
      std::ostringstream why;
      why << "stage " << s << (dp > 1 ? " of replica " + std::to_string(r) : "") << " needs "
          << gib(state_bytes + activations) << " per device (parameters " << gib(sc.param_bytes) << ", gradients "
          << gib(sc.grad_bytes) << ", optimizer " << gib(sc.optimizer_bytes) << ", activations "
          << gib(activations) << ") but has " << gib(usable) << " usable";
      e.reason = why.str();
    }
  }
  e.bubble_fraction = bubble / p;
  // Clipping all-reduces the gradient norm over every stage (and shard) before any stage
  // steps its optimizer: a stage that finishes its backward early waits for the last one
  // there, so its optimizer does not hide in the others' tail.
  double gradients_done = 0, slowest_optimizer = 0;
  for (const StageCost& sc : e.stages) {
    gradients_done = std::max(gradients_done, sc.end_s);
    slowest_optimizer = std::max(slowest_optimizer, sc.optimizer_s);
  }
  for (StageCost& sc : e.stages) sc.end_s = gradients_done + closing_s + sc.optimizer_s;
  e.step_s = gradients_done + closing_s + slowest_optimizer;
  return e;
}

namespace {

// The factor on F/B/W that makes the estimate of `l` (on `cluster`) take `measured`
// seconds: a few fixed-point rounds, since the exposed sync moves with the compute.
double solve_factor(Profile* profile, const Cluster& cluster, const Layout& l, double measured,
                    const CostOptions& options) {
  double factor = 1;
  for (int round = 0; round < 4; ++round) {
    profile->calibration_factor = profile->pipeline_calibration_factor = factor;
    const Estimate e = estimate(*profile, cluster, l, options);
    const double rest = e.step_s - e.makespan_s;  // sync exposed, optimizer, closing
    factor = std::clamp(factor * (measured - rest) / e.makespan_s, 0.25, 4.0);
  }
  return factor;
}

double median_factor(const std::vector<CalibrationRow>& rows, bool pipeline) {
  std::vector<double> factors;
  for (const CalibrationRow& r : rows)
    if (r.pipeline == pipeline) factors.push_back(r.factor);
  if (factors.empty()) return 0;
  std::sort(factors.begin(), factors.end());
  const size_t n = factors.size();
  return n % 2 ? factors[n / 2] : (factors[n / 2 - 1] + factors[n / 2]) / 2;
}

}  // namespace

void calibrate(Profile* profile, const CostOptions& options) {
  profile->calibration.clear();
  std::vector<CalibrationRow> rows;
  const int layers = static_cast<int>(profile->layers.size());
  for (const TrainingStepTiming& t : profile->training_step) {
    Layout l;
    l.dp = t.data_parallel;
    l.micro_batch_size = static_cast<int>(t.micro_batch);
    l.split = {{0, layers}};
    for (int r = 0; r < l.dp; ++r) l.ranks.push_back({0, 0, r});
    rows.push_back({t.micro_batch, solve_factor(profile, local_cluster(l.dp), l, t.step_s, options), false});
  }
  for (const PipelineStepTiming& t : profile->pipeline_step) {
    Layout l;
    l.pp = t.stages;
    l.schedule = pipeline::ScheduleKind::kOneFOneB;
    l.micro_batches = t.micro_batches;
    l.micro_batch_size = static_cast<int>(t.micro_batch);
    l.split = pipeline::parse_split(t.split, layers, t.stages);
    for (int r = 0; r < l.pp; ++r) l.ranks.push_back({0, 0, r});
    rows.push_back({t.micro_batch, solve_factor(profile, local_cluster(l.pp), l, t.step_s, options), true});
  }
  profile->calibration = rows;
  const double data_parallel = median_factor(rows, false), pipelined = median_factor(rows, true);
  profile->calibration_factor = data_parallel > 0 ? data_parallel : (pipelined > 0 ? pipelined : 1);
  profile->pipeline_calibration_factor = pipelined > 0 ? pipelined : profile->calibration_factor;
}

}  // namespace trireme::plan
