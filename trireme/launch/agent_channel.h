// AgentChannel: the little a node agent needs from the rendezvous store, as a pure
// interface, so the agent's protocol and supervision can be tested with an in-memory fake.
// The real one is TcpStoreChannel (tcp_store_channel.h), a client of node 0's c10d TCPStore.
//
// Keys the agents use (all under "trireme/"; workers share the store and use other keys):
//   trireme/run_id          set by node 0 before joining (with --rdzv-external: by the
//                           first agent to claim it); becomes TORCHELASTIC_RUN_ID
//   trireme/agents/joined   counter; each agent adds 1 when it arrives
//   trireme/agents/ready    set by the agent whose add made `joined` reach nnodes
//   trireme/failure         one line naming the first failed rank (or stopped agent),
//                           written by compare-and-set so that the first stands; every
//                           agent polls it and stops its workers when set
//   trireme/agents/done     counter; each agent adds 1 when its workers are gone
//   trireme/agents/done/N   agent N added to it: a restart leader stops waiting for N
//   trireme/agents/all_done set by the agent whose add made `done` reach nnodes; node 0
//                           waits for it before closing the store
//   trireme/restart/G       (--max-restarts) set by an agent whose worker failed: every
//                           agent stops its workers and starts generation G
//   trireme/restart/G/claimed  counter; the agent whose add makes it 1 (the first to claim
//                           the restart) sets restart/G/seen and restart/G; a later one
//                           sets restart/G if it is still unset (the first may have died)
//   trireme/restart/G/seen  "US NODE": wall-clock microseconds since the epoch, on node
//                           NODE's clock, at which that agent saw the failure (set just
//                           before restart/G); the restarted workers report their
//                           recovery from it (dist::World::restart_times, restart_clock.h)
//   trireme/restart/G/reported  set by a restarted worker that reports the recovery itself,
//                           to the millisecond (trireme train); the agents then leave out
//                           their own line, timed by their 200 ms poll
//   trireme/restart/G/stopped  counter; each agent adds 1 once its workers are gone
//   trireme/restart/G/in/N  agent N's workers of generation G-1 are gone (its check-in)
//   trireme/restart/G/silent  set before restart/G when the restart is for a member whose
//                           heartbeat stopped: workers get a short grace (they cannot
//                           finish a step whose collectives wait on that machine)
//   trireme/restart/G/decided  "US NODE": when the leader decided the membership (set just
//                           before restart/G/members)
//   trireme/restart/G/members  "IDS;LEADER": the node ids of generation G ("0,2;0"), set
//                           by the first agent to check in (the leader) once every member
//                           of G-1 has checked in, left, or been lost; IDS is empty when too
//                           few remain. Written by compare-and-set, so the first decision
//                           stands: a leader taken for lost (a stall longer than
//                           --node-timeout, not a death) that decides too does not replace
//                           it, and one that dies before writing leaves nothing half done
//   trireme/restart/G/dropped/N  member N of G-1 is not in G: the first agent to take the
//                           membership sets it (compare-and-set) and raises lost/N, so the
//                           count is raised once, whichever agents survive the restart
//   trireme/restart/G/lead/A  the node id of the agent leading attempt A at deciding
//                           generation G: attempt 0 is the first to check in; a member
//                           waiting for the membership whose leader's heartbeat stopped for
//                           --node-timeout claims attempt A+1 and leads it, counting the
//                           leaders before it lost (their machines died mid-restart)
//   trireme/restart/G/lead/A/claimed  counter (A >= 1): the agent whose add makes it 1
//                           leads attempt A
//   trireme/restart/G/recovered  counter: members that finished recovering their snapshots;
//                           the last sets restart/G/resume ("US NODE": when it did), and
//                           then workers start
//   trireme/restart/G/clock/N  agent N's wall clock when it saw restart/G/resume set: the
//                           machines' clock offsets, for the workers' report
//                           (while waiting, a member whose heartbeat went silent for
//                           --node-timeout makes the others restart without it)
//   trireme/job/KEY         a worker's value for the whole job, across restarts
//                           (dist::World::job_value), e.g. where the pipeline cut the model
//   trireme/generation      the newest generation whose membership was decided
//   trireme/agents/alive/N  agent N's heartbeat (a counter it raises every 200 ms)
//                           that the two unfinished members before it in the ring
//                           of members watch while the workers run (watch_nodes)
//   trireme/agents/left/N/I  agent N leaves the job (a preemption notice); I, its
//                           incarnation, is lost/N while it is a member
//   trireme/agents/flushed/N/I  agent N's last snapshot step is protected (or it gave up):
//                           the others keep their keepers running until then
//   trireme/agents/lost/N   counter: times node N was dropped from the job, so that a
//                           replacement may join under the same --node-rank
//   trireme/agents/nodeN    counter: agents that took --node-rank N; one more than
//                           lost/N refuses the agent (an agent that gives up before it
//                           is a member takes its add back, so a retry is not refused)
//   trireme/agents/pending/N  a node that asks to join the running job (elastic jobs): the
//                           job's run id while it asks, "" once it withdrew, admitted(G)
//                           once restart G's leader took it (one compare-and-set each)
//   trireme/agents/pending  counter of such requests, which running agents watch
//   trireme/end/G           counter deciding how generation G ends when its workers finish
//                           on one node while another would restart it for a join: an
//                           agent whose workers all finished adds kFinished, one that
//                           would take a joiner adds 1 (and does not, if a finish came
//                           first); the first to finish decides from the joins before it
//   trireme/end/G/decision  "finish" or "restart", set by that first agent to finish
//
// Every method may throw CommError when the store is unreachable.
#pragma once

