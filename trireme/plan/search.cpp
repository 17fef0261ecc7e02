#include "trireme/plan/search.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <sstream>

#include "trireme/common/error.h"

namespace trireme::plan {

namespace {

// The divisors of n in ascending order (n: a device count).
std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// The micro-batch counts m to try for `sequences` per step: the divisors of it up to
// max_micro_batches, found in that many steps whatever the batch.
std::vector<int64_t> micro_batch_counts(int64_t sequences, int64_t max_micro_batches) {
  std::vector<int64_t> out;
  for (int64_t m = 1; m <= std::min(sequences, max_micro_batches); ++m)
    if (sequences % m == 0) out.push_back(m);
  return out;
}

// Every non-empty subset of the groups (all of them only, when not aware).
std::vector<std::vector<int>> group_subsets(const Cluster& cluster, bool aware) {
  const int g = static_cast<int>(cluster.groups.size());
  std::vector<std::vector<int>> out;
  if (!aware || g > 8) {
    std::vector<int> all(g);
    std::iota(all.begin(), all.end(), 0);
    return {all};
  }
  for (int mask = 1; mask < (1 << g); ++mask) {
    std::vector<int> s;
    for (int i = 0; i < g; ++i)
      if (mask & (1 << i)) s.push_back(i);
    out.push_back(s);
  }
  return out;
}

struct Schedule {
  pipeline::ScheduleKind kind;
  int chunks;
};

std::vector<Schedule> schedules_for(int pp, int layers, const SearchOptions& o) {
  using pipeline::ScheduleKind;
  if (pp == 1) return {{ScheduleKind::kOneFOneB, 1}};
  std::vector<Schedule> out = {{ScheduleKind::kGPipe, 1}, {ScheduleKind::kOneFOneB, 1}, {ScheduleKind::kZbH1, 1}};
  for (int v = 2; v <= o.max_chunks && pp * v <= layers; ++v) out.push_back({ScheduleKind::kInterleaved, v});
  return out;
}

// Why `c` lost to `best`: the cost component that grew most.
std::string why_lost(const Candidate& c, const Candidate& best) {
  const Estimate& a = c.estimate;
  const Estimate& b = best.estimate;
  std::ostringstream out;
  out.precision(3);
  out << "+" << (a.step_s / b.step_s - 1) * 100 << "%: ";
  auto worst = [](const Estimate& e, auto field) {
    double m = 0;
    for (const StageCost& s : e.stages) m = std::max(m, field(s));
    return m;
  };
  const double d_compute = worst(a, [](const StageCost& s) { return s.compute_s; }) -
                           worst(b, [](const StageCost& s) { return s.compute_s; });
  const double d_bubble = (a.makespan_s - worst(a, [](const StageCost& s) { return s.compute_s; })) -
                          (b.makespan_s - worst(b, [](const StageCost& s) { return s.compute_s; }));
  const double d_sync = worst(a, [](const StageCost& s) { return s.sync_exposed_s; }) -
                        worst(b, [](const StageCost& s) { return s.sync_exposed_s; });
  const double d_opt = worst(a, [](const StageCost& s) { return s.optimizer_s; }) -
                       worst(b, [](const StageCost& s) { return s.optimizer_s; });
  const double biggest = std::max({d_compute, d_bubble, d_sync, d_opt});
  if (biggest <= 0) out << "slower overall";
  else if (biggest == d_compute) out << "busiest stage computes longer (" << a.stages.size() << " stages, tp " << c.layout.tp << ")";
  else if (biggest == d_bubble) out << "more pipeline bubble (" << a.bubble_fraction * 100 << "% idle)";
  else if (biggest == d_sync) out << "more exposed gradient sync";
  else out << "longer optimizer step / ZeRO all-gather";
  return out.str();
}

// Places the ranks: stages of group order[k] contiguous, inside a group in rank order
// (tp fastest, then dp), filling machines in turn.
std::vector<DeviceSlot> place_by_groups(const Cluster& cluster, const std::vector<int>& order,
                                        int dp, int tp, std::vector<int>* stage_group) {
  std::vector<DeviceSlot> ranks;
  for (int g : order) {
    const MachineGroup& group = cluster.groups[g];
    const int stages = group.devices() / (dp * tp);
    for (int k = 0; k < stages; ++k) {
      stage_group->push_back(g);
      for (int i = 0; i < dp * tp; ++i) {
        const int index = k * dp * tp + i;
        ranks.push_back({g, index / group.devices_per_machine, index % group.devices_per_machine});
      }
    }
  }
  return ranks;
}

// Places whole replicas (tp x pp devices each) inside groups: `replicas[k]` of them on
// group order[k], a replica's devices contiguous in its group (tp ranks on one machine).
// Rank numbering is the runtime's (tp fastest, then dp, then pp).
std::vector<DeviceSlot> place_replicas(const Cluster& cluster, const std::vector<int>& order,
                                       const std::vector<int>& replicas, int tp, int pp) {
  int dp = 0;
  for (int n : replicas) dp += n;
  std::vector<DeviceSlot> ranks(static_cast<size_t>(dp) * tp * pp);
  int r = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const MachineGroup& group = cluster.groups[order[k]];
    for (int j = 0; j < replicas[k]; ++j, ++r)
      for (int s = 0; s < pp; ++s)
        for (int t = 0; t < tp; ++t) {
          const int index = j * tp * pp + s * tp + t;
          ranks[t + r * tp + s * tp * dp] = {order[k], index / group.devices_per_machine,
                                             index % group.devices_per_machine};
        }
  }
  return ranks;
}

// Micro-batch sizes per group (each of its replicas takes the group's) that add up to
// `per_step` sequences over the replicas: around the shares proportional to the groups'
// speeds (the replicas then finish together), a few sizes either side of each, since time
// is not linear in the micro-batch size.
std::vector<std::vector<int>> batch_shares(int64_t per_step, const std::vector<int>& replicas,
                                           const std::vector<double>& speeds) {
  double capacity = 0;
  for (size_t k = 0; k < replicas.size(); ++k) capacity += replicas[k] * speeds[k];
  std::vector<std::vector<int>> out;
  std::vector<int> current(replicas.size(), 0);
  auto recurse = [&](auto&& self, size_t k, int64_t left) -> void {
    if (k + 1 == replicas.size()) {
      if (left >= replicas[k] && left % replicas[k] == 0) {
        current[k] = static_cast<int>(left / replicas[k]);
        out.push_back(current);
      }
      return;
    }
    const double ideal = per_step * speeds[k] / capacity;
    for (int64_t b = std::max<int64_t>(1, static_cast<int64_t>(ideal) - 1); b <= static_cast<int64_t>(ideal) + 2; ++b) {
      if (left - b * replicas[k] < 1) break;
      current[k] = static_cast<int>(b);
      self(self, k + 1, left - b * replicas[k]);
    }
  };
  recurse(recurse, 0, per_step);
  // The even split, when there is one, for comparison.
  int dp = 0;
  for (int n : replicas) dp += n;
  if (per_step % dp == 0) {
    std::vector<int> even(replicas.size(), static_cast<int>(per_step / dp));
    if (std::find(out.begin(), out.end(), even) == out.end()) out.push_back(even);
  }
  return out;
}

// A layout's sizes, schedule and placement (split, micro-batch size and ZeRO still to
// set); false when the schedule refuses m (e.g. interleaved with m not a multiple of pp).
bool make_layout(int dp, int tp, int pp, const Schedule& schedule, int64_t m, const std::vector<DeviceSlot>& ranks,
                 Layout* l) {
  *l = Layout{};
  l->dp = dp;
  l->tp = tp;
  l->pp = pp;
  l->schedule = schedule.kind;
  l->chunks = schedule.chunks;
  l->micro_batches = static_cast<int>(m);
  l->ranks = ranks;
  if (pp == 1) return true;
  try {
    pipeline::validate({l->schedule, pp, l->micro_batches, l->chunks});
  } catch (const InvalidArgument&) {
    return false;
  }
  return true;
}

}  // namespace

