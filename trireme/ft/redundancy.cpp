// The placement of erasure-coded snapshot blocks across machines; see redundancy.h.
#include "trireme/ft/redundancy.h"

#include <algorithm>
#include <cstdio>

#include "trireme/common/error.h"

namespace trireme::ft {

std::vector<BlockRef> RedundancyGroup::codeword(int j) const {
  const int n = size();
  TRIREME_CHECK(j >= 0 && j < n, "codeword ", j, " of a group of ", n, " machines");
  std::vector<BlockRef> refs;
  for (int p = 0; p < k; ++p) refs.push_back({machines[static_cast<size_t>((j + p) % n)], false, p});
  for (int r = 0; r < m; ++r) refs.push_back({machines[static_cast<size_t>((j + k + r) % n)], true, r});
  return refs;
}

std::vector<std::pair<int, int>> RedundancyGroup::parity_kept_by(int machine) const {
  std::vector<std::pair<int, int>> kept;
  for (int j = 0; j < size(); ++j) {
    const std::vector<BlockRef> refs = codeword(j);
    for (int pos = k; pos < k + m; ++pos)
      if (refs[static_cast<size_t>(pos)].machine == machine) kept.emplace_back(j, pos);
  }
  return kept;
}

bool RedundancyGroup::recoverable(const std::vector<int>& lost) const {
  for (int j = 0; j < size(); ++j) {
    int missing = 0;
    for (const BlockRef& ref : codeword(j))
      missing += std::count(lost.begin(), lost.end(), ref.machine) > 0 ? 1 : 0;
    if (missing > m) return false;
  }
  return true;
}

RedundancyPlan RedundancyPlan::make(int machines, int k, int m) {
  TRIREME_CHECK(k >= 1 && m >= 0, "--redundancy ", k, "+", m, ": need k >= 1 data machines and m >= 0 parity");
  TRIREME_CHECK(machines >= k + m, "--redundancy ", k, "+", m, " needs at least ", k + m, " machines, the job has ",
                machines, "; lower it or add machines");
  // A group is one Reed-Solomon code word: at most 255 machines (GF(2^8)).
  TRIREME_CHECK(k + m <= 255, "--redundancy ", k, "+", m, ": a code spans at most 255 machines; lower K or M");
  const int groups = std::max(machines / (k + m), (machines + 254) / 255);
  TRIREME_CHECK(machines / groups >= k + m, "--redundancy ", k, "+", m, " on ", machines,
                " machines: groups of at most 255 machines cannot each hold ", k + m, "; lower K");
  RedundancyPlan plan;
  int next = 0;
  for (int g = 0; g < groups; ++g) {
    // Near-equal sizes, each at least k + m: the first (machines % groups) get one more.
    const int n = machines / groups + (g < machines % groups ? 1 : 0);
    RedundancyGroup group;
    for (int i = 0; i < n; ++i) group.machines.push_back(next++);
    group.k = n - m;
    group.m = m;
    plan.groups.push_back(std::move(group));
  }
  return plan;
}

std::pair<int, int> RedundancyPlan::parse(const std::string& spec) {
  int k = 0, m = 0;
  char tail = 0;
  TRIREME_CHECK(std::sscanf(spec.c_str(), "%d+%d%c", &k, &m, &tail) == 2 && k >= 1 && m >= 0,
                "--redundancy '", spec, "': expected K+M with K >= 1 data and M >= 0 parity machines, e.g. 2+1");
  return {k, m};
}

const RedundancyGroup& RedundancyPlan::group_of(int machine) const {
  for (const RedundancyGroup& g : groups)
    if (std::find(g.machines.begin(), g.machines.end(), machine) != g.machines.end()) return g;
  TRIREME_THROW(InvalidArgument, "machine ", machine, " is in no redundancy group");
}

bool RedundancyPlan::recoverable(const std::vector<int>& lost) const {
  return std::all_of(groups.begin(), groups.end(), [&](const RedundancyGroup& g) { return g.recoverable(lost); });
}

}  // namespace trireme::ft
