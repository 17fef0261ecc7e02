// launch(): validates the options, opens the rendezvous store (node 0 hosts it, the other
// nodes connect to it), builds the snapshot keeper that --redundancy asks for, and runs
// this node's agent on them.
#include <cstdlib>

#include "trireme/common/error.h"
#include "trireme/ft/parity_keeper.h"
#include "trireme/ft/redundancy.h"
#include "trireme/launch/agent.h"
#include "trireme/launch/launcher.h"
#include "trireme/launch/process.h"
#include "trireme/launch/tcp_store_channel.h"

namespace trireme::launch {

LaunchResult launch(const LaunchOptions& options) {
  validate_launch_options(options);
  const std::string& program = options.command.front();
  const char* path = std::getenv("PATH");
  TRIREME_CHECK(!find_executable(program, path ? path : "/usr/bin:/bin").empty(),
                "cannot execute '", program,
                "': no such executable file (give a path, or put it on PATH)");
  const std::chrono::milliseconds timeout(1000LL * options.join_timeout_s);
  std::unique_ptr<TcpStoreChannel> channel =
      options.node_rank == 0 && !options.external_store ? TcpStoreChannel::host(options.rdzv_port, timeout)
                             : TcpStoreChannel::connect(options.rdzv_host, options.rdzv_port,
                                                        timeout);
  const StoreAddress store{options.rdzv_host, channel->port()};
  std::unique_ptr<ft::ParityKeeper> keeper;
  if (!options.redundancy.empty()) {
    const auto [k, m] = ft::RedundancyPlan::parse(options.redundancy);
    keeper = std::make_unique<ft::ParityKeeper>(k, m, options.redundancy_cpu);
    // The keeper's Gloo group binds the address on the route to the rendezvous host, as
    // the workers' groups do (dist/gloo/backend.cpp reads MASTER_ADDR).
    ::setenv("MASTER_ADDR", options.rdzv_host.c_str(), /*overwrite=*/0);
  }
  return run_agent(options, *channel, store, {}, keeper.get());
}

}  // namespace trireme::launch
