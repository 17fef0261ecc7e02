// `trireme run`: the launcher command. Splits the arguments at the first `--` into the
// launcher's flags and the program to run, launches, and prints the launcher's one-line
// failure (if any) to stderr. Exit code: the launcher's (0 when every worker exited 0).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "trireme/cli/commands.h"
#include "trireme/cli/flags.h"
#include "trireme/cli/launch_flags.h"
#include "trireme/common/error.h"
#include "trireme/launch/launcher.h"

namespace trireme::cli {

int run_main(const std::vector<std::string>& args) {
  const auto dashdash = std::find(args.begin(), args.end(), "--");
  const std::vector<std::string> flag_args(args.begin(), dashdash);
  std::vector<std::string> command;
  if (dashdash != args.end()) command.assign(dashdash + 1, args.end());

  FlagParser parser("trireme run");
  LaunchFlags flags;
  add_launch_flags(parser, &flags);
  const std::vector<std::string> stray = parser.parse(flag_args);
  if (parser.help_requested()) {
    std::printf("usage: trireme run [flags] -- PROGRAM [ARGS...]\n%s", parser.usage().c_str());
    return 0;
  }
  TRIREME_CHECK(stray.empty(), "unexpected argument '", stray.empty() ? "" : stray.front(),
                "'; put the program after '--': trireme run --nproc-per-node N -- PROGRAM "
                "[ARGS...]");
  const launch::LaunchOptions options = finish_launch_flags(flags, std::move(command));
  const launch::LaunchResult result = launch::launch(options);
  if (!result.failure.empty()) std::fprintf(stderr, "trireme run: %s\n", result.failure.c_str());
  return result.exit_code;
}

}  // namespace trireme::cli
