// Pure helpers of the launcher: line prefixing, exit-status wording, the torchrun
// environment, option validation, executable lookup.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "trireme/common/error.h"
#include "trireme/launch/agent_channel.h"
#include "trireme/launch/exit_status.h"
#include "trireme/launch/launcher.h"
#include "trireme/launch/output.h"
#include "trireme/launch/process.h"
#include "trireme/launch/restart_clock.h"
#include "trireme/launch/worker_env.h"

using namespace trireme::launch;

TEST(LaunchOutput, PrefixesCompleteLinesOnly) {
  LinePrefixer p(rank_prefix(1));
  EXPECT_EQ(p.feed("hel"), "");
  EXPECT_EQ(p.feed("lo\nwor"), "[1] hello\n");
  EXPECT_EQ(p.feed("ld\n\n"), "[1] world\n[1] \n");
  EXPECT_EQ(p.finish(), "");
}

TEST(LaunchOutput, CarriageReturnEndsALineAndStaysLive) {
  LinePrefixer p(rank_prefix(0));
  EXPECT_EQ(p.feed("step 1\rstep 2\r"), "[0] step 1\r[0] step 2\r");
  EXPECT_EQ(p.feed("\n"), "\n");  // CRLF split over two reads: no empty prefixed line
  EXPECT_EQ(p.feed("a\r\nb\n"), "[0] a\r\n[0] b\n");
}

TEST(LaunchOutput, FinishFlushesRemainderAndLongLinesAreCut) {
  LinePrefixer p("[7] ", 4);
  EXPECT_EQ(p.feed("abcdef"), "[7] abcd\n");
  EXPECT_EQ(p.finish(), "[7] ef\n");
  EXPECT_EQ(p.finish(), "");
}

TEST(LaunchExitStatus, DescribesExitCodesAndSignals) {
  EXPECT_EQ(describe_wait_status(3 << 8), "exited with code 3");
  EXPECT_EQ(describe_wait_status(SIGKILL), "was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(describe_wait_status(SIGSEGV), "was killed by signal 11 (SIGSEGV)");
  EXPECT_TRUE(exited_cleanly(0));
  EXPECT_FALSE(exited_cleanly(1 << 8));
  EXPECT_FALSE(exited_cleanly(SIGTERM));
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(60), "signal 60");
}

namespace {
std::string value_of(const std::vector<std::string>& env, const std::string& key) {
  for (const auto& e : env)
    if (e.rfind(key + "=", 0) == 0) return e.substr(key.size() + 1);
  return "<unset>";
}
}  // namespace

TEST(LaunchEnv, TorchrunVariablesForSecondNode) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.nnodes = 3;
  o.node_rank = 1;
  const JobInfo job{"10.0.0.1", 29500, "abc", 0, false};
  const auto env = worker_environment({"PATH=/bin", "RANK=99"}, o, 1, job);
  EXPECT_EQ(value_of(env, "RANK"), "3");
  EXPECT_EQ(value_of(env, "LOCAL_RANK"), "1");
  EXPECT_EQ(value_of(env, "WORLD_SIZE"), "6");
  EXPECT_EQ(value_of(env, "LOCAL_WORLD_SIZE"), "2");
  EXPECT_EQ(value_of(env, "GROUP_RANK"), "1");
  EXPECT_EQ(value_of(env, "TRIREME_NODE_RANK"), "1");
  EXPECT_EQ(value_of(env, "ROLE_RANK"), "3");
  EXPECT_EQ(value_of(env, "ROLE_WORLD_SIZE"), "6");
  EXPECT_EQ(value_of(env, "MASTER_ADDR"), "10.0.0.1");
  EXPECT_EQ(value_of(env, "MASTER_PORT"), "29500");
  EXPECT_EQ(value_of(env, "TORCHELASTIC_RESTART_COUNT"), "0");
  EXPECT_EQ(value_of(env, "TORCHELASTIC_USE_AGENT_STORE"), "True");
  EXPECT_EQ(value_of(env, "TORCHELASTIC_RUN_ID"), "abc");
  EXPECT_EQ(value_of(env, "OMP_NUM_THREADS"), "1");
  EXPECT_EQ(value_of(env, "TRIREME_TTY"), "<unset>");
  EXPECT_EQ(value_of(env, "PATH"), "/bin");
  EXPECT_EQ(value_of(env, "MALLOC_MMAP_THRESHOLD_"), "33554432");
  EXPECT_EQ(value_of(env, "MALLOC_TRIM_THRESHOLD_"), "1073741824");
  EXPECT_EQ(std::count_if(env.begin(), env.end(),
                          [](const std::string& e) { return e.rfind("RANK=", 0) == 0; }),
            1);
}