std::vector<DeviceSlot> ranks_in_file_order(const Cluster& cluster, int count) {
  std::vector<DeviceSlot> ranks;
  for (int g = 0; g < static_cast<int>(cluster.groups.size()); ++g)
    for (int i = 0; i < cluster.groups[g].devices() && static_cast<int>(ranks.size()) < count; ++i)
      ranks.push_back({g, i / cluster.groups[g].devices_per_machine, i % cluster.groups[g].devices_per_machine});
  TRIREME_CHECK(static_cast<int>(ranks.size()) == count, "the cluster has ", ranks.size(), " devices, not ", count);
  return ranks;
}

std::vector<pipeline::LayerRange> balance_for_speeds(const std::vector<double>& costs,
                                                     const std::vector<double>& speeds) {
  const int n = static_cast<int>(costs.size());
  const int parts = static_cast<int>(speeds.size());
  TRIREME_CHECK(parts >= 1 && n >= parts, "cannot split ", n, " layers into ", parts, " parts");
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  // best[k][i]: the smallest possible slowest-part time for the first i layers in k parts.
  const double inf = 1e300;
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(parts + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= parts; ++k)
    for (int i = k; i <= n - (parts - k); ++i)
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] >= inf) continue;
        const double t = std::max(best[k - 1][j], (prefix[i] - prefix[j]) / speeds[k - 1]);
        if (t < best[k][i] * (1 - 1e-12)) {  // strictly better: the earliest cut wins ties
          best[k][i] = t;
          cut[k][i] = j;
        }
      }
  std::vector<pipeline::LayerRange> out(parts);
  int end = n;
  for (int k = parts; k >= 1; --k) {
    out[k - 1] = {cut[k][end], end};
    end = cut[k][end];
  }
  return out;
}

