// World: store connection and group creation; see dist/world.h.
#include "trireme/dist/world.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "trireme/common/error.h"
#include "trireme/launch/agent_channel.h"
#include "trireme/launch/restart_clock.h"
#include "trireme/launch/standby.h"

namespace trireme::dist {
namespace {

// A client of the job's TCPStore that survives the loss of its connection.
//
// A c10d TCPStore client keeps one TCP connection for the whole run and never reconnects.
// TCPStore::set is fire-and-forget: when the connection is dropped while a value is in
// flight (seen just after the ~80 KB end-of-run sets, with nothing logged by the libuv
// server), set() still returns, the value is lost, and only the next operation fails
// with "Connection reset by peer" or "Broken pipe". So here every set is confirmed by
// a round trip (check() on the same connection, which the server answers after applying
// the set), and an operation that fails on a broken connection reconnects and is retried.
// Only idempotent operations are retried; add/compareSet/append report the failure.
// Each retry is told to `on_retry` (when set), in one line.
class ReconnectingStore final : public c10d::Store {
 public:
  using RetryNote = std::function<void(const std::string&)>;

  ReconnectingStore(std::string host, const c10d::TCPStoreOptions& options, RetryNote on_retry)
      : Store(options.timeout), host_(std::move(host)), options_(options), on_retry_(std::move(on_retry)),
        store_(c10::make_intrusive<c10d::TCPStore>(host_, options_)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    retried("set", [&](c10d::TCPStore& s) {
      s.set(key, value);
      confirm(s, {key});
    });
  }
  std::vector<uint8_t> get(const std::string& key) override {
    return retried("get", [&](c10d::TCPStore& s) { return s.get(key); });
  }
  bool check(const std::vector<std::string>& keys) override {
    return retried("check", [&](c10d::TCPStore& s) { return s.check(keys); });
  }
  void wait(const std::vector<std::string>& keys) override {
    retried("wait", [&](c10d::TCPStore& s) { s.wait(keys); });
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    retried("wait", [&](c10d::TCPStore& s) { s.wait(keys, timeout); });
  }
  bool deleteKey(const std::string& key) override {
    return retried("deleteKey", [&](c10d::TCPStore& s) { return s.deleteKey(key); });
  }
  int64_t getNumKeys() override {
    return retried("getNumKeys", [&](c10d::TCPStore& s) { return s.getNumKeys(); });
  }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    return retried("multiGet", [&](c10d::TCPStore& s) { return s.multiGet(keys); });
  }
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) override {
    retried("multiSet", [&](c10d::TCPStore& s) {
      s.multiSet(keys, values);
      confirm(s, keys);
    });
  }
  // Not idempotent: a retry after a lost reply would apply them twice.
  int64_t add(const std::string& key, int64_t value) override { return current()->add(key, value); }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return current()->compareSet(key, expected, desired);
  }
  void append(const std::string& key, const std::vector<uint8_t>& value) override {
    current()->append(key, value);
  }
  bool hasExtendedApi() const override { return true; }
  // Another client of the same store. Newer c10d (2.9+) declares Store::clone() and asks a
  // store for one; 2.7 has no such method, so this overrides there and is unused here.
  c10::intrusive_ptr<c10d::Store> clone() {
    c10d::TCPStoreOptions client;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      client = options_;
    }
    client.isServer = false;
    return c10::make_intrusive<ReconnectingStore>(host_, client, on_retry_);
  }
  void setTimeout(const std::chrono::milliseconds& timeout) override {
    Store::setTimeout(timeout);
    std::lock_guard<std::mutex> lock(mutex_);
    options_.timeout = timeout;
    store_->setTimeout(timeout);
  }

 private:
  static constexpr int kAttempts = 3;

  c10::intrusive_ptr<c10d::TCPStore> current() {
    std::lock_guard<std::mutex> lock(mutex_);
    return store_;
  }

  // The keys must be there once the server has read what this connection sent before.
  static void confirm(c10d::TCPStore& s, const std::vector<std::string>& keys) {
    if (!s.check(keys))
      C10_THROW_ERROR(DistNetworkError, "the store did not keep a value just set");
  }

  // A timeout is an answer (the key is not there), not a broken connection.
  static bool is_timeout(const std::string& text) {
    return text.find("imeout") != std::string::npos || text.find("timed out") != std::string::npos;
  }

  template <typename Fn>
  auto retried(const char* what, Fn&& fn) -> decltype(fn(std::declval<c10d::TCPStore&>())) {
    for (int attempt = 1;; ++attempt) {
      const c10::intrusive_ptr<c10d::TCPStore> s = current();
      try {
        return fn(*s);
      } catch (const c10::DistNetworkError& e) {
        const std::string text = e.what_without_backtrace();
        if (attempt >= kAttempts || is_timeout(text)) throw;
        if (on_retry_)
          on_retry_(detail::concat("the connection to the rendezvous store at ", host_, ":", options_.port,
                                   " broke during ", what, " (", text, "); reconnecting and retrying"));
        reconnect(s);
      }
    }
  }

  // Replaces the connection `broken` (unless another thread already did).
  void reconnect(const c10::intrusive_ptr<c10d::TCPStore>& broken) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (store_ != broken) return;
    store_ = c10::make_intrusive<c10d::TCPStore>(host_, options_);
  }

  const std::string host_;
  c10d::TCPStoreOptions options_;  // a client's: never isServer
  const RetryNote on_retry_;
  std::mutex mutex_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

