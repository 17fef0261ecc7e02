// The membership of a job's next generation, from what the restart's leader found out
// about each node: pure, so the rule is tested without processes (tests/unit/
// test_membership.cpp) and the agent (agent.cpp) only gathers the facts.
//
// Rule: every old member that checked in stays; one that left or went silent is dropped;
// nodes asking to join fill the places up to --nnodes MAX, lowest id first; the members
// are sorted by id (a member's index is its machine position, so ranks follow ids). Fewer
// than --nnodes MIN members: the job cannot go on, and `failure` says why in one line.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace trireme::launch {

enum class NodeState { kCheckedIn, kLeft, kLost, kJoining };

struct MembershipDecision {
  std::vector<int> members;  // the next generation's node ids, ascending
  std::vector<int> dropped;  // old members not in it (left or lost)
  std::string why_dropped;   // "node 2 is lost (no heartbeat for 5 s); node 1 left the job"
  std::string failure;       // non-empty when fewer than min_nodes remain
};

// A seconds flag's value as the user would write it: 0.5, 3, 120.
std::string seconds_text(double seconds);

// "node N is lost (no heartbeat for T s)": how a node silent for --node-timeout is named.
std::string lost_node(int node, double node_timeout_s);

// previous: the old generation's members; states: what became of each of them and of every
// node asking to join; node_timeout_s names the silence that made a node lost.
MembershipDecision decide_membership(const std::vector<int>& previous, const std::map<int, NodeState>& states,
                                     int min_nodes, int max_nodes, bool elastic, double node_timeout_s);

}  // namespace trireme::launch