std::string family(const Layout& l) {
  std::ostringstream out;
  out << "dp " << l.dp << " x tp " << l.tp << " x pp " << l.pp;
  if (l.pp > 1) {
    out << ", " << pipeline::schedule_name(l.schedule);
    if (l.chunks > 1) out << " v" << l.chunks;
  }
  out << ", zero " << l.zero;
  return out.str();
}

std::string describe(const Layout& l) {
  std::ostringstream out;
  out << family(l) << ", m " << l.micro_batches << " x b ";
  if (l.replica_micro_batch_sizes.empty()) {
    out << l.micro_batch_size;
  } else {
    // Runs of equal sizes shortened: "7 (x32) + 1 (x32)"; single replicas as "11+5".
    const std::vector<int>& sizes = l.replica_micro_batch_sizes;
    for (size_t r = 0; r < sizes.size();) {
      size_t end = r;
      while (end < sizes.size() && sizes[end] == sizes[r]) ++end;
      out << (r ? (end - r > 1 || r > 1 ? " + " : "+") : "") << sizes[r];
      if (end - r > 1) out << " (x" << end - r << ")";
      r = end;
    }
  }
  if (l.pp > 1) out << ", split " << pipeline::format_split(l.split);
  return out.str();
}

namespace {

// The search over whole groups (every device of each group it uses). False when no layout
// fits, with *closest saying which came nearest (or that none was considered); `result`'s
// counts and rejected families are filled either way.
bool search_whole_groups(const Profile& profile, const Cluster& cluster, const SearchOptions& o, SearchResult* out,
                         std::string* closest) {
  const int layers = static_cast<int>(profile.layers.size());
  SearchResult& result = *out;
  std::map<std::string, Candidate> best_of_family;
  std::map<std::string, std::pair<double, std::string>> unfit;  // family -> (memory, reason)
  double best_step = 1e300;

  // `work`: the model's F + B + W for one micro-batch of the layout's size.
  auto consider = [&](Layout layout, const std::vector<std::string>& group_names, double work) {
    // Lower bound: the work spread evenly over the stages at the fastest device, scaled as
    // estimate() scales the layer times (in place and calibrated, factors that can be
    // below 1; unscaled, the bound could prune the best layout).
    double fastest = 0;
    for (const DeviceSlot& d : layout.ranks) fastest = std::max(fastest, cluster.groups[d.group].speed(profile));
    double scale = 1e300;
    for (int r = 0; r < layout.dp; ++r)
      scale = std::min(scale, in_place_factor(profile, layout.micro_batch_size_of(r)));
    scale *= training_factor(profile, layout.pp > 1);
    const double bound = scale * work * layout.micro_batches / (layout.pp * layout.tp * fastest);
    if (bound > o.prune_factor * best_step) {
      ++result.pruned;
      return;
    }
    Candidate c{std::move(layout), {}, group_names};
    c.estimate = estimate(profile, cluster, c.layout, o.cost);
    ++result.evaluated;
    const std::string key = family(c.layout);
    if (!c.estimate.fits) {
      const double mem = c.estimate.peak_memory_bytes();
      auto it = unfit.find(key);
      if (it == unfit.end() || mem < it->second.first) unfit[key] = {mem, c.estimate.reason};
      return;
    }
    best_step = std::min(best_step, c.estimate.step_s);
    auto it = best_of_family.find(key);
    if (it == best_of_family.end() || c.estimate.step_s < it->second.estimate.step_s) best_of_family[key] = c;
  };

  const std::vector<std::vector<int>> subsets = group_subsets(cluster, o.aware);
  for (size_t done = 0; done < subsets.size(); ++done) {
    if (o.progress && subsets.size() > 1)
      o.progress("searched " + std::to_string(done) + " of " + std::to_string(subsets.size()) +
                 " subsets of the cluster's groups");
    const std::vector<int>& subset = subsets[done];
    int common = 0;
    for (int g : subset) common = std::gcd(common, cluster.groups[g].devices());
    std::vector<std::vector<int>> orders;
    std::vector<int> order = subset;
    if (o.aware && cluster.groups.size() <= 4) {
      do orders.push_back(order);
      while (std::next_permutation(order.begin(), order.end()));
    } else if (o.aware) {
      // In a cluster of more than 4 groups, the fastest first and the slowest first, not
      // every order: every order of every subset of up to 4 of 8 groups took 80 s.
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return cluster.groups[a].speed(profile) > cluster.groups[b].speed(profile);
      });
      orders.push_back(order);
      orders.emplace_back(order.rbegin(), order.rend());
    } else {
      orders.push_back(order);
    }
    int total = 0;
    for (int g : subset) total += cluster.groups[g].devices();
    for (int64_t d : o.aware ? divisors(common) : std::vector<int64_t>{}) {
      for (int64_t tp : divisors(d)) {
        bool tp_ok = profile.model.heads % tp == 0 && profile.model.vocab % tp == 0;
        for (int g : subset) tp_ok = tp_ok && cluster.groups[g].devices_per_machine % tp == 0;
        if (!tp_ok) continue;
        const int dp = static_cast<int>(d / tp);
        const int pp = total / static_cast<int>(d);
        if (pp > layers) continue;
        // Every replica crosses the same groups: an even share each, or, when dp does not
        // divide the batch, shares one sequence apart per micro-batch (m then divides the
        // global batch, and a micro-batch of every replica takes at least one sequence each).
        const bool even = o.global_batch % dp == 0;
        std::vector<int64_t> counts = micro_batch_counts(even ? o.global_batch / dp : o.global_batch,
                                                         o.max_micro_batches);
        if (!even)
          counts.erase(std::remove_if(counts.begin(), counts.end(), [&](int64_t m) { return o.global_batch / m < dp; }),
                       counts.end());
        for (const std::vector<int>& ord : orders) {
          std::vector<int> stage_group;
          const std::vector<DeviceSlot> ranks = place_by_groups(cluster, ord, dp, static_cast<int>(tp), &stage_group);
          std::vector<std::string> names;
          for (int g : ord) names.push_back(cluster.groups[g].name);
          for (const Schedule& sched : schedules_for(pp, layers, o)) {
            for (int64_t m : counts) {
              Layout l;
              if (!make_layout(dp, static_cast<int>(tp), pp, sched, m, ranks, &l)) continue;
              const int64_t per_step = o.global_batch / m;
              l.micro_batch_size = static_cast<int>((per_step + dp - 1) / dp);
              if (!even) l.replica_micro_batch_sizes = near_even_shares(per_step, dp);
              // The split and the lower bound's work at the largest share (the slowest replica).
              const std::vector<double> costs = layer_costs(profile, l.micro_batch_size);
              const double work = std::accumulate(costs.begin(), costs.end(), 0.0);
              std::vector<double> speeds;
              for (int c = 0; c < l.chunks; ++c)
                for (int s = 0; s < pp; ++s) speeds.push_back(cluster.groups[stage_group[s]].speed(profile));
              l.split = balance_for_speeds(costs, speeds);
              for (int zero = 0; zero <= (dp > 1 ? 2 : 0); ++zero) {
                l.zero = zero;
                consider(l, names, work);
              }
            }
          }
        }
      }
    }
    if (o.aware && subset.size() >= 2 && subset.size() <= 4) {
      // Replicas by group: every replica (tp x pp devices) inside one group, the groups'
      // replicas taking shares of the batch by their speed, so that replicas on slower
      // devices do not straggle (AutoHet's and Metis's uneven batches).
      std::vector<double> speeds;
      for (int g : subset) speeds.push_back(cluster.groups[g].speed(profile));
      for (int64_t d : divisors(common)) {
        for (int64_t tp : divisors(d)) {
          bool tp_ok = profile.model.heads % tp == 0 && profile.model.vocab % tp == 0;
          for (int g : subset) tp_ok = tp_ok && cluster.groups[g].devices_per_machine % tp == 0;
          const int pp = static_cast<int>(d / tp);
          if (!tp_ok || pp > layers) continue;
          std::vector<int> replicas;
          for (int g : subset) replicas.push_back(cluster.groups[g].devices() / static_cast<int>(d));
          const int dp = total / static_cast<int>(d);
          const std::vector<DeviceSlot> ranks = place_replicas(cluster, subset, replicas, static_cast<int>(tp), pp);
          std::vector<std::string> names;
          for (int g : subset) names.push_back(cluster.groups[g].name);
          for (const Schedule& sched : schedules_for(pp, layers, o)) {
            for (int64_t m : micro_batch_counts(o.global_batch, o.max_micro_batches)) {
              const int64_t per_step = o.global_batch / m;
              if (per_step < dp) break;
              Layout l;
              if (!make_layout(dp, static_cast<int>(tp), pp, sched, m, ranks, &l)) continue;
              // One split for every replica (each replica's devices are equal).
              const int typical = static_cast<int>(std::max<int64_t>(1, per_step / dp));
              l.split = balance_for_speeds(layer_costs(profile, typical), std::vector<double>(pp * l.chunks, 1.0));
              for (const std::vector<int>& shares : batch_shares(per_step, replicas, speeds)) {
                l.replica_micro_batch_sizes.clear();
                double work = 0;  // the lower bound's: the slowest replica's, at the fastest speed
                double fastest = *std::max_element(speeds.begin(), speeds.end());
                for (size_t k = 0; k < subset.size(); ++k) {
                  const std::vector<double> costs = layer_costs(profile, shares[k]);
                  work = std::max(work, std::accumulate(costs.begin(), costs.end(), 0.0) * fastest / speeds[k]);
                  for (int j = 0; j < replicas[k]; ++j) l.replica_micro_batch_sizes.push_back(shares[k]);
                }
                l.micro_batch_size = *std::max_element(shares.begin(), shares.end());
                if (std::all_of(shares.begin(), shares.end(), [&](int b) { return b == shares[0]; }))
                  l.replica_micro_batch_sizes.clear();  // even: the plain layout
                for (int zero = 0; zero <= (dp > 1 ? 2 : 0); ++zero) {
                  l.zero = zero;
                  consider(l, names, work);
                }
              }
            }
          }
        }
      }
    }
    if (!o.aware) {
      // Symmetric: rank r on the r-th device, pp over the file order, layers split evenly.
      const std::vector<DeviceSlot> ranks = ranks_in_file_order(cluster, total);
      for (int64_t pp : divisors(total)) {
        if (pp > layers) continue;
        for (int64_t tp : divisors(total / pp)) {
          bool tp_ok = profile.model.heads % tp == 0 && profile.model.vocab % tp == 0;
          for (const MachineGroup& g : cluster.groups) tp_ok = tp_ok && g.devices_per_machine % tp == 0;
          const int dp = static_cast<int>(total / pp / tp);
          if (!tp_ok || o.global_batch % dp != 0) continue;
          for (const Schedule& sched : schedules_for(static_cast<int>(pp), layers, o))
            for (int64_t m : micro_batch_counts(o.global_batch / dp, o.max_micro_batches)) {
              Layout l;
              if (!make_layout(dp, static_cast<int>(tp), static_cast<int>(pp), sched, m, ranks, &l)) continue;
              l.micro_batch_size = static_cast<int>(o.global_batch / dp / m);
              l.split = pipeline::balance_partition(std::vector<double>(layers, 1.0), l.pp * l.chunks);
              const std::vector<double> costs = layer_costs(profile, l.micro_batch_size);
              const double work = std::accumulate(costs.begin(), costs.end(), 0.0);
              for (int zero = 0; zero <= (dp > 1 ? 2 : 0); ++zero) {
                l.zero = zero;
                std::vector<std::string> names;
                for (const MachineGroup& g : cluster.groups) names.push_back(g.name);
                consider(l, names, work);
              }
            }
        }
      }
    }
  }
  for (const auto& [key, value] : unfit)
    if (!best_of_family.count(key)) result.rejected.emplace_back(key, value.second);
  if (best_of_family.empty()) {
    *closest = "no layout was considered (check the global batch and the cluster)";
    double smallest = 1e300;
    for (const auto& [key, value] : unfit)
      if (value.first < smallest) {
        smallest = value.first;
        *closest = key + ": " + value.second;
      }
    return false;
  }
  std::vector<Candidate> ranked;
  for (auto& [key, c] : best_of_family) ranked.push_back(c);
  std::stable_sort(ranked.begin(), ranked.end(), [](const Candidate& a, const Candidate& b) {
    return a.estimate.step_s < b.estimate.step_s;
  });
  result.best = ranked.front();
  for (size_t i = 1; i < ranked.size() && static_cast<int>(i) <= o.runners_up; ++i)
    result.runners_up.emplace_back(ranked[i], why_lost(ranked[i], result.best));
  return true;
}

