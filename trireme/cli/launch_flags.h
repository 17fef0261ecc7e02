// The launcher's flags, shared by `trireme run` and `trireme train` (which starts its own
// workers through the launcher):
//   --nproc-per-node N  --nnodes K|MIN:MAX  --node-rank R  --rdzv HOST:PORT
//   --max-restarts M  --standby 0|1  --join-timeout SECONDS  --node-timeout SECONDS
//   --grace-seconds SECONDS  --redundancy K+M
// Usage:
//   FlagParser parser("trireme train");
//   LaunchFlags launch_flags;
//   add_launch_flags(parser, &launch_flags);
//   ... add the command's own flags, parser.parse(args) ...
//   launch::LaunchOptions options = finish_launch_flags(launch_flags, command);
#pragma once

#include <set>
#include <string>
#include <vector>

#include "trireme/cli/flags.h"
#include "trireme/launch/launcher.h"

namespace trireme::cli {

// Workers on one machine: more is a typo, and with --nnodes (below 10^6) it keeps the
// world size within what a worker reads from WORLD_SIZE (2^30). (Also the most ranks
// `trireme plan --local N` plans for.)
constexpr int kMaxProcPerNode = 1024;

// What the flags are parsed into: --rdzv stays text until finish_launch_flags.
struct LaunchFlags {
  launch::LaunchOptions options;
  std::string rdzv;  // HOST:PORT as given; empty when --rdzv was not given
  std::string nnodes;  // N or MIN:MAX as given; empty when --nnodes was not given
  int standby = -1;  // --standby 0|1; -1: the command's default
  std::set<std::string> given;  // the flags given (FlagParser::record_given)
};

// Which launcher flags a command takes: all of them, or only where its ranks run (a
// command that neither restarts nor snapshots, e.g. `trireme profile`).
enum class LaunchFlagSet { kAll, kPlacement };

// Registers the launcher flags on parser, bound to *flags (which must outlive parsing).
void add_launch_flags(FlagParser& parser, LaunchFlags* flags, LaunchFlagSet set = LaunchFlagSet::kAll);

// After parsing: applies --rdzv, sets the command to run, validates everything.
// Throws InvalidArgument with one line naming the flag and the fix.
launch::LaunchOptions finish_launch_flags(const LaunchFlags& flags,
                                          std::vector<std::string> command);

}  // namespace trireme::cli
