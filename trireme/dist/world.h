// World: this process's place in the job and the process groups it talks through.
//
// A World is built once per worker from the launcher's environment (dist/world_env.h). It
// connects to the job's c10d TCPStore (hosted by the `trireme run` agent, or by rank 0 when
// launched by Slurm/mpirun), and creates groups on demand: the whole world, any subset of
// ranks, or one group per mesh axis. Groups are returned and passed explicitly; nothing
// here is global.
//
// Store keys of a World live under "trireme/gen<G>/", G the restart generation, so a
// restarted job never sees the previous generation's rendezvous keys.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "trireme/dist/backend.h"
#include "trireme/dist/mesh.h"
#include "trireme/dist/world_env.h"

namespace trireme::dist {

struct WorldOptions {
  // connect() fills in group.master_addr and group.spans_machines from the WorldInfo.
  GroupOptions group;
  // How long to wait for the store and for all ranks to arrive.
  std::chrono::milliseconds connect_timeout{std::chrono::minutes(2)};
  // Told, in one line, each time the connection to the rendezvous store broke and the
  // operation is retried on a new one (a command prints it on stderr); unset: retried
  // silently. Called on the thread of the store operation.
  std::function<void(const std::string&)> on_store_retry;
};

// The groups of one rank in a mesh: for each axis, the group along that axis holding this
// rank, plus this rank's coordinates.
struct MeshGroups {
  Mesh mesh;
  int rank = 0;
  std::map<std::string, Group> by_axis;

  const Group& axis(const std::string& name) const;
  int coord(const std::string& name) const { return mesh.coord(rank, name); }
  int size(const std::string& name) const { return mesh.size(name); }
};

class World {
 public:
  // Reads the environment and connects. Throws InvalidArgument for a bad environment and
  // CommError when the store or the peers cannot be reached.
  static World from_env(const WorldOptions& options = {});
  static World connect(const WorldInfo& info, const WorldOptions& options = {});

  const WorldInfo& info() const { return info_; }
  int rank() const { return info_.rank; }
  int size() const { return info_.world_size; }
  const Store& store() const { return store_; }

  // The group of all ranks (created on first use).
  const Group& group();
  // A group of `ranks` (distinct ranks of this world, this rank one of them; throws
  // InvalidArgument otherwise). A group is told apart in the store by its members, its tag
  // and how many groups of the same members and tag this rank created before it: the
  // members must create their common groups in the same order, whatever other groups each
  // of them joins in between. Creating a group waits for its members (Gloo connects them
  // all), so every rank must create its groups in one consistent global order: {0,1} then
  // {1,2} on every member, never {1,2} first on rank 1 while rank 0 waits in {0,1}.
  Group new_group(const std::vector<int>& ranks, const std::string& tag);
  // One group per axis of `mesh` (which must cover the world).
  MeshGroups mesh_groups(const Mesh& mesh);
  // Publishes a one-line description of this rank's place in the job (e.g. "pipeline
  // stage 1 of 2, data-parallel replica 0"); `trireme run` names it if this rank fails.
  void announce_role(const std::string& role);
  // A value kept for the whole job, across restarts (in the launcher's store): what a
  // restarted generation must agree on with the first, e.g. where the pipeline cut the
  // model. nullopt when not set. (Within one generation, ranks may read it before or
  // after another sets it: decide from it only in a restarted generation.)
  std::optional<std::string> job_value(const std::string& key) const;
  void set_job_value(const std::string& key, const std::string& value);
  // Tells the agent this rank is making progress (`progress`: e.g. the step done); under
  // --heartbeat-timeout the agent kills a rank whose heartbeat stops changing.
  void heartbeat(int64_t progress);
  // Tells the agent this rank has finished its work: it is writing its results and
  // exiting, which has no progress to beat; the agent then allows it 10x
  // --heartbeat-timeout (60 s at least) before it takes it for hung.
  void heartbeat_done();
  // In a generation that `trireme run` restarted after a failure, when its agents saw it
  // happen, in wall-clock microseconds since the epoch on this machine's clock
  // (obs::wall_us(); moments seen on other machines are moved by the difference of the
  // agents' readings of the recovery barrier, launch/restart_clock.h; a moment from a node
  // that is no longer a member stays on its clock): an agent saw the failure, the new membership was
  // decided, the last agent reached the recovery barrier (snapshots rebuilt, if any; the
  // workers start after it). nullopt in a first generation, or when the launcher did not
  // say.
  struct RestartTimes {
    double failure_seen_us = 0, members_decided_us = 0, recovered_us = 0;
  };
  std::optional<RestartTimes> restart_times() const;
  // Tells the agents that this program reports the restart's recovery itself (from
  // restart_times()), so that they leave out their own line, which is timed by their
  // poll of the workers' heartbeats. Call it before the first heartbeat.
  void reporting_recovery();
  // Every rank publishes `text` under `key` through the store (so this works across
  // machines); after a barrier of group() rank 0 reads them all. Returns every rank's
  // text, in rank order, on rank 0 and nothing elsewhere. A collective: all ranks call it.
  std::vector<std::string> gather_on_leader(const std::string& key, const std::string& text);

 private:
  World(WorldInfo info, WorldOptions options, Store base, Store store);

  WorldInfo info_;
  WorldOptions options_;
  Store base_store_;  // the launcher's keys
  Store store_;  // prefixed by the generation
  Group world_group_;
  std::map<std::string, int64_t> groups_created_;  // by "members/tag"
};

}  // namespace trireme::dist
