// Validation of LaunchOptions: every refusal is one line naming the flag and the fix.
#include <utility>

#include "trireme/common/error.h"
#include "trireme/ft/redundancy.h"
#include "trireme/launch/launcher.h"

namespace trireme::launch {
namespace {

// The longest time-out or grace period taken, in seconds (11.6 days): the agent adds them
// to the steady clock in nanoseconds, where 1e20 s overflows; anything this long is a typo.
constexpr int kMaxSeconds = 1000000;

}  // namespace

void validate_launch_options(const LaunchOptions& o) {
  TRIREME_CHECK(!o.command.empty(),
                "missing the program to run; usage: trireme run --nproc-per-node N -- "
                "PROGRAM [ARGS...]");
  TRIREME_CHECK(!o.command.front().empty(), "the program to run is an empty string");
  TRIREME_CHECK(o.nproc_per_node >= 1, "--nproc-per-node must be at least 1, got ",
                o.nproc_per_node);
  TRIREME_CHECK(o.nnodes >= 1, "--nnodes must be at least 1, got ", o.nnodes);
  TRIREME_CHECK(o.nnodes_min >= 0 && o.nnodes_min <= o.nnodes, "--nnodes MIN:MAX needs 1 <= MIN <= MAX, got ",
                o.nnodes_min, ":", o.nnodes);
  TRIREME_CHECK(!elastic(o) || o.max_restarts > 0, "--nnodes ", o.nnodes_min, ":", o.nnodes,
                " re-forms the job after a machine is lost, which is a restart; give --max-restarts N (N >= 1)");
  TRIREME_CHECK(o.node_timeout_s > 0, "--node-timeout must be positive (seconds), got ", o.node_timeout_s);
  TRIREME_CHECK(o.preemption_grace_s >= 0, "--grace-seconds must be 0 or more, got ", o.preemption_grace_s);
  TRIREME_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank must be in 0..",
                o.nnodes - 1, " for --nnodes ", o.nnodes, ", got ", o.node_rank);
  TRIREME_CHECK(!o.external_store || o.rdzv_port != 0,
                "--rdzv-external needs --rdzv HOST:PORT of the running `trireme store`");
  TRIREME_CHECK(o.nnodes == 1 || o.rdzv_port != 0, "--nnodes ", o.nnodes,
                " needs --rdzv HOST:PORT with a fixed port, the same on every node "
                "(HOST is node 0's address)");
  TRIREME_CHECK(o.rdzv_port >= 0 && o.rdzv_port <= 65535, "--rdzv port must be 0..65535, got ",
                o.rdzv_port);
  TRIREME_CHECK(!o.rdzv_host.empty(), "--rdzv needs a host before the ':'");
  TRIREME_CHECK(o.max_restarts >= 0, "--max-restarts must be 0 or more, got ", o.max_restarts);
  TRIREME_CHECK(o.heartbeat_timeout_s >= 0, "--heartbeat-timeout must be >= 0 seconds (0: off), got ",
                o.heartbeat_timeout_s);
  TRIREME_CHECK(o.join_timeout_s > 0, "--join-timeout must be positive (seconds), got ",
                o.join_timeout_s);
  TRIREME_CHECK(o.stop_grace_s >= 0, "the stop grace period must be 0 or more seconds, got ",
                o.stop_grace_s);
  TRIREME_CHECK(o.exit_barrier_timeout_s >= 0,
                "the exit barrier timeout must be 0 or more seconds, got ",
                o.exit_barrier_timeout_s);
  const std::pair<const char*, double> periods[] = {
      {"--join-timeout", o.join_timeout_s},     {"--heartbeat-timeout", o.heartbeat_timeout_s},
      {"--node-timeout", o.node_timeout_s},     {"--grace-seconds", o.preemption_grace_s},
      {"the stop grace period", o.stop_grace_s}, {"the exit barrier timeout", o.exit_barrier_timeout_s}};
  for (const auto& [name, seconds] : periods)
    TRIREME_CHECK(seconds <= kMaxSeconds, name, " must be at most ", kMaxSeconds, " seconds (11.6 days), got ",
                  seconds);
  if (!o.redundancy.empty()) {
    const auto [k, m] = ft::RedundancyPlan::parse(o.redundancy);
    ft::RedundancyPlan::make(o.nnodes, k, m);  // throws naming --redundancy when too few machines
    TRIREME_CHECK(o.max_restarts > 0, "--redundancy ", o.redundancy,
                  " protects snapshots for restarts; give --max-restarts N (N >= 1)");
  }
  TRIREME_CHECK(o.redundancy_cpu >= 0 && o.redundancy_cpu <= 1, "--redundancy-cpu must be in [0, 1] (a share of "
                "one core; 0: no limit), got ", o.redundancy_cpu);
  for (const auto& [key, value] : o.extra_env)
    TRIREME_CHECK(!key.empty() && key.find('=') == std::string::npos,
                  "bad environment variable name '", key, "'");
}

}  // namespace trireme::launch