TEST(LaunchEnv, KeepsOmpThreadsTtyFlagAndExtraEnvWins) {
  LaunchOptions o;
  o.extra_env = {{"MASTER_PORT", "1"}, {"TRIREME_X", "y"}};
  const JobInfo job{"127.0.0.1", 5, "id", 0, true};
  const auto env = worker_environment({"OMP_NUM_THREADS=4"}, o, 0, job);
  EXPECT_EQ(value_of(env, "OMP_NUM_THREADS"), "4");
  EXPECT_EQ(value_of(env, "TRIREME_TTY"), "1");
  EXPECT_EQ(value_of(env, "MASTER_PORT"), "1");
  EXPECT_EQ(value_of(env, "TRIREME_X"), "y");
}

TEST(LaunchEnv, MallocSettingsYieldToTheCallersOwn) {
  LaunchOptions o;
  const JobInfo job{"127.0.0.1", 5, "id", 0, false};
  // One variable set: that one kept, the others still added.
  auto env = worker_environment({"MALLOC_TRIM_THRESHOLD_=0"}, o, 0, job);
  EXPECT_EQ(value_of(env, "MALLOC_TRIM_THRESHOLD_"), "0");
  EXPECT_EQ(value_of(env, "MALLOC_MMAP_THRESHOLD_"), "33554432");
  // Tunables or another allocator: none added.
  for (const std::string& own : {"GLIBC_TUNABLES=glibc.malloc.arena_max=2", "LD_PRELOAD=libjemalloc.so.2"}) {
    env = worker_environment({own}, o, 0, job);
    EXPECT_EQ(value_of(env, "MALLOC_MMAP_THRESHOLD_"), "<unset>") << own;
    EXPECT_EQ(value_of(env, "MALLOC_TOP_PAD_"), "<unset>") << own;
  }
}

