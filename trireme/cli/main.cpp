// `trireme`: the command-line tool. Dispatches to a subcommand and is the only place that
// turns library errors into a one-line message and an exit code:
//   exit 2  bad input (InvalidArgument): the message names the problem and the fix
//   exit 1  any other failure
#include <c10/util/Exception.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "trireme/cli/commands.h"
#include "trireme/common/error.h"
#include "trireme/launch/launcher.h"
#include "trireme/launch/standby.h"

namespace trireme::cli {

std::string self_executable() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  TRIREME_CHECK(n > 0, "cannot resolve /proc/self/exe");
  path[n] = '\0';
  return path;
}

void report_store_retry(const std::string& note) { std::fprintf(stderr, "trireme: %s\n", note.c_str()); }

}  // namespace trireme::cli

namespace {

constexpr const char* kUsage =
    "usage: trireme <command> [flags]\n"
    "commands:\n"
    "  run     launch a program on N local ranks (torchrun-compatible environment)\n"
    "  train   train a reference model: trireme train gpt --nproc-per-node 2 --dp 2\n"
    "  schedule  print and draw a pipeline schedule: trireme schedule --schedule zb-h1\n"
    "  report  draw a run's pipeline and measure its bubble: trireme report runs/mine\n"
    "  checkpoint  verify and describe a checkpoint: trireme checkpoint inspect runs/mine/checkpoints\n"
    "  profile  measure a model's layers and this machine's links for the planner: trireme profile gpt --out profile.json\n"
    "  plan    choose the layout for a cluster from a profile: trireme plan --profile profile.json --local 2\n"
    "  simulate  replay spot preemptions for a plan: goodput and cost per policy\n"
    "  store   a rendezvous store of its own, so that any machine may be lost: trireme store --port 29500\n"
    "run 'trireme <command> --help' for its flags\n";

// Errors reach the user as one line: collapse any newlines a lower layer put in.
std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  // A standby worker waits here, libtorch loaded; `trireme train`'s worker waits later,
  // once it has done what needs no world (train_worker.cpp).
  if (argc < 2 || std::string(argv[1]) != "__train-worker") trireme::launch::await_activation();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  // The agents (run, train, profile) say the job's end on stderr and exit with its status:
  // a reader gone (`2>&1 | head`) must cost that line, not turn the status into SIGPIPE's
  // 141. (Their workers get SIGPIPE's default back: launch/process.cpp.)
  if (command == "run" || command == "train" || command == "profile") std::signal(SIGPIPE, SIG_IGN);
  try {
    if (command == "run") return trireme::cli::run_main(args);
    if (command == "train") return trireme::cli::train_main(args);
    if (command == "schedule") return trireme::cli::schedule_main(args);
    if (command == "report") return trireme::cli::report_main(args);
    if (command == "checkpoint") return trireme::cli::checkpoint_main(args);
    if (command == "store") return trireme::cli::store_main(args);
    if (command == "__train-worker") return trireme::cli::train_worker_main(args);
    if (command == "plan") return trireme::cli::plan_main(args);
    if (command == "simulate") return trireme::cli::simulate_main(args);
    if (command == "profile") return trireme::cli::profile_main(args);
    if (command == "__profile-worker") return trireme::cli::profile_worker_main(args);
    std::fprintf(stderr, "trireme: unknown command '%s'; run 'trireme --help' for the commands\n",
                 command.c_str());
    return 2;
  } catch (const trireme::InvalidArgument& e) {
    std::fprintf(stderr, "trireme %s: error: %s\n", command.c_str(), one_line(e.what()).c_str());
    return 2;
  } catch (const trireme::Unrecoverable& e) {  // the agent does not restart a worker for it
    std::fprintf(stderr, "trireme %s: error: %s\n", command.c_str(), one_line(e.what()).c_str());
    return trireme::launch::kExitNoRestart;
  } catch (const c10::Error& e) {  // from libtorch: its message without the C++ backtrace
    std::fprintf(stderr, "trireme %s: error: %s\n", command.c_str(),
                 one_line(e.what_without_backtrace()).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trireme %s: error: %s\n", command.c_str(), one_line(e.what()).c_str());
    return 1;
  }
}
