// The launcher's flags: see launch_flags.h.
#include "trireme/cli/launch_flags.h"

#include "trireme/common/error.h"

namespace trireme::cli {
namespace {

// "N" or "MIN:MAX".
void parse_nnodes(const std::string& text, launch::LaunchOptions* options) {
  const auto colon = text.find(':');
  const auto number = [&](const std::string& part) {
    TRIREME_CHECK(!part.empty() && part.find_first_not_of("0123456789") == std::string::npos,
                  "--nnodes takes N or MIN:MAX (e.g. 2:3), got '", text, "'");
    TRIREME_CHECK(part.size() < 7, "--nnodes ", text, ": ", part, " nodes is too many; give at most 999999");
    return std::stoi(part);
  };
  if (colon == std::string::npos) {
    options->nnodes = number(text);
    options->nnodes_min = 0;
    return;
  }
  options->nnodes_min = number(text.substr(0, colon));
  options->nnodes = number(text.substr(colon + 1));
  TRIREME_CHECK(options->nnodes_min >= 1, "--nnodes ", text, ": MIN must be at least 1");
}

}  // namespace

void add_launch_flags(FlagParser& parser, LaunchFlags* flags, LaunchFlagSet set) {
  launch::LaunchOptions& o = flags->options;
  const bool all = set == LaunchFlagSet::kAll;
  parser.record_given(&flags->given);
  parser.add("nproc-per-node", &o.nproc_per_node, "workers to start on this node");
  parser.add("nnodes", &flags->nnodes,
             all ? "nodes (agents) in the job: N, or MIN:MAX for an elastic job that goes on while MIN remain "
                   "after machines are lost and takes nodes that join back up to MAX"
                 : "nodes (agents) in the job");
  parser.add("node-rank", &o.node_rank, "this node's id, 0..MAX-1; node 0 hosts --rdzv");
  parser.add("rdzv", &flags->rdzv,
             "HOST:PORT of node 0's rendezvous store, the same on every node "
             "(default: an ephemeral port on 127.0.0.1, single node only)");
  parser.add("join-timeout", &o.join_timeout_s, "seconds to wait for all nodes to join the rendezvous");
  if (!all) return;
  parser.add_switch("rdzv-external", &o.external_store,
                    "the store at --rdzv runs apart from the agents (`trireme store --port P` on a host that "
                    "stays): node 0 does not host it and may be lost like any other node");
  parser.add("max-restarts", &o.max_restarts,
             "start a new generation of workers after a failure, a lost or leaving machine, or a joining "
             "one, up to N times; trireme train resumes them from snapshots");
  parser.add("standby", &flags->standby,
             "1: with --max-restarts, start each next generation's workers ahead of time so that a restart "
             "skips process start-up (default: 1 for trireme train, 0 for trireme run, whose program must "
             "then call trireme::launch::await_activation() first)");
  parser.add("heartbeat-timeout", &o.heartbeat_timeout_s,
             "kill (and, with --max-restarts, restart) a worker whose progress heartbeat stalls this many seconds (0: off)");
  parser.add("node-timeout", &o.node_timeout_s,
             "seconds without an agent's heartbeat after which its machine counts as lost (default 5)");
  parser.add("grace-seconds", &o.preemption_grace_s,
             "SIGTERM to an agent of an elastic job is a spot preemption notice: its workers get this long "
             "to finish their step before it leaves the job (default 30)");
  parser.add("redundancy", &o.redundancy,
             "K+M: protect in-memory snapshots across machines with Reed-Solomon coding in groups of K data "
             "+ M parity machines, so any M machines of a group may be lost (1+1: mirror to a neighbour)");
  parser.add("redundancy-cpu", &o.redundancy_cpu,
             "share of one core a machine's --redundancy rounds may use on average (default 0.01): rounds are "
             "spaced to stay within it, so the newest protected step trails by about (CPU per round) / (share x "
             "step time) steps; 0: a round for every new snapshot step");
}

launch::LaunchOptions finish_launch_flags(const LaunchFlags& flags,
                                          std::vector<std::string> command) {
  launch::LaunchOptions options = flags.options;
  if (!flags.nnodes.empty()) parse_nnodes(flags.nnodes, &options);
  if (!flags.rdzv.empty())
    parse_host_port("rdzv", flags.rdzv, &options.rdzv_host, &options.rdzv_port);
  options.command = std::move(command);
  TRIREME_CHECK(flags.standby >= -1 && flags.standby <= 1, "--standby takes 0 or 1, got ", flags.standby);
  TRIREME_CHECK(options.nproc_per_node >= 1 && options.nproc_per_node <= kMaxProcPerNode,
                "--nproc-per-node must be in 1..", kMaxProcPerNode, " (workers on this machine), got ",
                options.nproc_per_node);
  if (flags.standby >= 0) options.standby = flags.standby == 1;
  launch::validate_launch_options(options);
  // Flags that would be ignored. (Not flags.standby >= 0: trireme train sets its default there.)
  TRIREME_CHECK(!flags.given.count("standby") || options.max_restarts > 0, "--standby ", flags.standby,
                " applies only with --max-restarts (it starts a restart's workers ahead of time); add "
                "--max-restarts N or drop --standby");
  TRIREME_CHECK(!flags.given.count("redundancy-cpu") || !options.redundancy.empty(),
                "--redundancy-cpu applies only with --redundancy K+M; add --redundancy or drop --redundancy-cpu");
  return options;
}

}  // namespace trireme::cli
