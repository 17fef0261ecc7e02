// The next generation's membership; see membership.h.
#include "trireme/launch/membership.h"

#include <algorithm>
#include <cstdio>

namespace trireme::launch {

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

std::string lost_node(int node, double node_timeout_s) {
  return "node " + std::to_string(node) + " is lost (no heartbeat for " + seconds_text(node_timeout_s) + " s)";
}

MembershipDecision decide_membership(const std::vector<int>& previous, const std::map<int, NodeState>& states,
                                     int min_nodes, int max_nodes, bool elastic, double node_timeout_s) {
  MembershipDecision d;
  const auto state_of = [&](int id) {
    auto it = states.find(id);
    return it == states.end() ? NodeState::kLost : it->second;
  };
  for (int id : previous) {
    const NodeState state = state_of(id);
    if (state == NodeState::kCheckedIn) {
      d.members.push_back(id);
      continue;
    }
    d.dropped.push_back(id);
    d.why_dropped += (d.why_dropped.empty() ? "" : "; ") +
                     (state == NodeState::kLeft ? "node " + std::to_string(id) + " left the job"
                                                : lost_node(id, node_timeout_s));
  }
  for (const auto& [id, state] : states)  // ascending ids
    if (state == NodeState::kJoining && static_cast<int>(d.members.size()) < max_nodes &&
        std::find(previous.begin(), previous.end(), id) == previous.end())
      d.members.push_back(id);
  std::sort(d.members.begin(), d.members.end());
  if (static_cast<int>(d.members.size()) < min_nodes) {
    const size_t n = d.members.size();
    d.failure = d.why_dropped + "; " + std::to_string(n) + " node" + (n == 1 ? "" : "s") + " left, fewer than " +
                (elastic ? "--nnodes MIN = " + std::to_string(min_nodes)
                         : "the " + std::to_string(max_nodes) +
                               " the job needs (give --nnodes MIN:MAX to go on with fewer)");
  }
  return d;
}

}  // namespace trireme::launch