#include <charconv>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>

namespace trireme::launch {

namespace keys {
inline constexpr const char* kRunId = "trireme/run_id";
// With a store of its own (--rdzv-external), the agent whose add makes this 1 sets run_id.
inline constexpr const char* kRunIdClaim = "trireme/run_id/claim";
inline constexpr const char* kJoined = "trireme/agents/joined";
inline constexpr const char* kReady = "trireme/agents/ready";
inline constexpr const char* kFailure = "trireme/failure";
inline constexpr const char* kDone = "trireme/agents/done";
// Set by agent N with its add to kDone: it is ending (its workers finished, or the job
// failed), so it will not check in to a restart.
inline std::string done(int node) { return std::string(kDone) + "/" + std::to_string(node); }
inline constexpr const char* kAllDone = "trireme/agents/all_done";
// A worker's one-line role ("pipeline stage 1 of 2, data-parallel replica 0"), set by the
// worker (dist::World::announce_role) and named by the agent when that worker fails.
inline std::string role(int rank) { return "trireme/role/" + std::to_string(rank); }
// The restart barrier of generation `generation` (see the list above).
inline std::string restart(int generation) { return "trireme/restart/" + std::to_string(generation); }
inline std::string restart_seen(int generation) { return restart(generation) + "/seen"; }
inline std::string restart_claimed(int generation) { return restart(generation) + "/claimed"; }
inline std::string restart_reported(int generation) { return restart(generation) + "/reported"; }
inline std::string restart_stopped(int generation) { return restart(generation) + "/stopped"; }
inline std::string restart_in(int generation, int node) {
  return restart(generation) + "/in/" + std::to_string(node);
}
inline std::string restart_decided(int generation) { return restart(generation) + "/decided"; }
inline std::string restart_members(int generation) { return restart(generation) + "/members"; }
inline std::string restart_dropped(int generation, int node) {
  return restart(generation) + "/dropped/" + std::to_string(node);
}
inline std::string restart_silent(int generation) { return restart(generation) + "/silent"; }
inline std::string restart_lead(int generation, int attempt) {
  return restart(generation) + "/lead/" + std::to_string(attempt);
}
inline std::string restart_lead_claimed(int generation, int attempt) {
  return restart_lead(generation, attempt) + "/claimed";
}
inline std::string restart_recovered(int generation) { return restart(generation) + "/recovered"; }
inline std::string restart_resume(int generation) { return restart(generation) + "/resume"; }
// Agent N's wall clock when it saw restart G's barrier open (restart_clock.h).
inline std::string restart_clock(int generation, int node) {
  return restart(generation) + "/clock/" + std::to_string(node);
}
inline constexpr const char* kGeneration = "trireme/generation";
inline std::string job_value(const std::string& key) { return "trireme/job/" + key; }
inline constexpr const char* kPending = "trireme/agents/pending";
inline std::string alive(int node) { return "trireme/agents/alive/" + std::to_string(node); }
// Per incarnation of node N: `incarnation` is lost(N) while that agent is a member (a
// replacement under the same --node-rank is the next), so a replacement does not inherit
// the leave of the machine it replaces.
inline std::string left(int node, int64_t incarnation) {
  return "trireme/agents/left/" + std::to_string(node) + "/" + std::to_string(incarnation);
}
inline std::string flushed(int node, int64_t incarnation) {
  return "trireme/agents/flushed/" + std::to_string(node) + "/" + std::to_string(incarnation);
}
inline std::string lost(int node) { return "trireme/agents/lost/" + std::to_string(node); }
inline std::string pending(int node) { return "trireme/agents/pending/" + std::to_string(node); }
// The value of pending/N once the leader of restart `generation` admitted node N.
inline constexpr const char* kAdmittedPrefix = "admitted at restart ";
inline std::string admitted(int generation) { return kAdmittedPrefix + std::to_string(generation); }
// The restart whose leader admitted the node, from pending/N's value (0: not admitted).
inline int admitted_at(const std::string& value) {
  const std::string prefix = kAdmittedPrefix;
  if (value.rfind(prefix, 0) != 0) return 0;
  int generation = 0;
  const char* end = value.data() + value.size();
  const auto [rest, error] = std::from_chars(value.data() + prefix.size(), end, generation);
  return error == std::errc{} && rest == end && generation > 0 ? generation : 0;
}
inline std::string node(int node) { return "trireme/agents/node" + std::to_string(node); }
inline std::string generation_end(int generation) { return "trireme/end/" + std::to_string(generation); }
inline constexpr int64_t kFinished = int64_t{1} << 32;
// A worker's progress in generation `generation` (a counter it raises, e.g. its step; set
// through dist::World::heartbeat). The agent kills a worker whose heartbeat stops changing
// for --heartbeat-timeout seconds; workers that never set it are not watched.
// A heartbeat of kHeartbeatDone: the worker has finished its work (it writes its results
// and exits, which may take long under load); it is allowed 10x the hang time-out.
inline constexpr const char* kHeartbeatDone = "done";
inline std::string heartbeat(int generation, int rank) {
  return "trireme/heartbeat/" + std::to_string(generation) + "/" + std::to_string(rank);
}
}  // namespace keys

class AgentChannel {
 public:
  virtual ~AgentChannel() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value of key, or nullopt when it is not set. Does not block.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  // Adds delta to the counter at key (created at 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Blocks until key is set or timeout passes; true when it is set.
  virtual bool wait_for(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Sets key to desired when it holds expected, in one step; an expected of "" also
  // matches a key that is not set (c10d's TCPStore does the same). Returns the value key
  // holds afterwards: desired when this call set it.
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;
};

}  // namespace trireme::launch
