// Trial runs of the planner's best candidates; see cli/plan_trials.h.
#include "trireme/cli/plan_trials.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trireme/common/error.h"
#include "trireme/obs/plot.h"

extern char** environ;

namespace trireme::cli {
namespace {

constexpr int kStartupSteps = 2;  // dropped from each run: first iterations pay for start-up

std::string self_executable() {
  std::error_code ec;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  TRIREME_CHECK(!ec, "--measure-top cannot find its own executable (/proc/self/exe: ", ec.message(), ")");
  return path.string();
}

// Runs command with stdout and stderr appended to log; returns its exit status (128 +
// signal when killed).
int run_logged(const std::vector<std::string>& command, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> argv;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  TRIREME_CHECK(rc == 0, "cannot start ", command[0], ": ", std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// The step times of a run's metrics.jsonl after the start-up steps.
std::vector<double> measured_steps(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<double> steps;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_discarded() || !row.contains("step_ms") || !row.contains("step")) continue;
    if (row["step"].get<int64_t>() > kStartupSteps) steps.push_back(row["step_ms"].get<double>() * 1e-3);
  }
  return steps;
}

std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

// Removes a temporary directory however the trials end.
struct RemoveOnExit {
  std::string dir;
  ~RemoveOnExit() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace

void check_measurable(const plan::Cluster& cluster) {
  for (const auto& g : cluster.groups)
    TRIREME_CHECK(g.device == "cpu", "--measure-top runs the candidates on this machine, but group '", g.name,
                  "' of cluster '", cluster.name, "' is device '", g.device,
                  "'; drop --measure-top, or plan for --local N or groups of device \"cpu\"");
}

std::vector<TrialResult> measure_candidates(const std::vector<plan::Candidate>& candidates,
                                            const plan::Profile& profile, const plan::Cluster& cluster,
                                            const TrialOptions& options) {
  TRIREME_CHECK(options.steps > kStartupSteps, "--measure-steps must be more than ", kStartupSteps,
                " (the first ", kStartupSteps, " steps of a trial run are not counted), got ", options.steps);
  TRIREME_CHECK(options.rounds >= 1, "--measure-rounds must be at least 1, got ", options.rounds);
  check_measurable(cluster);
  const std::string self = self_executable();
  std::string dir = options.dir;
  const bool temporary = dir.empty();
  if (temporary) {
    std::string pattern = (std::filesystem::temp_directory_path() / "trireme-plan-trials-XXXXXX").string();
    TRIREME_CHECK(::mkdtemp(pattern.data()) != nullptr, "cannot create a directory for the trial runs under ",
                  std::filesystem::temp_directory_path().string(), ": ", std::strerror(errno));
    dir = pattern;
  }
  const RemoveOnExit cleanup{temporary ? dir : std::string()};
  std::error_code made;
  std::filesystem::create_directories(dir, made);
  TRIREME_CHECK(!made, "--measure-dir ", dir, " cannot be made: ", made.message(), "; choose another path");
  std::vector<TrialResult> results(candidates.size());
  std::vector<std::string> plans;
  for (size_t i = 0; i < candidates.size(); ++i) {
    results[i].candidate = candidates[i];
    plans.push_back(dir + "/candidate-" + std::to_string(i) + ".json");
    obs::write_text_file(plans.back(), plan::to_json(plan::make_plan(profile, cluster, candidates[i])));
  }
  const size_t n = candidates.size();
  for (int r = 0; r < options.rounds; ++r) {
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (k + static_cast<size_t>(r)) % n;  // rotated each round
      TrialResult& t = results[i];
      std::printf("trial %d/%d, round %d/%d: %s ... ", static_cast<int>(k + 1), static_cast<int>(n), r + 1,
                  options.rounds, plan::describe(t.candidate.layout).c_str());
      std::fflush(stdout);
      const std::string run_dir = dir + "/run-" + std::to_string(i) + "-" + std::to_string(r);
      const std::string log = run_dir + ".log";
      // A kept --measure-dir may hold an earlier trial's run: start afresh, never resume it.
      std::filesystem::remove_all(run_dir);
      std::filesystem::remove(log);
      const int status = run_logged({self, "train", "gpt", "--nproc-per-node", std::to_string(t.candidate.layout.world()), "--plan",
                                     plans[i], "--steps", std::to_string(options.steps), "--out", run_dir, "--quiet",
                                     "--trace-steps", "0", "--sample-tokens", "0"},
                                    log);
      const std::vector<double> steps = status == 0 ? measured_steps(run_dir) : std::vector<double>{};
      if (status != 0 || steps.empty()) {
        t.error = status != 0 ? "exit " + std::to_string(status) + ": " + last_line(log) : "no step measured";
        std::printf("failed (%s)\n", t.error.c_str());
        continue;
      }
      t.step_s.insert(t.step_s.end(), steps.begin(), steps.end());
      t.round_s.push_back(plan::median(steps));
      std::printf("%.1f ms\n", t.round_s.back() * 1e3);
    }
  }
  bool any = false;
  for (auto& t : results) {
    if (!t.step_s.empty()) t.measured_step_s = plan::median(t.step_s), any = true;
  }
  if (!any)
    TRIREME_THROW(Error, "no candidate of --measure-top ran: ", results.front().error,
                  temporary ? std::string() : " (logs under " + dir + ")");
  return results;
}

}  // namespace trireme::cli