namespace {
void expect_refused(const LaunchOptions& o, const std::string& words) {
  try {
    validate_launch_options(o);
    ADD_FAILURE() << "accepted options that should be refused (" << words << ")";
  } catch (const trireme::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(LaunchOptionsCheck, RefusesBadOptionsWithTheFlagName) {
  LaunchOptions good;
  good.command = {"true"};
  EXPECT_NO_THROW(validate_launch_options(good));
  LaunchOptions o = good;
  o.command.clear();
  expect_refused(o, "missing the program");
  o = good;
  o.nproc_per_node = 0;
  expect_refused(o, "--nproc-per-node");
  o = good;
  o.nnodes = 2;
  o.node_rank = 2;
  o.rdzv_port = 29500;
  expect_refused(o, "--node-rank must be in 0..1");
  o = good;
  o.nnodes = 2;
  expect_refused(o, "needs --rdzv");
  o = good;
  o.join_timeout_s = 0;
  expect_refused(o, "--join-timeout");
  o = good;
  o.max_restarts = -1;
  expect_refused(o, "--max-restarts");
}

// Time-outs and grace periods past 1e6 s are refused naming the flag: the agent turns them
// into nanoseconds of the steady clock, where 1e20 s overflowed (undefined behaviour).
TEST(LaunchOptionsCheck, RefusesSecondsThatWouldOverflowTheClock) {
  LaunchOptions good;
  good.command = {"true"};
  good.node_timeout_s = good.preemption_grace_s = good.heartbeat_timeout_s = 1e6;
  good.stop_grace_s = good.exit_barrier_timeout_s = 1e6;
  good.join_timeout_s = 1000000;
  EXPECT_NO_THROW(validate_launch_options(good));
  LaunchOptions o = good;
  o.node_timeout_s = 1e20;
  expect_refused(o, "--node-timeout must be at most 1000000 seconds (11.6 days), got 1e+20");
  o = good;
  o.preemption_grace_s = 1e7;
  expect_refused(o, "--grace-seconds must be at most");
  o = good;
  o.heartbeat_timeout_s = 1e20;
  expect_refused(o, "--heartbeat-timeout must be at most");
  o = good;
  o.join_timeout_s = 2000000000;
  expect_refused(o, "--join-timeout must be at most");
  o = good;
  o.stop_grace_s = 1e20;
  expect_refused(o, "the stop grace period must be at most");
  o = good;
  o.exit_barrier_timeout_s = 1e20;
  expect_refused(o, "the exit barrier timeout must be at most");
}

TEST(LaunchProcess, FindsExecutablesOnAPath) {
  EXPECT_EQ(find_executable("sh", "/nonexistent:/bin"), "/bin/sh");
  EXPECT_EQ(find_executable("/bin/sh", ""), "/bin/sh");
  EXPECT_EQ(find_executable("no-such-program-xyz", "/bin:/usr/bin"), "");
  EXPECT_EQ(find_executable("/etc/passwd", ""), "");  // not executable
}

// A child that does not end is given up on after the limit instead of blocking the
// caller (end_standby after SIGKILL); one that ends is reaped, leaving no zombie.
TEST(LaunchProcess, ReapWithinGivesUpOnAChildThatDoesNotEnd) {
  const SpawnedProcess p = spawn_process("/bin/sh", {"/bin/sh", "-c", "exec sleep 60"}, {});
  ::close(p.stdout_fd);
  ::close(p.stderr_fd);
  EXPECT_FALSE(reap_within(p.pid, std::chrono::milliseconds(100)));
  signal_process_group(p.pid, SIGKILL);
  EXPECT_TRUE(reap_within(p.pid, std::chrono::milliseconds(10000)));
  errno = 0;
  EXPECT_EQ(::waitpid(p.pid, nullptr, WNOHANG), -1);  // already reaped: no longer our child
  EXPECT_EQ(errno, ECHILD);
  EXPECT_TRUE(reap_within(p.pid, std::chrono::milliseconds(0)));  // idempotent
}

// A worker gets stdin, stdout and stderr, and no other descriptor of the agent's, even one
// opened without close-on-exec (as Gloo opens its sockets in the agent's snapshot keeper).
TEST(LaunchProcess, AChildGetsNoDescriptorOfTheAgentsButItsThree) {
  const int leaked = ::open("/dev/null", O_RDONLY);  // no O_CLOEXEC
  ASSERT_GE(leaked, 3);
  const SpawnedProcess p = spawn_process("/bin/sh", {"/bin/sh", "-c", "ls /proc/self/fd"}, {});
  std::string out;
  char buffer[4096];
  for (;;) {
    pollfd readable{p.stdout_fd, POLLIN, 0};
    const int ready = ::poll(&readable, 1, 10000);
    if (ready < 0 && errno == EINTR) continue;
    ASSERT_GT(ready, 0) << "ls wrote nothing and did not end within 10 s";
    const ssize_t n = ::read(p.stdout_fd, buffer, sizeof(buffer));
    if (n == 0) break;
    if (n > 0) out.append(buffer, static_cast<size_t>(n));
    else ASSERT_TRUE(errno == EAGAIN || errno == EINTR) << std::strerror(errno);
  }
  ::close(p.stdout_fd);
  ::close(p.stderr_fd);
  ::close(leaked);
  EXPECT_TRUE(reap_within(p.pid, std::chrono::milliseconds(10000)));
  // ls's own: 0, 1, 2 and the directory it reads (3); the agent's descriptor numbered
  // `leaked` must not be among them unless it is ls's directory, 3.
  std::vector<int> fds;
  for (size_t at = 0; at < out.size();) {
    const size_t end = out.find('\n', at);
    fds.push_back(std::stoi(out.substr(at, end - at)));
    at = end == std::string::npos ? out.size() : end + 1;
  }
  EXPECT_LE(fds.size(), 4u) << out;
  if (leaked != 3) EXPECT_EQ(std::count(fds.begin(), fds.end(), leaked), 0) << out;
}

// child_ended sees a child end without reaping it: the zombie keeps its pid, by which the
// agent still signals an exited worker's process group (stop_workers), until the caller
// reaps it; the status is the one waitpid() then gives.
TEST(LaunchProcess, ChildEndedLeavesTheChildToReapWithWaitpidsStatus) {
  for (const char* script : {"exit 3", "exec sleep 60"}) {
    const SpawnedProcess p = spawn_process("/bin/sh", {"/bin/sh", "-c", script}, {});
    ::close(p.stdout_fd);
    ::close(p.stderr_fd);
    int status = -1;
    if (std::string(script) == "exec sleep 60") {
      EXPECT_FALSE(child_ended(p.pid, &status));  // running
      signal_process_group(p.pid, SIGKILL);
    }
    siginfo_t info{};
    ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(p.pid), &info, WEXITED | WNOWAIT), 0);  // until it ends
    ASSERT_TRUE(child_ended(p.pid, &status)) << script;
    EXPECT_TRUE(child_ended(p.pid, &status)) << script;  // still there: nothing was reaped
    int reaped = -1;
    EXPECT_EQ(::waitpid(p.pid, &reaped, WNOHANG), p.pid) << script;
    EXPECT_EQ(status, reaped) << script;
    EXPECT_EQ(describe_wait_status(status),
              std::string(script) == "exit 3" ? "exited with code 3" : "was killed by signal 9 (SIGKILL)");
    EXPECT_FALSE(child_ended(p.pid, &status)) << script;  // reaped
  }
}

// A restart's moments are published on the clocks of the machines that saw them; a worker
// puts them on its own machine's clock through every agent's reading of one event, the
// opening of the recovery barrier.
TEST(RestartClock, StampsMoveByTheDifferenceOfTheReadingsOfTheBarrier) {
  EXPECT_EQ(format_stamp(1712345678901234.0, 2), "1712345678901234 2");
  const auto stamp = parse_stamp("1712345678901234 2");
  ASSERT_TRUE(stamp);
  EXPECT_EQ(stamp->us, 1712345678901234.0);
  EXPECT_EQ(stamp->node, 2);
  const auto bare = parse_stamp("123");  // as written before node ids were added
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare->node, -1);
  EXPECT_FALSE(parse_stamp(""));
  EXPECT_FALSE(parse_stamp("12 x"));
  EXPECT_FALSE(parse_stamp("12 3 4"));
  // Node 1's clock runs 30 s ahead of node 0's: it saw the barrier open at 30,001,000 on
  // its clock when node 0 saw it at 1,000 on its own.
  const std::map<int, double> barrier_seen{{0, 1000.0}, {1, 30001000.0}};
  EXPECT_EQ(on_clock_of(0, {30000500.0, 1}, barrier_seen), 500.0);  // node 1's failure, on node 0's clock
  EXPECT_EQ(on_clock_of(0, {700.0, 0}, barrier_seen), 700.0);        // node 0's own: unchanged
  EXPECT_EQ(on_clock_of(1, {700.0, 0}, barrier_seen), 30000700.0);
  EXPECT_EQ(on_clock_of(0, {900.0, 2}, barrier_seen), 900.0);  // no reading of node 2: as written
  EXPECT_EQ(on_clock_of(-1, {900.0, 1}, barrier_seen), 900.0);  // a worker that does not know its node
}

TEST(RestartClock, AdmittedValuesNameTheirRestart) {
  EXPECT_EQ(keys::admitted_at(keys::admitted(7)), 7);
  EXPECT_EQ(keys::admitted_at("abc"), 0);  // a run id: asking, not admitted
  EXPECT_EQ(keys::admitted_at(""), 0);
  EXPECT_EQ(keys::admitted_at("admitted at restart "), 0);
  EXPECT_EQ(keys::admitted_at("admitted at restart 3x"), 0);
  EXPECT_EQ(keys::admitted_at("admitted at restart -3"), 0);
  EXPECT_EQ(keys::admitted_at("admitted at restart 99999999999"), 0);
}
