// World: store connection and group creation; see dist/world.h.
#include "trireme/dist/world.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <sstream>

#include "trireme/common/error.h"
#include "trireme/launch/agent_channel.h"

namespace trireme::dist {
namespace {

Store connect_store(const WorldInfo& info, const WorldOptions& options) {
  if (info.world_size == 1 && info.master_port == 0) return c10::make_intrusive<c10d::HashStore>();
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(info.master_port);
  store_options.isServer = !info.agent_hosts_store && info.rank == 0;
  store_options.numWorkers = std::nullopt;
  store_options.waitWorkers = false;
  store_options.timeout = options.connect_timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(info.master_addr, store_options);
  } catch (const std::exception& e) {
    TRIREME_THROW(CommError, "cannot reach the rendezvous store at ", info.master_addr, ":",
                  info.master_port, " (", error_text(e), ")");
  }
}

std::string join(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? "," : "") << ranks[i];
  return out.str();
}

}  // namespace

const Group& MeshGroups::axis(const std::string& name) const {
  auto it = by_axis.find(name);
  TRIREME_CHECK(it != by_axis.end(), "no group for mesh axis '", name, "'");
  return it->second;
}

World::World(WorldInfo info, WorldOptions options, Store base, Store store)
    : info_(std::move(info)), options_(options), base_store_(std::move(base)), store_(std::move(store)) {}

void World::announce_role(const std::string& role) {
  base_store_->set(launch::keys::role(rank()), std::vector<uint8_t>(role.begin(), role.end()));
}

World World::from_env(const WorldOptions& options) {
  return connect(world_info_from_env(), options);
}

World World::connect(const WorldInfo& info, const WorldOptions& options) {
  Store base = connect_store(info, options);
  Store store = c10::make_intrusive<c10d::PrefixStore>(
      "trireme/gen" + std::to_string(info.restart_count), base);
  return World(info, options, base, std::move(store));
}

const Group& World::group() {
  if (!world_group_) {
    std::vector<int> all(size());
    for (int r = 0; r < size(); ++r) all[r] = r;
    world_group_ = new_group(all, "world");
  }
  return world_group_;
}

Group World::new_group(const std::vector<int>& ranks, const std::string& tag) {
  const auto me = std::find(ranks.begin(), ranks.end(), rank());
  TRIREME_CHECK(me != ranks.end(), "rank ", rank(), " is not a member of group [",
                join(ranks), "]");
  // The counter keeps two groups of the same tag and members apart; every member creates
  // its groups in the same order, so the counters agree.
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
      "group/" + std::to_string(groups_created_++) + "/" + tag + "/" + join(ranks), store_);
  return create_group(prefixed, static_cast<int>(me - ranks.begin()),
                      static_cast<int>(ranks.size()), options_.group);
}

MeshGroups World::mesh_groups(const Mesh& mesh) {
  TRIREME_CHECK(mesh.world_size() == size(), "layout ", mesh.describe(), " needs ",
                mesh.world_size(), " ranks but the job has ", size(),
                "; make dp*tp*pp equal the number of processes");
  MeshGroups out{mesh, rank(), {}};
  for (const auto& axis : mesh.axes()) {
    const auto members = mesh.group(rank(), axis.name);
    out.by_axis[axis.name] = members.size() == static_cast<size_t>(size())
                                 ? group()
                                 : new_group(members, "mesh-" + axis.name);
  }
  return out;
}

}  // namespace trireme::dist
