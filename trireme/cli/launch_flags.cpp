// The launcher's flags: see launch_flags.h.
#include "trireme/cli/launch_flags.h"

#include "trireme/common/error.h"

namespace trireme::cli {

void add_launch_flags(FlagParser& parser, LaunchFlags* flags) {
  launch::LaunchOptions& o = flags->options;
  parser.add("nproc-per-node", &o.nproc_per_node, "workers to start on this node");
  parser.add("nnodes", &o.nnodes, "nodes (agents) in the job");
  parser.add("node-rank", &o.node_rank, "this node's index, 0..nnodes-1; node 0 hosts --rdzv");
  parser.add("rdzv", &flags->rdzv,
             "HOST:PORT of node 0's rendezvous store, the same on every node "
             "(default: an ephemeral port on 127.0.0.1, single node only)");
  parser.add("max-restarts", &o.max_restarts, "restart all workers after a failure up to N times (one machine); trireme train resumes them from snapshots");
  parser.add("standby", &flags->standby,
             "1: with --max-restarts, start each next generation's workers ahead of time so that a restart "
             "skips process start-up (default: 1 for trireme train, 0 for trireme run, whose program must "
             "then call trireme::launch::await_activation() first)");
  parser.add("heartbeat-timeout", &o.heartbeat_timeout_s,
             "kill (and, with --max-restarts, restart) a worker whose progress heartbeat stalls this many seconds (0: off)");
  parser.add("join-timeout", &o.join_timeout_s,
             "seconds to wait for all nodes to join the rendezvous");
}

launch::LaunchOptions finish_launch_flags(const LaunchFlags& flags,
                                          std::vector<std::string> command) {
  launch::LaunchOptions options = flags.options;
  if (!flags.rdzv.empty())
    parse_host_port("rdzv", flags.rdzv, &options.rdzv_host, &options.rdzv_port);
  options.command = std::move(command);
  TRIREME_CHECK(flags.standby >= -1 && flags.standby <= 1, "--standby takes 0 or 1, got ", flags.standby);
  if (flags.standby >= 0) options.standby = flags.standby == 1;
  launch::validate_launch_options(options);
  return options;
}

}  // namespace trireme::cli