Store connect_store(const WorldInfo& info, const WorldOptions& options) {
  if (info.world_size == 1 && info.master_port == 0) return c10::make_intrusive<c10d::HashStore>();
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(info.master_port);
  store_options.isServer = !info.agent_hosts_store && info.rank == 0;
  store_options.numWorkers = std::nullopt;
  store_options.waitWorkers = false;
  store_options.timeout = options.connect_timeout;
  try {
    // A rank that hosts the server keeps the plain TCPStore: replacing it would stop the
    // server. Its own connection is to itself, over loopback.
    if (store_options.isServer)
      return c10::make_intrusive<c10d::TCPStore>(info.master_addr, store_options);
    return c10::make_intrusive<ReconnectingStore>(info.master_addr, store_options, options.on_store_retry);
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

// Runs one store operation on `key`; c10d's errors (DistNetworkError, DistStoreError, a
// time-out) become a CommError naming the operation and the key.
template <typename Fn>
auto on_store(const char* what, const std::string& key, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    TRIREME_THROW(CommError, "the rendezvous store failed to ", what, " '", key, "': ", error_text(e));
  }
}

// The store holds bytes; World's keys hold text.
void put_text(const Store& store, const std::string& key, const std::string& text) {
  on_store("set", key, [&] { store->set(key, std::vector<uint8_t>(text.begin(), text.end())); });
}

std::string text_at(const Store& store, const std::string& key) {
  const std::vector<uint8_t> bytes = on_store("get", key, [&] { return store->get(key); });
  return std::string(bytes.begin(), bytes.end());
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
  put_text(base_store_, launch::keys::role(rank()), role);
}

World World::from_env(const WorldOptions& options) {
  TRIREME_CHECK(!launch::awaiting_activation(),
                "this worker was started as a standby (trireme run --standby) but joined the world before "
                "it was activated; call trireme::launch::await_activation() first in main");
  return connect(world_info_from_env(), options);
}

World World::connect(const WorldInfo& info, const WorldOptions& given) {
  WorldOptions options = given;
  options.group.master_addr = info.master_addr;
  options.group.spans_machines = info.spans_machines();
  // NCCL: one GPU per process, by its rank on the machine, unless the caller chose one
  // (left to c10d, a subgroup's first barrier would guess rank % GPUs: another's GPU).
  if (options.group.backend == BackendKind::kNccl && options.group.cuda_device < 0)
    options.group.cuda_device = info.local_rank;
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
  for (size_t i = 0; i < ranks.size(); ++i) {
    TRIREME_CHECK(ranks[i] >= 0 && ranks[i] < size(), "group '", tag, "' [", join(ranks), "]: rank ", ranks[i],
                  " is not in this world of ", size(), " ranks; give ranks in 0..", size() - 1);
    TRIREME_CHECK(std::find(ranks.begin(), ranks.begin() + i, ranks[i]) == ranks.begin() + i, "group '", tag,
                  "' [", join(ranks), "] names rank ", ranks[i], " twice; give each member once");
  }
  const auto me = std::find(ranks.begin(), ranks.end(), rank());
  TRIREME_CHECK(me != ranks.end(), "rank ", rank(), " is not a member of group '", tag, "' [", join(ranks),
                "]; create a group only on its members");
  // Members and tag name the group; the count keeps two groups of the same members and tag
  // apart. It counts only such groups, which every member creates in the same order, so
  // the members agree on it whichever other groups each of them created. (Members and count
  // hold no '/', so the tag, last, cannot make two keys alike.) A long member list is
  // named by its size and a hash (group_key_name).
  const std::string members = group_key_name(ranks);
  const int64_t index = groups_created_[members + "/" + tag]++;
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
      "group/" + members + "/" + std::to_string(index) + "/" + tag, store_);
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

void World::heartbeat(int64_t progress) {
  put_text(base_store_, launch::keys::heartbeat(info_.restart_count, rank()), std::to_string(progress));
}

std::optional<World::RestartTimes> World::restart_times() const {
  if (info_.restart_count == 0) return std::nullopt;
  const int g = info_.restart_count;
  const std::vector<std::string> keys{launch::keys::restart_seen(g), launch::keys::restart_decided(g),
                                      launch::keys::restart_resume(g)};
  try {
    if (!base_store_->check(keys)) return std::nullopt;
    std::vector<launch::Stamp> stamps;
    for (const auto& key : keys) {
      const auto stamp = launch::parse_stamp(text_at(base_store_, key));
      if (!stamp) return std::nullopt;
      stamps.push_back(*stamp);
    }
    // Each moment on this machine's clock, from the agents' readings of the barrier's
    // opening (launch/restart_clock.h): the agent's node id is TRIREME_NODE_RANK.
    // (-1, no node, unless it is a plain count: atoi would read "abc" as node 0.)
    const char* node_text = std::getenv("TRIREME_NODE_RANK");
    const bool readable = node_text && *node_text && std::strlen(node_text) < 10 &&
                          std::strspn(node_text, "0123456789") == std::strlen(node_text);
    const int own = readable ? std::atoi(node_text) : -1;
    std::map<int, double> barrier_seen;
    for (int node : {own, stamps[0].node, stamps[1].node, stamps[2].node}) {
      const std::string key = launch::keys::restart_clock(g, node);
      if (node < 0 || barrier_seen.count(node) > 0 || !base_store_->check({key})) continue;
      if (const auto seen = launch::parse_stamp(text_at(base_store_, key))) barrier_seen[node] = seen->us;
    }
    RestartTimes out;
    out.failure_seen_us = launch::on_clock_of(own, stamps[0], barrier_seen);
    out.members_decided_us = launch::on_clock_of(own, stamps[1], barrier_seen);
    out.recovered_us = launch::on_clock_of(own, stamps[2], barrier_seen);
    return out;
  } catch (const std::exception&) {
    return std::nullopt;  // a store that cannot say: unknown
  }
}

void World::reporting_recovery() {
  put_text(base_store_, launch::keys::restart_reported(info_.restart_count), "1");
}

std::optional<std::string> World::job_value(const std::string& key) const {
  const std::string stored = launch::keys::job_value(key);
  if (!on_store("check", stored, [&] { return base_store_->check({stored}); })) return std::nullopt;
  return text_at(base_store_, stored);
}

void World::set_job_value(const std::string& key, const std::string& value) {
  put_text(base_store_, launch::keys::job_value(key), value);
}

void World::heartbeat_done() {
  put_text(base_store_, launch::keys::heartbeat(info_.restart_count, rank()), launch::keys::kHeartbeatDone);
}

std::vector<std::string> World::gather_on_leader(const std::string& key, const std::string& text) {
  put_text(store_, key + "/" + std::to_string(rank()), text);
  run_collective("gather barrier", [&] { return group()->barrier(); });
  std::vector<std::string> texts;
  if (rank() != 0) return texts;
  for (int r = 0; r < size(); ++r) texts.push_back(text_at(store_, key + "/" + std::to_string(r)));
  return texts;
}

}  // namespace trireme::dist