// One device fewer in a one-group cluster: a whole machine while there are several, then
// a device of the last one. False at one device.
bool drop_a_device(Cluster* cluster) {
  MachineGroup& g = cluster->groups[0];
  if (g.machines > 1) --g.machines;
  else if (g.devices_per_machine > 1) --g.devices_per_machine;
  else return false;
  return true;
}

}  // namespace

SearchResult search(const Profile& profile, const Cluster& cluster, const SearchOptions& o) {
  const auto started = std::chrono::steady_clock::now();
  TRIREME_CHECK(o.global_batch >= 1 && o.global_batch <= kMaxGlobalBatch, "the global batch (--global-batch) must be "
                "from 1 to ", kMaxGlobalBatch, " sequences, got ", o.global_batch);
  SearchResult result;
  std::string closest;
  bool found = search_whole_groups(profile, cluster, o, &result, &closest);
  if (!found && result.evaluated == 0 && o.fewer_devices && cluster.groups.size() == 1) {
    // An awkward device count (a prime one above the layer count, with fewer sequences
    // than devices, say) may leave no layout that runs on all of them: the fastest on
    // fewer, the others left idle. A smaller size's (machine, device) slots are the whole
    // cluster's, so its layouts are the whole cluster's as they stand. (Where layouts ran
    // but none fit in memory the error stays: trying every smaller size took 22 s instead
    // of 0.9 s on 64 machines of 8 A100s, to fail again in all but rare cases.)
    Cluster fewer = cluster;
    // No layout runs on more than dp x tp x pp <= global batch x devices per machine x
    // layers: sizes above that are skipped unsearched (20000 machines of 8 at a global
    // batch of 16 searched every size down from 160000 devices, for minutes).
    const int64_t most =
        o.global_batch * cluster.groups[0].devices_per_machine * static_cast<int64_t>(profile.layers.size());
    bool skipped = false;
    while (fewer.devices() > most && drop_a_device(&fewer)) skipped = true;
    // (The first size searched is the one the skip stopped at, else one device fewer.)
    for (bool more = skipped || drop_a_device(&fewer); more; more = drop_a_device(&fewer)) {
      if (o.progress)
        o.progress("no layout runs on all " + std::to_string(cluster.devices()) + " devices; searched down to " +
                   std::to_string(fewer.devices()));
      SearchResult r;
      std::string unused;
      const bool fits = search_whole_groups(profile, fewer, o, &r, &unused);
      result.evaluated += r.evaluated;
      result.pruned += r.pruned;
      if (fits && (!found || r.best.estimate.step_s < result.best.estimate.step_s)) {
        r.evaluated = result.evaluated;
        r.pruned = result.pruned;
        result = std::move(r);
        result.idle_devices = cluster.devices() - fewer.devices();
        found = true;
      }
    }
  }
  if (!found)
    TRIREME_THROW(InvalidArgument, "no layout fits this cluster; the closest, ", closest,
                  "; use more or larger devices, or a smaller model or batch");
  result.search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

std::vector<Candidate> best_per_size(const Profile& profile, const Cluster& cluster,
                                     const SearchOptions& options, int max_machines) {
  TRIREME_CHECK(cluster.groups.size() == 1, "spot replay plans a one-group cluster; ", cluster.name,
                " has ", cluster.groups.size(), " groups");
  // (Checked here: search's own refusal would read as "nothing fits" at every size.)
  TRIREME_CHECK(options.global_batch >= 1 && options.global_batch <= kMaxGlobalBatch,
                "the global batch must be from 1 to ", kMaxGlobalBatch, " sequences, got ", options.global_batch);
  // (Fewer machines are this function's own sizes; search's fallback to fewer devices
  // would search them again inside each.)
  SearchOptions whole = options;
  whole.fewer_devices = false;
  std::vector<Candidate> out(max_machines + 1);
  for (int n = 1; n <= max_machines; ++n) {
    Cluster shrunk = cluster;
    shrunk.groups[0].machines = n;
    try {
      out[n] = search(profile, shrunk, whole).best;
    } catch (const InvalidArgument&) {
      out[n] = Candidate{};  // nothing fits on n machines: step_s stays 0
    }
    // Leaving machines idle is a layout too: n machines do at least what n-1 do (a prime
    // count, say, may only split badly).
    const double previous = out[n - 1].estimate.step_s;
    if (previous > 0 && (out[n].estimate.step_s == 0 || previous < out[n].estimate.step_s)) out[n] = out[n - 1];
  }
  return out;
}

std::vector<int> near_even_shares(int64_t per_step, int dp) {
  std::vector<int> out(dp, static_cast<int>(per_step / dp));
  for (int r = 0; r < per_step % dp; ++r) ++out[r];
  return out;
}

}  // namespace trireme::plan
