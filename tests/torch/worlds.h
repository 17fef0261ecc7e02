// Several ranks as threads of one test process, each a dist::World over a real TCPStore
// that the test hosts on an ephemeral loopback port, as `trireme run`'s agent does (a port
// picked free and bound later could be taken in between).
#pragma once

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <functional>
#include <optional>

#include "ranks.h"
#include "trireme/dist/world.h"

namespace trireme::testing {

// A store server on an ephemeral loopback port.
inline c10::intrusive_ptr<c10d::TCPStore> host_store() {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  options.numWorkers = std::nullopt;
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}

// Rank `rank` of `size`, a client of `server`.
inline dist::World world_client(const c10d::TCPStore& server, int rank, int size, dist::WorldOptions options = {}) {
  dist::WorldInfo info;
  info.rank = info.local_rank = rank;
  info.world_size = info.local_world_size = size;
  info.master_port = server.getPort();
  info.agent_hosts_store = true;
  return dist::World::connect(info, options);
}

// Runs fn(world) on `size` threads, each a rank; a collective that does not match fails
// after `timeout` instead of hanging. Rethrows the first rank's failure.
inline void run_worlds(int size, const std::function<void(dist::World&)>& fn,
                       std::chrono::seconds timeout = std::chrono::seconds(60)) {
  const auto server = host_store();
  run_threads(size, [&](int rank) {
    dist::WorldOptions options;
    options.group.timeout = timeout;
    dist::World world = world_client(*server, rank, size, options);
    fn(world);
    world.group()->barrier()->wait();  // no rank tears down its groups while another uses them
  });
}

}  // namespace trireme::testing
