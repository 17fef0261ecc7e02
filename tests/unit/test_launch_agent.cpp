// The node agent driven through an in-memory AgentChannel with real (sh) workers: output
// prefixing, failure detection and publication, reacting to another node's failure,
// SIGKILL after the grace period, the join timeout, the hang watch (--heartbeat-timeout), and
// restarts with other nodes faked through the channel (lost members and leaders).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "trireme/common/error.h"
#include "trireme/launch/agent.h"

using namespace trireme::launch;
using Clock = std::chrono::steady_clock;

namespace {

class MemoryChannel : public AgentChannel {
 public:
  std::function<void(const std::string&)> before_wait;  // e.g. throws, as a lost store does
  std::function<void(const std::string&)> after_set;    // looks at the agent at that moment
  std::function<void(const std::string&)> before_compare_set;  // e.g. another agent gets there first
  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[key] = value;
      cv_.notify_all();
    }
    if (after_set) after_set(key);
  }
  std::optional<std::string> try_get(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++reads_[key];
    auto it = values_.find(key);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t v = (values_.count(key) ? std::stoll(values_[key]) : 0) + delta;
    values_[key] = std::to_string(v);
    cv_.notify_all();
    return v;
  }
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override {
    if (before_compare_set) before_compare_set(key);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = values_.find(key);
      if ((it == values_.end() && !expected.empty()) || (it != values_.end() && it->second != expected))
        return it == values_.end() ? expected : it->second;
      values_[key] = desired;
      cv_.notify_all();
    }
    if (after_set) after_set(key);
    return desired;
  }
  bool wait_for(const std::string& key, std::chrono::milliseconds timeout) override {
    if (before_wait) before_wait(key);
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return values_.count(key) > 0; });
  }
  // How often try_get read `key`.
  int reads(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return reads_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
  std::map<std::string, int> reads_;
};

// Captures what the agent forwards; small outputs fit in the pipe buffers.
struct CapturedIo {
  int out[2], err[2];
  CapturedIo() {
    EXPECT_EQ(::pipe2(out, O_NONBLOCK), 0);
    EXPECT_EQ(::pipe2(err, O_NONBLOCK), 0);
  }
  ~CapturedIo() {
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
  }
  AgentIo io() const { return {out[1], err[1]}; }
  static std::string drain(int fd) {
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) text.append(buf, n);
    return text;
  }
  std::string stdout_text() const { return drain(out[0]); }
  std::string stderr_text() const { return drain(err[0]); }
};

LaunchOptions sh_options(int nproc, const std::string& script) {
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.command = {"/bin/sh", "-c", script};
  return o;
}

// Node 0 of an elastic job of up to 2 nodes whose node 1 vanishes: it is lost after 0.5 s.
LaunchOptions one_node_left_options(const std::string& script, int max_restarts) {
  LaunchOptions o = sh_options(1, script);
  o.nnodes = 2;
  o.nnodes_min = 1;
  o.max_restarts = max_restarts;
  o.node_timeout_s = 0.5;
  o.rdzv_port = 1234;
  return o;
}

// Node `node_rank` of a fixed-size job of 2 nodes whose other node beats on (it is not lost).
LaunchOptions two_node_options(const std::string& script, int node_rank) {
  LaunchOptions o = sh_options(1, script);
  o.nnodes = 2;
  o.node_rank = node_rank;
  o.max_restarts = 1;
  o.node_timeout_s = 30;
  o.join_timeout_s = 30;
  o.rdzv_port = 1234;
  return o;
}

// Another node's agent as far as its heartbeat goes: beats node `node` every `period`
// until destroyed, calling on_beat(n) with the n-th beat (what else that node does).
class Heartbeat {
 public:
  Heartbeat(AgentChannel& channel, int node, std::function<void(int)> on_beat = {},
            std::chrono::milliseconds period = std::chrono::milliseconds(50))
      : thread_([this, &channel, node, on_beat, period] {
          for (int beat = 1; !stop_; ++beat) {
            channel.set(keys::alive(node), "beat-" + std::to_string(beat));
            if (on_beat) on_beat(beat);
            std::this_thread::sleep_for(period);
          }
        }) {}
  ~Heartbeat() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

TEST(LaunchAgent, ForwardsPrefixedOutputAndSucceeds) {
  MemoryChannel channel;
  CapturedIo io;
  const auto result = run_agent(
      sh_options(2, "echo out $RANK/$WORLD_SIZE; echo err $LOCAL_RANK >&2"), channel,
      {"127.0.0.1", 1234}, io.io());
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.failure, "");
  const std::string out = io.stdout_text(), err = io.stderr_text();
  EXPECT_NE(out.find("[0] out 0/2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("[1] out 1/2\n"), std::string::npos) << out;
  EXPECT_NE(err.find("[1] err 1\n"), std::string::npos) << err;
  EXPECT_EQ(channel.try_get(keys::kAllDone).value_or(""), "1");
  EXPECT_FALSE(channel.try_get(keys::kFailure));
}

TEST(LaunchAgent, FailedWorkerStopsTheOthersAndIsPublished) {
  MemoryChannel channel;
  CapturedIo io;
  const auto start = Clock::now();
  const auto result = run_agent(
      sh_options(3, "if [ $RANK = 1 ]; then exit 3; fi; exec sleep 30"), channel,
      {"127.0.0.1", 1234}, io.io());
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.failure,
            "rank 1 (node 0, local 1) exited with code 3; stopped the other workers");
  EXPECT_EQ(channel.try_get(keys::kFailure).value_or(""),
            "rank 1 (node 0, local 1) exited with code 3");
}

// --heartbeat-timeout: a worker whose heartbeat stops changing is killed as hung; one
// whose last beat said it is done (it is only writing its results and exiting) is given
// 10x as long (60 s at least), more than this worker's 1.5 s.
TEST(LaunchAgent, StalledHeartbeatIsHungButDoneIsNot) {
  for (const std::string beat : {"7", keys::kHeartbeatDone}) {
    MemoryChannel channel;
    CapturedIo io;
    channel.set(keys::heartbeat(0, 0), beat);
    channel.set(keys::heartbeat(0, 1), beat);
    LaunchOptions o = sh_options(2, "exec sleep 1.5");
    o.heartbeat_timeout_s = 0.5;
    const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
    if (beat == keys::kHeartbeatDone) {
      EXPECT_EQ(result.exit_code, 0) << result.failure;
    } else {
      EXPECT_EQ(result.exit_code, 1);
      EXPECT_NE(result.failure.find("made no progress for 0.5 s (heartbeats stuck at 7, 7); killed as hung"),
                std::string::npos) << result.failure;
    }
  }
}

TEST(LaunchAgent, AnotherNodesFailureStopsThisNode) {
  MemoryChannel channel;
  CapturedIo io;
  channel.set(keys::kReady, "1");  // the job has already formed
  channel.set(keys::kFailure, "rank 0 (node 0, local 0) was killed by signal 9 (SIGKILL)");
  LaunchOptions o = sh_options(2, "exec sleep 30");
  o.nnodes = 2;
  o.node_rank = 1;
  o.rdzv_port = 1234;
  const auto start = Clock::now();
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.failure,
            "rank 0 (node 0, local 0) was killed by signal 9 (SIGKILL); stopped the workers "
            "of node 1");
}

// The job's first failure stands: a worker here that fails after it (as one whose
// collective lost the failed peer would) neither replaces it in the store nor hides it.
TEST(LaunchAgent, TheJobsFirstFailureIsNotReplacedByALaterOne) {
  MemoryChannel channel;
  CapturedIo io;
  channel.set(keys::kReady, "1");
  // Node 0's agent publishes its failure just before this one publishes its own.
  const std::string first = "rank 0 (node 0, local 0) was killed by signal 9 (SIGKILL)";
  channel.before_compare_set = [&](const std::string& key) {
    if (key == keys::kFailure && !channel.try_get(key)) channel.set(key, first);
  };
  LaunchOptions o = sh_options(1, "exit 1");
  o.nnodes = 2;
  o.node_rank = 1;
  o.rdzv_port = 1234;
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(channel.try_get(keys::kFailure).value_or(""), first);
  EXPECT_EQ(result.failure, "rank 1 (node 1, local 0) exited with code 1, after the job's first failure: " + first +
                                "; stopped the other workers");
}

TEST(LaunchAgent, WorkerIgnoringSigtermIsKilledAfterTheGrace) {
  MemoryChannel channel;
  CapturedIo io;
  LaunchOptions o =
      sh_options(2, "if [ $RANK = 1 ]; then exit 2; fi; trap '' TERM; exec sleep 30");
  o.stop_grace_s = 0.3;
  const auto start = Clock::now();
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_EQ(result.failure,
            "rank 1 (node 0, local 1) exited with code 2; stopped the other workers");
}

// An agent that gives up joining gives its --node-rank and its place in `joined` back: a
// retry is not refused as a second node 0, nor counted twice (before, the retry was
// refused for ever).
TEST(LaunchAgent, JoinTimeoutNamesHowManyJoinedAndFreesThePlace) {
  MemoryChannel channel;
  CapturedIo io;
  LaunchOptions o = sh_options(1, "true");
  o.nnodes = 2;
  o.rdzv_port = 29999;
  o.join_timeout_s = 1;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const auto result = run_agent(o, channel, {"127.0.0.1", 29999}, io.io());
    EXPECT_EQ(result.exit_code, 1);
    EXPECT_NE(result.failure.find("1 of 2 joined the rendezvous at 127.0.0.1:29999"), std::string::npos)
        << "attempt " << attempt << ": " << result.failure;
    EXPECT_EQ(channel.try_get(keys::node(0)), "0");
    EXPECT_EQ(channel.try_get(keys::kJoined), "0");
  }
}

// With --max-restarts it is not restarted, and says so (before: "gave up after 0 restarts").
TEST(LaunchAgent, ProgramThatCannotRunIsAFailureNamingIt) {
  for (const int max_restarts : {0, 2}) {
    MemoryChannel channel;
    CapturedIo io;
    LaunchOptions o;
    o.command = {"/nonexistent/program"};
    o.max_restarts = max_restarts;
    const auto result = run_agent(o, channel, {"127.0.0.1", 1}, io.io());
    EXPECT_NE(result.exit_code, 0);
    EXPECT_NE(result.failure.find("cannot execute '/nonexistent/program'"), std::string::npos) << result.failure;
    EXPECT_EQ(result.failure.find("gave up"), std::string::npos) << result.failure;
    EXPECT_EQ(result.failure.find("the worker could not be started, so the job was not restarted") !=
                  std::string::npos,
              max_restarts > 0)
        << result.failure;
  }
}

// A node the restart's leader dropped (its heartbeat stalled) says for how long, as given
// (before, --node-timeout 0.5 read "--node-timeout 0 s").
TEST(LaunchAgent, ADroppedNodeNamesItsNodeTimeout) {
  MemoryChannel channel;
  CapturedIo io;
  channel.set(keys::kRunId, "abc");
  channel.add(keys::kJoined, 1);               // node 0 joined
  channel.add(keys::restart_stopped(1), 1);    // node 0 leads restart 1
  channel.set(keys::restart_members(1), "0");  // and dropped this node
  LaunchOptions o = one_node_left_options("exit 3", 1);
  o.node_rank = 1;
  Heartbeat node0(channel, 0);
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.failure,
            "node 1 was dropped from the job at restart 1 (its heartbeat stalled for --node-timeout 0.5 s); raise "
            "--node-timeout on a loaded machine");
}

// Elastic membership through the same seam: node 1 of a 1:2 job never beats its
// heartbeat (its machine is gone); node 0 notices after --node-timeout, leads the restart,
// drops it, and runs generation 1 alone, renumbered (WORLD_SIZE 1).
TEST(LaunchAgent, ElasticJobGoesOnWithoutASilentNode) {
  MemoryChannel channel;
  CapturedIo io;
  channel.add(keys::kJoined, 1);  // node 1 joined, then its machine vanished
  const LaunchOptions o = one_node_left_options(
      "echo gen=$TORCHELASTIC_RESTART_COUNT world=$WORLD_SIZE rank=$RANK; "
      "if [ $TORCHELASTIC_RESTART_COUNT = 1 ]; then exit 0; fi; exec sleep 30",
      1);
  const auto start = Clock::now();
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  EXPECT_LT(seconds_since(start), 10.0);
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  const std::string out = io.stdout_text(), err = io.stderr_text();
  EXPECT_NE(out.find("gen=0 world=2 rank=0"), std::string::npos) << out;
  EXPECT_NE(out.find("gen=1 world=1 rank=0"), std::string::npos) << out;
  EXPECT_NE(err.find("node 1 is lost (no heartbeat for 0.5 s)"), std::string::npos) << err;
  EXPECT_NE(err.find("going on with nodes 0"), std::string::npos) << err;
  EXPECT_EQ(channel.try_get(keys::restart_members(1)), "0;0");  // nodes 0, decided by node 0
  EXPECT_EQ(channel.try_get(keys::lost(1)), "1");  // a replacement may take its --node-rank
}

// Each agent watches the two members after it in the ring of members (ascending node ids,
// wrapping), so the store's reads grow as n machines, not n^2: node 4 of 6 reads the
// heartbeats of nodes 5 and 0 and no other. Once node 5 has finished it is not watched
// for a loss any more, and node 1 is watched in its place.
TEST(LaunchAgent, AnAgentWatchesTheTwoMembersAfterIt) {
  MemoryChannel channel;
  CapturedIo io;
  channel.set(keys::kReady, "1");  // the job has formed
  std::atomic<int> phase{0};
  std::map<int, int> read_before_done;  // node: its heartbeat reads when node 5 finished
  auto read = [&](int node) { return channel.reads(keys::alive(node)); };
  // Node 0's beats drive the test: once node 4 has looked at its two members a few times,
  // node 5 finishes; once node 1 has been looked at, node 0 publishes a failure that ends
  // the job (or after 20 s, which fails the test).
  Heartbeat node0(channel, 0, [&](int beat) {
    if (phase == 0 && read(5) >= 3 && read(0) >= 3) {
      for (int node : {1, 2, 3, 5}) read_before_done[node] = read(node);
      channel.set(keys::done(5), "1");
      phase = 1;
    } else if ((phase == 1 && read(1) >= 3) || (phase < 2 && beat == 400)) {
      phase = 2;
      channel.set(keys::kFailure, "node 0 ends the test");
    }
  });
  Heartbeat node1(channel, 1), node2(channel, 2), node3(channel, 3), node5(channel, 5);
  LaunchOptions o = sh_options(1, "exec sleep 30");
  o.nnodes = 6;
  o.node_rank = 4;
  o.rdzv_port = 1234;
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  EXPECT_EQ(result.failure, "node 0 ends the test; stopped the workers of node 4");
  ASSERT_EQ(phase.load(), 2);
  EXPECT_EQ(read_before_done[1], 0);
  EXPECT_EQ(read_before_done[2], 0);
  EXPECT_EQ(read_before_done[3], 0);
  EXPECT_GE(read(1), 3);
  EXPECT_EQ(read(2), 0);
  EXPECT_EQ(read(3), 0);
}

// The same job with a fixed size ends, naming the lost node.
TEST(LaunchAgent, FixedSizeJobEndsWhenANodeIsLost) {
  MemoryChannel channel;
  CapturedIo io;
  channel.add(keys::kJoined, 1);
  LaunchOptions o = sh_options(1, "exec sleep 30");
  o.nnodes = 2;
  o.max_restarts = 1;
  o.node_timeout_s = 0.5;
  o.stop_grace_s = 1;
  o.exit_barrier_timeout_s = 0;
  o.rdzv_port = 1234;
  const auto start = Clock::now();
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  EXPECT_LT(seconds_since(start), 10.0);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.failure,
            "node 1 is lost (no heartbeat for 0.5 s); 1 node left, fewer than the 2 the job needs (give --nnodes "
            "MIN:MAX to go on with fewer)");
}

// A node asking to join once no restart is left does not end the job: the generation's
// workers finish (before, the join ended supervision as if they had all exited).
TEST(LaunchAgent, JoinRequestWithoutARestartLeftLetsTheWorkersFinish) {
  MemoryChannel channel;
  CapturedIo io;
  channel.add(keys::kJoined, 1);  // node 1 joined, then its machine vanished
  // Generation 1's worker finishes once GO exists: after the request, and after the agent
  // has supervised with it pending (two heartbeats later), so the request is seen while
  // the workers run, not after they finished.
  const std::string go = "/tmp/trireme-test-agent-go-" + std::to_string(::getpid());
  ::unlink(go.c_str());
  const LaunchOptions o = one_node_left_options("if [ $TORCHELASTIC_RESTART_COUNT = 1 ]; then while [ ! -e " + go +
                                                    " ]; do sleep 0.02; done; echo finished; exit 0; fi; "
                                                    "exec sleep 30",
                                                1);
  bool supervised_with_request = false;
  std::thread joiner([&] {  // once generation 1 runs without node 1, node 1 asks back in
    if (channel.wait_for(keys::restart_resume(1), std::chrono::seconds(10))) {
      channel.set(keys::pending(1), channel.try_get(keys::kRunId).value_or(""));
      channel.add(keys::kPending, 1);
      const auto beats = [&] { return std::stoll(channel.try_get(keys::alive(0)).value_or("0")); };
      const int64_t at_request = beats();
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (beats() < at_request + 2 && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      supervised_with_request = beats() >= at_request + 2;
    }
    ::close(::open(go.c_str(), O_CREAT | O_WRONLY, 0600));
  });
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  joiner.join();
  ::unlink(go.c_str());
  EXPECT_TRUE(supervised_with_request) << "the agent's heartbeat did not go on after the request";
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  const std::string out = io.stdout_text();
  EXPECT_NE(out.find("finished"), std::string::npos) << out;
  EXPECT_FALSE(channel.try_get(keys::restart(2)));  // no generation for the joiner: no restart left
}

// How a generation ends when one node's workers finish while another node would restart
// it for a joiner (the two decisions race; seen as a hang at the end of a job: the
// finished node waited for the others to finish, the other for it to check in).
// Whoever claims the generation's end first (keys::generation_end) decides.
namespace {

// Node 0 of a job whose node 1 vanished, so generation 1 runs on node 0 alone; then
// `during_generation_1` runs on a thread of the test, and the worker of generation 1
// finishes once the file GO exists.
struct JoinAtTheEnd {
  MemoryChannel channel;
  CapturedIo io;
  std::string go = "/tmp/trireme-test-agent-go-" + std::to_string(::getpid());
  LaunchOptions o;

  JoinAtTheEnd() {
    ::unlink(go.c_str());
    channel.add(keys::kJoined, 1);  // node 1 joined, then its machine vanished
    o = one_node_left_options("echo gen=$TORCHELASTIC_RESTART_COUNT; if [ $TORCHELASTIC_RESTART_COUNT = 1 ]; then "
                              "while [ ! -e " + go + " ]; do sleep 0.02; done; echo finished; fi; "
                              "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exec sleep 30; fi",
                              2);
    o.join_timeout_s = 10;  // (a decision that never came would show as a 10 s wait)
  }
  ~JoinAtTheEnd() { ::unlink(go.c_str()); }

  LaunchResult run(const std::function<void()>& during_generation_1) {
    std::thread test([&] {
      if (channel.wait_for(keys::restart_resume(1), std::chrono::seconds(10))) during_generation_1();
      ::close(::open(go.c_str(), O_CREAT | O_WRONLY, 0600));
    });
    const LaunchResult result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
    test.join();
    return result;
  }

  void ask_to_join() {
    channel.set(keys::pending(1), channel.try_get(keys::kRunId).value_or(""));
    channel.add(keys::kPending, 1);
  }

  bool wait_until(const std::function<bool()>& done) {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!done())
      if (Clock::now() > deadline) return false;
      else std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return true;
  }
};

}  // namespace

TEST(LaunchAgent, AJoinAfterAnotherNodeFinishedIsNotTaken) {
  JoinAtTheEnd job;
  bool claimed = false;
  const LaunchResult result = job.run([&] {
    // Another node's workers finished first, and it decided.
    job.channel.add(keys::generation_end(1), keys::kFinished);
    job.channel.set(keys::generation_end(1) + "/decision", "finish");
    job.ask_to_join();
    // The agent sees the request and claims the end after the finish: it must not restart.
    claimed = job.wait_until([&] {
      return job.channel.try_get(keys::generation_end(1)) == std::to_string(keys::kFinished + 1);
    });
  });
  EXPECT_TRUE(claimed) << "the agent never looked at the join request";
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  const std::string out = job.io.stdout_text();
  EXPECT_NE(out.find("finished"), std::string::npos) << out;
  EXPECT_EQ(out.find("gen=2"), std::string::npos) << out;
  EXPECT_FALSE(job.channel.try_get(keys::restart(2)));
}

TEST(LaunchAgent, FinishedWorkersJoinARestartClaimedBeforeThem) {
  JoinAtTheEnd job;
  // Another node took a joiner first, and has not yet asked for the restart when the
  // workers here finish.
  const LaunchResult result = job.run([&] { job.channel.add(keys::generation_end(1), 1); });
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  const std::string out = job.io.stdout_text(), err = job.io.stderr_text();
  EXPECT_NE(out.find("finished"), std::string::npos) << out;
  EXPECT_NE(out.find("gen=2"), std::string::npos) << out;  // it restarted with the others
  EXPECT_NE(err.find("restarting the workers (restart 2 of 2)"), std::string::npos) << err;
  EXPECT_EQ(job.channel.try_get(keys::restart_members(2)), "0;0");
}

// Two agents can see failures at once; only the first to claim the restart names the
// moment it was seen (the restarted workers time their recovery from it). Here another
// agent claimed restart 1 first; this one's own failure must not overwrite its time.
TEST(LaunchAgent, OnlyTheFirstAgentToClaimARestartSetsWhenItWasSeen) {
  MemoryChannel channel;
  CapturedIo io;
  channel.add(keys::restart_claimed(1), 1);
  channel.set(keys::restart_seen(1), "123");
  LaunchOptions o = sh_options(1, "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exit 3; fi; echo gen=1");
  o.max_restarts = 1;
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  EXPECT_NE(io.stdout_text().find("gen=1"), std::string::npos);
  EXPECT_EQ(channel.try_get(keys::restart_seen(1)), "123");
  EXPECT_EQ(channel.try_get(keys::restart_claimed(1)), "2");
}

// The agent that claimed the restart can die before it announces it (restart/G): a later
// claimer announces it, or the other nodes would go on until they failed on their own;
// one that finds it announced leaves the first cause in place.
TEST(LaunchAgent, ALaterClaimerAnnouncesARestartTheFirstDidNot) {
  for (const bool announced : {false, true}) {
    MemoryChannel channel;
    CapturedIo io;
    channel.add(keys::restart_claimed(1), 1);
    if (announced) channel.set(keys::restart(1), "the first cause");
    LaunchOptions o = sh_options(1, "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exit 3; fi; echo gen=1");
    o.max_restarts = 1;
    const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
    EXPECT_EQ(result.exit_code, 0) << result.failure;
    const auto cause = channel.try_get(keys::restart(1));
    ASSERT_TRUE(cause) << "announced=" << announced;
    if (announced)
      EXPECT_EQ(*cause, "the first cause");
    else
      EXPECT_NE(cause->find("exit"), std::string::npos) << *cause;
    EXPECT_FALSE(channel.try_get(keys::restart_seen(1))) << "only the first claimer says when it saw the failure";
  }
}

namespace {

// Node 0 of an elastic job whose node 1 left on a preemption notice: generation 1 runs
// without it, and generation 2 (once a replacement asks in) finishes at once.
LaunchOptions after_node_1_left(MemoryChannel& channel) {
  channel.add(keys::kJoined, 1);  // node 1 joined, then got its preemption notice
  channel.set(keys::left(1, 0), "1");
  channel.set(keys::flushed(1, 0), "1");
  LaunchOptions o = one_node_left_options(
      "echo gen=$TORCHELASTIC_RESTART_COUNT world=$WORLD_SIZE; "
      "if [ $TORCHELASTIC_RESTART_COUNT = 2 ]; then exit 0; fi; exec sleep 30",
      3);
  o.join_timeout_s = 10;
  return o;
}

}  // namespace

// A replacement for a machine that left on a preemption notice joins under its
// --node-rank; the leave was the old machine's, not the replacement's (before, the leader
// filed the joiner as left: it spent a restart without it, and the joiner waited in vain).
TEST(LaunchAgent, AReplacementForAPreemptedNodeJoins) {
  MemoryChannel channel;
  CapturedIo io;
  const LaunchOptions o = after_node_1_left(channel);
  std::atomic<bool> stop{false};
  std::thread replacement([&] {  // once generation 1 runs without node 1, its replacement asks in
    if (!channel.wait_for(keys::restart_resume(1), std::chrono::seconds(10))) return;
    channel.set(keys::pending(1), channel.try_get(keys::kRunId).value_or(""));
    channel.add(keys::kPending, 1);
    for (int beat = 1; !stop; ++beat) {
      channel.set(keys::alive(1), "replacement-" + std::to_string(beat));
      if (channel.try_get(keys::restart_members(2)) && !channel.try_get(keys::restart_recovered(2) + "/1")) {
        channel.set(keys::restart_recovered(2) + "/1", "1");  // (the test's own marker)
        if (channel.add(keys::restart_recovered(2), 1) == 2) channel.set(keys::restart_resume(2), "1");
        channel.add(keys::kDone, 1);  // and its workers finish at once
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  stop = true;
  replacement.join();
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  EXPECT_EQ(channel.try_get(keys::restart_members(1)), "0;0");  // nodes 0, decided by node 0
  EXPECT_EQ(channel.try_get(keys::restart_members(2)), "0,1;0") << io.stderr_text();
  EXPECT_NE(io.stdout_text().find("gen=2 world=2"), std::string::npos);
}

// The store going away in the middle of a restart (node 0 ended the job, or its machine
// was lost) ends the agent with one line, and its snapshot area goes with it (before, the
// CommError escaped run() and the area stayed in /dev/shm).
TEST(LaunchAgent, AStoreLostDuringARestartEndsTheAgentAndRemovesItsArea) {
  const std::string root = "/tmp/trireme-test-agent-areas-" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  ::setenv("TRIREME_SNAPSHOT_ROOT", root.c_str(), 1);
  MemoryChannel channel;
  CapturedIo io;
  channel.before_wait = [](const std::string& key) {
    if (key == keys::restart_members(1)) throw trireme::CommError("connection reset (simulated)");
  };
  LaunchOptions o = sh_options(1, "mkdir -p $TRIREME_SNAPSHOT_DIR/rank-0 && echo x > $TRIREME_SNAPSHOT_DIR/rank-0/data; "
                                  "exit 3");
  o.max_restarts = 1;
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  ::unsetenv("TRIREME_SNAPSHOT_ROOT");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.failure.find("lost the rendezvous store"), std::string::npos) << result.failure;
  EXPECT_NE(result.failure.find("while restarting"), std::string::npos) << result.failure;
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(root)) left.push_back(entry.path().string());
  std::filesystem::remove_all(root);
  EXPECT_TRUE(left.empty()) << left.front();
}

// Node 0's workers finished and its agent waits at the exit barrier, beating on (it keeps
// the store up); then a worker here fails and this agent leads the restart. Node 0 will
// never check in: the job ends at once, saying why (before, the leader waited for it with
// no deadline, and node 0 for the barrier, until --exit-barrier ran out).
TEST(LaunchAgent, ARestartAfterAnotherNodeFinishedEndsTheJob) {
  MemoryChannel channel;
  CapturedIo io;
  channel.set(keys::kRunId, "abc");
  channel.add(keys::kJoined, 1);  // node 0 joined
  const std::string go = "/tmp/trireme-test-agent-finished-" + std::to_string(::getpid());
  // The worker here fails once node 0's workers have finished.
  const LaunchOptions o = two_node_options("while [ ! -e " + go + " ]; do sleep 0.02; done; exit 1", 1);
  LaunchResult result;
  const auto start = Clock::now();
  {
    Heartbeat node0(channel, 0, [&](int beat) {
      if (beat != 3) return;
      channel.set(keys::done(0), "1");
      channel.add(keys::kDone, 1);
      ::close(::open(go.c_str(), O_CREAT | O_WRONLY, 0600));
    });
    result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  }
  ::unlink(go.c_str());
  EXPECT_LT(seconds_since(start), 10.0);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.failure.find("exited with code 1"), std::string::npos) << result.failure;
  EXPECT_NE(result.failure.find("node 0 had already finished"), std::string::npos) << result.failure;
  EXPECT_EQ(channel.try_get(keys::kFailure), result.failure);  // node 0's barrier sees it and ends too
}

// Node 1's workers finished and its agent exited: it marked itself done, and its heartbeat
// stopped. Rank 0 here goes on writing its results for 3x --node-timeout: node 1 is
// finished, not lost, and the job succeeds (before, node 0 took it for lost and failed the
// job at the end of a good run). A worker here that fails then ends the job naming node 1
// as finished (before: lost).
TEST(LaunchAgent, AFinishedNodeWhoseHeartbeatStoppedIsNotLost) {
  for (const bool fail : {false, true}) {
    MemoryChannel channel;
    CapturedIo io;
    channel.add(keys::kJoined, 1);  // node 1 joined, beat once, finished and exited
    channel.set(keys::alive(1), "1");
    channel.set(keys::done(1), "1");
    channel.add(keys::kDone, 1);
    LaunchOptions o = two_node_options(std::string("sleep 1.5; exit ") + (fail ? "1" : "0"), 0);
    o.node_timeout_s = 0.5;
    const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
    if (!fail) {
      EXPECT_EQ(result.exit_code, 0) << result.failure;
      EXPECT_EQ(channel.try_get(keys::kAllDone), "1");
    } else {
      EXPECT_EQ(result.exit_code, 1);
      EXPECT_NE(result.failure.find("exited with code 1; node 1 had already finished"), std::string::npos)
          << result.failure;
    }
  }
}

// The snapshot areas of agents that died without removing theirs (kill -9) are removed by
// the next agent on the machine: a live agent's area is locked (AREA.lock), a dead one's
// lock is free. An area without a lock file (not an agent's) is left alone.
TEST(LaunchAgent, AnAgentRemovesTheSnapshotAreasOfDeadAgents) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("trireme-test-areas-" + std::to_string(::getpid()));
  fs::remove_all(root);
  for (const char* area : {"trireme-dead-node0", "trireme-live-node1", "trireme-other-node2"}) {
    fs::create_directories(root / area / "rank-0");
    std::ofstream(root / area / "rank-0" / "data.bin") << "snapshot";
  }
  std::ofstream(root / "trireme-dead-node0.lock").flush();
  std::ofstream(root / "trireme-live-node1.lock").flush();
  const int live = ::open((root / "trireme-live-node1.lock").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_EQ(::flock(live, LOCK_EX | LOCK_NB), 0);  // its agent, alive
  ::setenv("TRIREME_SNAPSHOT_ROOT", root.c_str(), 1);
  MemoryChannel channel;
  CapturedIo io;
  const LaunchResult result = run_agent(sh_options(1, "true"), channel, {"127.0.0.1", 1234}, io.io());
  ::unsetenv("TRIREME_SNAPSHOT_ROOT");
  ::close(live);
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(root)) left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  // (This agent's own area and lock are gone too, with the job.)
  EXPECT_EQ(left, (std::vector<std::string>{"trireme-live-node1", "trireme-live-node1.lock", "trireme-other-node2"}));
  fs::remove_all(root);
}

// A reader of the agent's output that does not keep up (a paused terminal, `| less`) costs
// output, not supervision: with its stdout unread, the agent still sees a worker fail and
// publishes it (before, it blocked in the write for as long as the reader did).
TEST(LaunchAgent, AnUnreadStdoutDoesNotStopTheSupervision) {
  MemoryChannel channel;
  CapturedIo io;
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);  // blocking, as a terminal or `| less` is
  const std::string marker =
      (std::filesystem::temp_directory_path() / ("trireme-test-unread-" + std::to_string(::getpid()))).string();
  std::filesystem::remove(marker);
  // Rank 0 writes 1 MB, far more than the pipe holds, then rank 1 fails (code 3; code 4 if
  // rank 0's writes never end).
  LaunchOptions o = sh_options(
      2, "if [ $RANK = 0 ]; then head -c 1000000 /dev/zero | tr '\\0' x; touch " + marker +
             "; exec sleep 30; fi; for i in $(seq 200); do [ -e " + marker + " ] && exit 3; sleep 0.05; done; exit 4");
  std::atomic<bool> failure_seen{false};
  std::string forwarded;
  std::thread reader([&] {  // reads nothing until the failure is published
    failure_seen = channel.wait_for(keys::kFailure, std::chrono::seconds(30));
    char buffer[65536];
    for (ssize_t n; (n = ::read(out[0], buffer, sizeof(buffer))) > 0;) forwarded.append(buffer, n);
  });
  const LaunchResult result = run_agent(o, channel, {"127.0.0.1", 1234}, {out[1], io.io().stderr_fd});
  ::close(out[1]);
  reader.join();
  ::close(out[0]);
  std::filesystem::remove(marker);
  EXPECT_TRUE(failure_seen);
  EXPECT_EQ(result.failure, "rank 1 (node 0, local 1) exited with code 3; stopped the other workers");
  EXPECT_EQ(std::count(forwarded.begin(), forwarded.end(), 'x'), 1000000);  // all of it, once read
}

// stdout and stderr on one pipe (`2>&1 | tee log`): every forwarded line arrives whole,
// however full the pipe gets (one writer thread: two could each write part of a long
// chunk into a full pipe, and the other's bytes land inside a line).
TEST(LaunchAgent, StdoutAndStderrOnOnePipeKeepTheirLinesWhole) {
  MemoryChannel channel;
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  const std::string line_a(100, 'a'), line_b(100, 'b');
  // 3000 lines of 100 bytes from each rank, rank 0 on stdout and rank 1 on stderr.
  LaunchOptions o = sh_options(
      2, "i=0; while [ $i -lt 3000 ]; do if [ $RANK = 0 ]; then echo " + line_a + "; else echo " + line_b +
             " >&2; fi; i=$((i+1)); done");
  std::string got;
  std::thread reader([&] {
    char buffer[4096];
    for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof(buffer))) > 0;) got.append(buffer, n);
  });
  const LaunchResult result = run_agent(o, channel, {"127.0.0.1", 1234}, {pipe_fds[1], pipe_fds[1]});
  ::close(pipe_fds[1]);
  reader.join();
  ::close(pipe_fds[0]);
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  std::map<std::string, int> lines;
  std::istringstream in(got);
  for (std::string line; std::getline(in, line);) ++lines[line];
  EXPECT_EQ(lines["[0] " + line_a], 3000);
  EXPECT_EQ(lines["[1] " + line_b], 3000);
  EXPECT_EQ(lines.size(), 2u) << "torn or foreign lines: " << got.substr(0, 2000);
}

// A standby worker's output is forwarded while it waits: one that writes more than a pipe
// holds before its activation (library warnings, a warm-up's log) goes on to wait for it,
// and is activated by the restart (before, its pipe was not read until it died, so it
// blocked in the write).
TEST(LaunchAgent, AStandbyThatWritesMuchBeforeItsActivationDoesNotBlock) {
  MemoryChannel channel;
  CapturedIo io;
  const std::string marker =
      (std::filesystem::temp_directory_path() / ("trireme-test-standby-" + std::to_string(::getpid()))).string();
  std::filesystem::remove(marker);
  // Generation 0 fails (code 3) once the standby has written its 300 kB and waits (code 4
  // if it never gets there); the standby, activated, exits 0.
  LaunchOptions o = sh_options(
      1, "if [ \"$TRIREME_STANDBY\" = 1 ]; then yes standby-output | head -c 300000; touch " + marker +
             "; [ \"$(head -c 1 | od -An -tu1 | tr -d ' ')\" = 1 ] && exit 0; exit 5; fi; "
             "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then for i in $(seq 200); do [ -e " + marker +
             " ] && exit 3; sleep 0.05; done; exit 4; fi; exit 6");
  o.max_restarts = 1;
  o.standby = true;
  const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);  // the 300 kB go there
  const LaunchResult result = run_agent(o, channel, {"127.0.0.1", 1234}, {devnull, io.io().stderr_fd});
  ::close(devnull);
  std::filesystem::remove(marker);
  const std::string err = io.stderr_text();
  EXPECT_EQ(result.exit_code, 0) << result.failure << "\n" << err;
  EXPECT_NE(err.find("exited with code 3"), std::string::npos) << err;
  EXPECT_NE(err.find("1 from standby"), std::string::npos) << err;
}

// A restart's leader waits for a member that beats on but never checks in (its agent
// stuck) only until --join-timeout, as the followers do, and then ends the job saying
// which node it waited for (before, it waited for ever).
TEST(LaunchAgent, ARestartLeaderWaitsForAStuckMemberOnlyUntilTheJoinTimeout) {
  MemoryChannel channel;
  CapturedIo io;
  channel.add(keys::kJoined, 1);  // node 1 joined; it beats but never checks in
  LaunchOptions o = two_node_options("exit 3", 0);
  o.join_timeout_s = 1;
  o.stop_grace_s = 0.5;
  LaunchResult result;
  const auto start = Clock::now();
  {
    Heartbeat node1(channel, 1);
    result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  }
  // (--join-timeout after the most a member may take to stop: the grace, SIGKILL's 10 s.)
  EXPECT_LT(seconds_since(start), 25.0);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.failure, "node 1 did not check in to restart 1 within 10.5 s of stopping and --join-timeout 1 s "
                            "(alive, but not stopping its workers)");
  EXPECT_EQ(channel.try_get(keys::kFailure), result.failure);
}

// A first stopping signal that arrives while the agent stops the workers for a failure
// (a scheduler's scancel, say) leaves them their grace period (3 s here); only a second
// one hurries the SIGKILL (before, the first one did).
TEST(LaunchAgent, AFirstSignalDuringAStopLeavesTheWorkersTheirGrace) {
  MemoryChannel channel;
  CapturedIo io;
  std::atomic<bool> agent_running{true};  // (a SIGTERM after run_agent would end the test binary)
  // Once the failure is published, as the stop begins: a first SIGTERM; 1.5 s later, a
  // second, which hurries the SIGKILL (the worker ignores SIGTERM).
  std::thread signal([&] {
    if (!channel.wait_for(keys::kFailure, std::chrono::seconds(20)) || !agent_running) return;
    ::kill(::getpid(), SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // (the stimulus's timing, not a wait)
    if (agent_running) ::kill(::getpid(), SIGTERM);
  });
  // (Rank 1 fails once rank 0 ignores SIGTERM, which rank 0 says with a file: a loaded
  // machine may start rank 0 late.)
  const std::string ignoring = "/tmp/trireme-test-agent-grace-" + std::to_string(::getpid());
  LaunchOptions o = sh_options(2, "if [ $RANK = 1 ]; then while [ ! -e " + ignoring +
                                      " ]; do sleep 0.02; done; exit 2; fi; trap '' TERM; touch " + ignoring +
                                      "; exec sleep 30");
  o.stop_grace_s = 3;
  Clock::time_point stopping = Clock::now();
  channel.after_set = [&](const std::string& key) {
    if (key == keys::kFailure) stopping = Clock::now();
  };
  const LaunchResult result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  agent_running = false;
  const double stop_s = seconds_since(stopping);
  signal.join();
  std::filesystem::remove(ignoring);
  EXPECT_EQ(result.failure, "rank 1 (node 0, local 1) exited with code 2; stopped the other workers");
  EXPECT_GE(stop_s, 1.4) << "the first signal killed the worker before its grace period ended";
  EXPECT_LT(stop_s, 2.9) << "the second signal did not hurry the SIGKILL";
}

// A signal to an agent in the middle of a restart publishes the failure: the others would
// otherwise wait for it at the next barrier until --join-timeout.
TEST(LaunchAgent, ASignalDuringARestartEndsTheJob) {
  MemoryChannel channel;
  CapturedIo io;
  channel.add(keys::kJoined, 1);  // node 1 joined; it beats but is slow to check in
  std::thread signal([&] {  // once this agent has checked in to restart 1 (it leads it)
    if (channel.wait_for(keys::restart_in(1, 0), std::chrono::seconds(20))) ::kill(::getpid(), SIGINT);
  });
  LaunchResult result;
  const auto start = Clock::now();
  {
    Heartbeat node1(channel, 1, [&](int) {  // it reads the failure and is done (node 0 keeps the store until then)
      if (channel.try_get(keys::kFailure) && !channel.try_get(keys::done(1))) {
        channel.set(keys::done(1), "1");
        if (channel.add(keys::kDone, 1) >= 2) channel.set(keys::kAllDone, "1");
      }
    });
    result = run_agent(two_node_options("exit 3", 0), channel, {"127.0.0.1", 1234}, io.io());
  }
  signal.join();
  EXPECT_LT(seconds_since(start), 10.0);
  EXPECT_EQ(result.exit_code, 128 + SIGINT) << result.failure;
  EXPECT_EQ(channel.try_get(keys::kFailure), "node 0's agent received SIGINT while restarting");
}

namespace {

// A replacement for node 1 of a job of run id "abc" that runs with its 2 nodes (node 1
// was dropped), asking to join with a --join-timeout of 1 s.
LaunchOptions replacement_for_node_1(MemoryChannel& channel) {
  channel.set(keys::kRunId, "abc");
  channel.add(keys::kJoined, 2);  // the job runs with its 2 nodes
  LaunchOptions o = one_node_left_options("exit 0", 1);
  o.node_rank = 1;
  o.join_timeout_s = 1;
  channel.add(keys::lost(1), 1);  // node 1 was dropped: this is its replacement
  channel.add(keys::node(1), 1);  // (the machine it replaces)
  return o;
}

}  // namespace

// A node that gives up waiting to join withdraws its request (a later restart's leader
// would wait for it as a joiner until --node-timeout).
TEST(LaunchAgent, AJoinerThatGivesUpWithdrawsItsRequest) {
  MemoryChannel channel;
  CapturedIo io;
  const LaunchOptions o = replacement_for_node_1(channel);
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.failure.find("waiting for the running job to take node 1"), std::string::npos) << result.failure;
  EXPECT_EQ(channel.try_get(keys::kPending), "1");  // it did ask
  EXPECT_EQ(channel.try_get(keys::pending(1)), "");  // and withdrew
  // Its --node-rank is free again: another try under it asks again (before, it was
  // refused as a second node 1, for ever).
  const auto retry = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  EXPECT_NE(retry.failure.find("waiting for the running job to take node 1"), std::string::npos) << retry.failure;
  EXPECT_EQ(channel.try_get(keys::kPending), "2");
  EXPECT_EQ(channel.try_get(keys::node(1)), "1");
}

// A joiner whose --join-timeout runs out just as a leader admits it: the admission came
// first (one compare-and-set each), so it keeps its --node-rank and waits for the
// membership instead of giving up (before, it gave its --node-rank back while the job
// counted it a member, and a second agent could take the same --node-rank). Here the
// admitting leader's decision does not stand (another's, without it, does): it then
// withdraws (or asks again and withdraws when its time has run out) and gives its
// --node-rank back.
TEST(LaunchAgent, AJoinerAdmittedAsItGivesUpWaitsForTheMembership) {
  MemoryChannel channel;
  CapturedIo io;
  const LaunchOptions o = replacement_for_node_1(channel);
  // Compare-and-sets of its request: the first is the admission below, the second the
  // joiner's try to withdraw once its --join-timeout ran out.
  std::promise<void> tried_to_withdraw;
  int sets_of_request = 0;  // (on the joiner's thread, after the admission)
  channel.before_compare_set = [&](const std::string& key) {
    if (key == keys::pending(1) && ++sets_of_request == 2) tried_to_withdraw.set_value();
  };
  bool tried = false;
  std::string pending_after_timeout, node_after_timeout;
  std::thread leader([&] {
    while (channel.try_get(keys::pending(1)) != "abc") std::this_thread::sleep_for(std::chrono::milliseconds(5));
    channel.compare_set(keys::pending(1), "abc", keys::admitted(1));  // admitted at restart 1
    tried = tried_to_withdraw.get_future().wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    pending_after_timeout = channel.try_get(keys::pending(1)).value_or("?");
    node_after_timeout = channel.try_get(keys::node(1)).value_or("?");
    channel.set(keys::restart_members(1), "0;0");  // the decision that stood left it out
  });
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  leader.join();
  EXPECT_TRUE(tried) << "the joiner withdrew without a compare-and-set";
  EXPECT_EQ(pending_after_timeout, keys::admitted(1));  // the withdrawal failed,
  EXPECT_EQ(node_after_timeout, "2");                   // and kept its --node-rank
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.failure.find("waiting for the running job to take node 1"), std::string::npos) << result.failure;
  EXPECT_EQ(channel.try_get(keys::pending(1)), "");  // left out, it withdrew in the end
  EXPECT_EQ(channel.try_get(keys::node(1)), "1");    // with its --node-rank
}

// An admission whose leader's decision did not stand, made after the joiner had seen that
// decision and moved on (a stalled leader waking late): the joiner's request is left
// admitted at a restart it passed. Its giving up still withdraws it and its --node-rank.
TEST(LaunchAgent, ALateAdmissionDoesNotHoldTheJoiner) {
  MemoryChannel channel;
  CapturedIo io;
  const LaunchOptions o = replacement_for_node_1(channel);
  channel.set(keys::restart_members(1), "0;0");  // restart 1 was decided without it
  std::thread stale_leader([&] {
    while (channel.try_get(keys::pending(1)) != "abc") std::this_thread::sleep_for(std::chrono::milliseconds(5));
    channel.compare_set(keys::pending(1), "abc", keys::admitted(1));  // restart 1's other leader, late
  });
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  stale_leader.join();
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.failure.find("waiting for the running job to take node 1"), std::string::npos) << result.failure;
  EXPECT_EQ(channel.try_get(keys::pending(1)), "");
  EXPECT_EQ(channel.try_get(keys::node(1)), "1");
}

// The other order: a joiner withdraws after the leader saw it ask but before it admits
// it; the compare-and-set of the admission fails and the membership leaves it out.
TEST(LaunchAgent, AJoinerThatWithdrewBeforeItsAdmissionIsLeftOut) {
  MemoryChannel channel;
  CapturedIo io;
  const LaunchOptions o = after_node_1_left(channel);
  channel.before_compare_set = [&](const std::string& key) {
    if (key == keys::pending(1)) channel.set(keys::pending(1), "");  // it gives up just then
  };
  std::atomic<bool> stop{false};
  std::thread replacement([&] {  // once generation 1 runs without node 1, its replacement asks in
    if (!channel.wait_for(keys::restart_resume(1), std::chrono::seconds(10))) return;
    channel.set(keys::pending(1), channel.try_get(keys::kRunId).value_or(""));
    channel.add(keys::kPending, 1);
    for (int beat = 1; !stop; ++beat) {
      channel.set(keys::alive(1), "replacement-" + std::to_string(beat));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  stop = true;
  replacement.join();
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  EXPECT_EQ(channel.try_get(keys::restart_members(2)), "0;0") << io.stderr_text();  // without node 1
  EXPECT_NE(io.stdout_text().find("gen=2 world=1"), std::string::npos);
}

// A worker that exits and leaves a child behind in its process group (here a shell's
// background job): the restart stops the child too, as it stops the running workers
// (before, only running workers' groups were signalled, and the child lived on into the
// next generation, holding whatever it held).
TEST(LaunchAgent, ARestartStopsWhatAnExitedWorkerLeftBehind) {
  MemoryChannel channel;
  CapturedIo io;
  const std::string pidfile = "/tmp/trireme-test-agent-orphan-" + std::to_string(::getpid());
  ::unlink(pidfile.c_str());
  LaunchOptions o = sh_options(1, "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then sleep 60 & echo $! > " + pidfile +
                                      "; exit 3; fi; exit 0");
  o.max_restarts = 1;
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  std::ifstream in(pidfile);
  pid_t orphan = -1;
  ASSERT_TRUE(in >> orphan) << "the worker wrote no pid";
  ::unlink(pidfile.c_str());
  // Gone, or a zombie waiting for init: not running (a signal takes effect when the
  // process next runs, so this waits a little for it).
  const auto running = [&](std::string* line) {
    std::ifstream stat("/proc/" + std::to_string(orphan) + "/stat");
    if (!std::getline(stat, *line)) return false;
    const char state = (*line)[line->rfind(')') + 2];
    return state != 'Z' && state != 'X';
  };
  std::string line;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (running(&line) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(running(&line)) << "the exited worker's child is still running: " << line;
  if (running(&line)) ::kill(orphan, SIGKILL);  // (not left behind by the test)
}

// A worker that exits stays a zombie until the agent has signalled its process group (for
// what it left behind there), then is reaped: its pid, the group's id, cannot be given to
// another process meanwhile, which the signal would reach (before, the worker was reaped
// at once and its group signalled by number later, when a restart stopped the workers).
TEST(LaunchAgent, AnExitedWorkerKeepsItsPidUntilItsGroupIsSignalled) {
  MemoryChannel channel;
  CapturedIo io;
  const std::string pidfile = "/tmp/trireme-test-agent-zombie-" + std::to_string(::getpid());
  ::unlink(pidfile.c_str());
  pid_t worker = -1;
  char state_at_restart = '?';  // the worker's state when the restart starts stopping workers
  channel.after_set = [&](const std::string& key) {
    if (key != keys::restart(1)) return;  // set just before stop_workers
    std::ifstream in(pidfile);
    in >> worker;
    std::ifstream stat("/proc/" + std::to_string(worker) + "/stat");
    std::string line;
    state_at_restart = std::getline(stat, line) ? line[line.rfind(')') + 2] : '-';  // '-': gone
  };
  LaunchOptions o = sh_options(1, "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then echo $$ > " + pidfile +
                                      "; exit 3; fi; exit 0");
  o.max_restarts = 1;
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  ::unlink(pidfile.c_str());
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  ASSERT_GT(worker, 0) << "the worker wrote no pid";
  EXPECT_EQ(state_at_restart, 'Z') << "the exited worker was reaped before its group was signalled";
  errno = 0;
  EXPECT_EQ(::waitpid(worker, nullptr, WNOHANG), -1);  // and reaped since: no longer our child
  EXPECT_EQ(errno, ECHILD);
}

// Node 0 of a two-node job, from the store's side: it beats until node 1 (the agent under
// test) beats too, then its worker fails, it checks in to restart 1 and names itself its
// leader. What it does after that (go silent, decide, die) is up to the test.
void node0_fails_and_leads_restart_1(MemoryChannel& channel) {
  for (int beat = 1; beat < 200 && !channel.wait_for(keys::alive(1), std::chrono::milliseconds(50)); ++beat)
    channel.set(keys::alive(0), std::to_string(beat));
  channel.add(keys::restart_claimed(1), 1);
  channel.set(keys::restart(1), "rank 0 (node 0, local 0) exited with code 1");
  channel.set(keys::restart_in(1, 0), "1");
  channel.add(keys::restart_stopped(1), 1);
  channel.set(keys::restart_lead(1, 0), "0");
}

// Node 1 of a job whose node 0 has joined (in `channel`); its worker echoes its generation
// and world size, and runs until a restart (2 allowed).
LaunchOptions node1_after_node0_joined(MemoryChannel& channel) {
  channel.set(keys::kRunId, "abc");
  channel.add(keys::kJoined, 1);
  LaunchOptions o = one_node_left_options(
      "echo gen=$TORCHELASTIC_RESTART_COUNT world=$WORLD_SIZE; if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exec "
      "sleep 30; fi",
      2);
  o.node_rank = 1;
  return o;
}

// A restart's leader can die with its machine in the middle of the restart (two spot
// machines reclaimed seconds apart). Node 0 here starts restart 1, checks in first (it
// leads), names itself, and never beats again; this agent (node 1) takes over after
// --node-timeout, counting node 0 lost: the elastic job goes on alone, the fixed-size one
// ends naming node 0 (before, node 1 waited for the membership until --join-timeout and
// the job failed although enough nodes survived).
TEST(LaunchAgent, ARestartWhoseLeaderDiesIsDecidedByAnother) {
  for (const bool is_elastic : {true, false}) {
    MemoryChannel channel;
    CapturedIo io;
    channel.set(keys::kRunId, "abc");
    channel.add(keys::kJoined, 1);  // node 0 joined
    LaunchOptions o = one_node_left_options(
        "echo gen=$TORCHELASTIC_RESTART_COUNT world=$WORLD_SIZE rank=$RANK; "
        "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exec sleep 30; fi",
        1);
    o.node_rank = 1;
    o.nnodes_min = is_elastic ? 1 : 0;
    o.join_timeout_s = 10;
    std::thread node0([&] { node0_fails_and_leads_restart_1(channel); });
    const auto start = Clock::now();
    const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
    node0.join();
    EXPECT_LT(seconds_since(start), 8.0) << "waited for --join-timeout";
    const std::string out = io.stdout_text(), err = io.stderr_text();
    EXPECT_NE(err.find("node 0, leading restart 1, went silent; node 1 decides the membership instead"),
              std::string::npos)
        << err;
    EXPECT_EQ(channel.try_get(keys::restart_lead(1, 1)), "1");
    if (is_elastic) {
      EXPECT_EQ(result.exit_code, 0) << result.failure;
      EXPECT_NE(out.find("gen=1 world=1 rank=0"), std::string::npos) << out;
      EXPECT_NE(err.find("node 0 is lost (no heartbeat for 0.5 s); going on with nodes 1"), std::string::npos) << err;
      EXPECT_EQ(channel.try_get(keys::restart_members(1)), "1;1");
      EXPECT_EQ(channel.try_get(keys::lost(0)), "1");  // a replacement may take its --node-rank
    } else {
      const std::string failure = "node 0 is lost (no heartbeat for 0.5 s); 1 node left, fewer than the 2 the job "
                                  "needs (give --nnodes MIN:MAX to go on with fewer)";
      EXPECT_EQ(result.exit_code, 1);
      EXPECT_EQ(result.failure, failure);
      EXPECT_EQ(channel.try_get(keys::kFailure), failure);
      EXPECT_EQ(channel.try_get(keys::restart_members(1)), ";1");  // no nodes, decided by node 1
    }
  }
}

// The leader dies right after deciding, before it reaches the recovery barrier: this agent
// does not wait there until --join-timeout, but restarts again without it once its
// heartbeat has stopped for --node-timeout.
TEST(LaunchAgent, AMemberLostBeforeTheRecoveryBarrierIsRestartedWithout) {
  MemoryChannel channel;
  CapturedIo io;
  LaunchOptions o = node1_after_node0_joined(channel);
  o.join_timeout_s = 10;
  std::thread node0([&] {
    node0_fails_and_leads_restart_1(channel);
    // It beats on until this agent has checked in, decides both stay, and is gone.
    for (int beat = 200; beat < 400 && !channel.wait_for(keys::restart_in(1, 1), std::chrono::milliseconds(50));
         ++beat)
      channel.set(keys::alive(0), std::to_string(beat));
    channel.compare_set(keys::restart_members(1), "", "0,1;0");
  });
  const auto start = Clock::now();
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  node0.join();
  EXPECT_LT(seconds_since(start), 8.0) << "waited for --join-timeout";
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  const std::string out = io.stdout_text(), err = io.stderr_text();
  EXPECT_EQ(out.find("gen=1"), std::string::npos) << out;  // generation 1 never started
  EXPECT_NE(out.find("gen=2 world=1"), std::string::npos) << out;
  EXPECT_NE(err.find("node 0 is lost (no heartbeat for 0.5 s) before restart 1 had recovered; restarting the "
                     "workers (restart 2 of 2)"),
            std::string::npos)
      << err;
  EXPECT_EQ(channel.try_get(keys::restart_members(2)), "1;1");
  EXPECT_EQ(channel.try_get(keys::lost(0)), "1");
}

// The leader goes silent, this agent takes the decision over, and the silent leader's own
// decision (a stall, not a death) lands first: the first published membership stands and
// this agent follows it instead of replacing it (before, a leader that died between
// winning the publication and writing the membership left the others waiting for
// --join-timeout; now the decision is one compare-and-set).
TEST(LaunchAgent, TheFirstPublishedMembershipStandsWhenTwoLeadersDecide) {
  MemoryChannel channel;
  CapturedIo io;
  LaunchOptions o = node1_after_node0_joined(channel);
  o.nnodes_min = 1;
  o.join_timeout_s = 10;
  std::string lost_race;  // what this agent's decision found in the key
  channel.after_set = [&](const std::string& key) {
    if (key == keys::restart_lead(1, 1))  // this agent now leads attempt 1; node 0 wakes up and publishes
      lost_race = channel.compare_set(keys::restart_members(1), "", "0,1;0");
  };
  std::thread node0([&] { node0_fails_and_leads_restart_1(channel); });
  const auto start = Clock::now();
  const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  node0.join();
  EXPECT_LT(seconds_since(start), 8.0) << "waited for --join-timeout";
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  const std::string out = io.stdout_text(), err = io.stderr_text();
  EXPECT_EQ(lost_race, "0,1;0");
  EXPECT_NE(err.find("node 0, leading restart 1, went silent; node 1 decides the membership instead"),
            std::string::npos)
      << err;
  // Node 0's decision stood: generation 1 had both nodes (this agent's "1;1" did not replace
  // it), and node 0, silent at the recovery barrier, was left out at restart 2.
  EXPECT_EQ(channel.try_get(keys::restart_members(1)), "0,1;0");
  EXPECT_EQ(out.find("gen=1"), std::string::npos) << out;
  EXPECT_NE(out.find("gen=2 world=1"), std::string::npos) << out;
  EXPECT_EQ(channel.try_get(keys::restart_members(2)), "1;1");
  EXPECT_EQ(channel.try_get(keys::lost(0)), "1");  // counted once, by the restart that dropped it
}

// LaunchOptions::before_founding runs on an agent that founds the job, and an exception
// from it leaves run_agent with the agent's --node-rank given back (a corrected retry is
// not refused as a second node 0); an agent joining a job already running (a replacement,
// node 0's too under an external store) does not run it: the job's state is its own.
TEST(LaunchAgent, BeforeFoundingRunsOnlyWhereTheJobIsFounded) {
  {
    MemoryChannel channel;
    CapturedIo io;
    LaunchOptions o = sh_options(1, "exit 0");
    o.before_founding = [] { throw trireme::InvalidArgument("runs/x already holds an earlier run's checkpoints"); };
    EXPECT_THROW(run_agent(o, channel, {"127.0.0.1", 1234}, io.io()), trireme::InvalidArgument);
    EXPECT_EQ(channel.add(keys::node(0), 0), 0) << "the --node-rank was not given back";
    EXPECT_EQ(channel.add(keys::kJoined, 0), 0);
    int calls = 0;
    o.before_founding = [&] { ++calls; };
    EXPECT_EQ(run_agent(o, channel, {"127.0.0.1", 1234}, io.io()).exit_code, 0);  // the retry founds the job
    EXPECT_EQ(calls, 1);
  }
  {
    MemoryChannel channel;
    CapturedIo io;
    channel.set(keys::kRunId, "abc");
    channel.add(keys::kJoined, 2);  // both places taken: the job runs
    LaunchOptions o = two_node_options("exit 0", 0);
    o.external_store = true;  // node 0 is a machine like the others, and this is its replacement
    bool called = false;
    o.before_founding = [&] { called = true; };
    const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
    EXPECT_FALSE(called);
    EXPECT_NE(result.failure.find("is already running"), std::string::npos) << result.failure;
  }
}

// A worker that exits with kExitNoRestart failed in a way a restart would repeat (a NaN
// step replayed from its snapshot): the job ends at once instead of spending its restarts;
// any other failure code is restarted as before.
TEST(LaunchAgent, AWorkerExitingWithNoRestartIsNotRestarted) {
  for (const int code : {kExitNoRestart, 3}) {
    MemoryChannel channel;
    CapturedIo io;
    LaunchOptions o = sh_options(1, "echo gen=$TORCHELASTIC_RESTART_COUNT; exit " + std::to_string(code));
    o.max_restarts = 2;
    const auto result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
    const std::string out = io.stdout_text();
    EXPECT_NE(result.exit_code, 0);
    if (code == kExitNoRestart) {
      EXPECT_EQ(out, "[0] gen=0\n");
      EXPECT_EQ(result.failure.find("rank 0 (node 0, local 0) exited with code 78 (kExitNoRestart: a restart would "
                                    "repeat it), so the job was not restarted"),
                0u)
          << result.failure;
    } else {
      EXPECT_NE(out.find("gen=2"), std::string::npos) << out;
      EXPECT_NE(result.failure.find("gave up after 2 restarts"), std::string::npos) << result.failure;
    }
  }
}

namespace {

// Node 1 of a 3-node job whose nodes 0 and 2 have joined; its worker echoes its generation
// and world size, and runs until a restart (1 allowed).
LaunchOptions node1_of_three(MemoryChannel& channel, double join_timeout_s, double stop_grace_s) {
  channel.set(keys::kRunId, "abc");
  channel.add(keys::kJoined, 2);
  LaunchOptions o = sh_options(1, "echo gen=$TORCHELASTIC_RESTART_COUNT world=$WORLD_SIZE; "
                                  "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exec sleep 30; fi");
  o.nnodes = 3;
  o.node_rank = 1;
  o.max_restarts = 1;
  o.node_timeout_s = 30;
  o.join_timeout_s = join_timeout_s;
  o.stop_grace_s = stop_grace_s;
  o.rdzv_port = 1234;
  return o;
}

// Node 0's part in a 3-node restart 1: its worker failed; it claims the restart, checks in
// first and leads the decision.
void node0_leads_restart_1_of_three(MemoryChannel& channel) {
  channel.add(keys::restart_claimed(1), 1);
  channel.add(keys::restart_stopped(1), 1);
  channel.set(keys::restart_lead(1, 0), "0");
  channel.set(keys::restart_in(1, 0), "1");
  channel.set(keys::restart(1), "rank 0 (node 0, local 0) exited with code 3");
}

// The decision that all three nodes stay (led by node 0), and nodes 0 and 2 at the
// recovery barrier.
void all_three_stay_and_recover(MemoryChannel& channel) {
  channel.compare_set(keys::restart_members(1), "", "0,1,2;0");
  channel.set(keys::kGeneration, "1");
  for (int node = 0; node < 2; ++node)
    if (channel.add(keys::restart_recovered(1), 1) == 3) channel.set(keys::restart_resume(1), "1");
}

// Runs this agent as node 1 of three while nodes 0 and 2 beat; then `others` is joined, and
// the restart must have gone on to generation 1 with all three, no failure published.
void expect_restart_1_of_three(const LaunchOptions& o, MemoryChannel& channel, std::thread& others) {
  CapturedIo io;
  LaunchResult result;
  {
    Heartbeat node0(channel, 0), node2(channel, 2);
    result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  }
  others.join();
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  EXPECT_FALSE(channel.try_get(keys::kFailure)) << *channel.try_get(keys::kFailure);
  EXPECT_NE(io.stdout_text().find("gen=1 world=3"), std::string::npos) << io.stdout_text();
}

}  // namespace

// With three nodes, a restart's follower waits for the membership as long as its leader
// waits for the members to check in: --join-timeout after the longest a member may take to
// stop. Node 2's worker ignores SIGTERM and takes --stop-grace (3 s), longer than
// --join-timeout (2 s), to stop; node 0 leads and waits for it; this agent (node 1) checked
// in at once. The restart goes on (before, node 1 gave up after --join-timeout, and its
// failure ended the job while node 2 was still stopping).
TEST(LaunchAgent, ARestartsFollowerWaitsForASlowMemberAsLongAsItsLeader) {
  MemoryChannel channel;
  const LaunchOptions o = node1_of_three(channel, /*join_timeout_s=*/2, /*stop_grace_s=*/3);
  // Node 0's worker fails: it claims restart 1, checks in first (it leads) and waits for
  // node 2, which checks in once its worker is killed after the grace; node 0 then decides
  // that all three stay, and both reach the recovery barrier.
  std::thread others([&] {
    if (!channel.wait_for(keys::kReady, std::chrono::seconds(10))) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // (the workers here start)
    node0_leads_restart_1_of_three(channel);
    std::this_thread::sleep_for(std::chrono::milliseconds(3200));  // node 2 stops its worker
    channel.set(keys::restart_in(1, 2), "1");
    channel.add(keys::restart_stopped(1), 1);
    if (!channel.wait_for(keys::restart_in(1, 1), std::chrono::seconds(10))) return;
    all_three_stay_and_recover(channel);
  });
  expect_restart_1_of_three(o, channel, others);
}

// A leader that takes a restart over starts its wait anew, and its followers wait with it:
// node 0 leads restart 1 and decides nothing; just before this agent's (node 1's) wait
// ends, node 2 claims the decision and publishes it 3 s later. The restart goes on
// (before, the follower's deadline stayed where the first leader had begun, and node 1
// gave up while the new leader still waited for the members).
TEST(LaunchAgent, ARestartsFollowerWaitsForALeaderThatTookOverAsLongAsItWaits) {
  MemoryChannel channel;
  const LaunchOptions o = node1_of_three(channel, /*join_timeout_s=*/0.5, /*stop_grace_s=*/0.5);
  // This agent's wait for the membership: --join-timeout after twice the stopping allowance.
  const double wait_s = o.join_timeout_s + 2 * (o.stop_grace_s + 10.0);
  std::thread others([&] {
    if (!channel.wait_for(keys::kReady, std::chrono::seconds(10))) return;
    node0_leads_restart_1_of_three(channel);
    if (!channel.wait_for(keys::restart_in(1, 1), std::chrono::seconds(10))) return;
    const auto checked_in = Clock::now();
    std::this_thread::sleep_until(checked_in + std::chrono::duration<double>(wait_s - 1.5));  // (the stimulus)
    channel.add(keys::restart_lead_claimed(1, 1), 1);
    channel.set(keys::restart_lead(1, 1), "2");
    channel.set(keys::restart_in(1, 2), "1");
    channel.add(keys::restart_stopped(1), 1);
    std::this_thread::sleep_for(std::chrono::seconds(3));  // node 2 waits for the members a while
    all_three_stay_and_recover(channel);
  });
  expect_restart_1_of_three(o, channel, others);
}

// Node 0 hosts the store: a restart that ends there (a signal here) marks its agent done
// and keeps the store up until the others, who read why, are done too (before, it returned
// at once and the store went with it: the others said they had lost the store instead).
TEST(LaunchAgent, ARestartEndingOnTheStoresNodeKeepsTheStoreForTheOthers) {
  MemoryChannel channel;
  CapturedIo io;
  channel.add(keys::kJoined, 1);  // node 1 joined; it beats but is slow to check in
  std::thread signal([&] {  // once this agent has checked in to restart 1 (it leads it)
    if (channel.wait_for(keys::restart_in(1, 0), std::chrono::seconds(20))) ::kill(::getpid(), SIGINT);
  });
  std::atomic<int> failure_seen_at{0};
  Clock::time_point node1_done{};
  LaunchResult result;
  {
    // Node 1 reads the failure, takes half a second to stop its workers, and is done.
    Heartbeat node1(channel, 1, [&](int beat) {
      if (!failure_seen_at && channel.try_get(keys::kFailure)) failure_seen_at = beat;
      if (!failure_seen_at || beat != failure_seen_at + 10) return;
      node1_done = Clock::now();
      channel.set(keys::done(1), "1");
      if (channel.add(keys::kDone, 1) >= 2) channel.set(keys::kAllDone, "1");
    });
    result = run_agent(two_node_options("exit 3", 0), channel, {"127.0.0.1", 1234}, io.io());
  }
  const auto returned = Clock::now();
  signal.join();
  EXPECT_EQ(result.exit_code, 128 + SIGINT) << result.failure;
  EXPECT_EQ(channel.try_get(keys::kFailure), "node 0's agent received SIGINT while restarting");
  EXPECT_EQ(channel.try_get(keys::done(0)), "1");
  EXPECT_NE(node1_done, Clock::time_point{}) << "node 1 never finished";
  EXPECT_LE(node1_done, returned) << "node 0 took the store down before node 1 was done";
}

namespace {

// A snapshot keeper whose first stop() takes `stop_time` (a round in flight with a slow peer).
class SlowStopKeeper : public SnapshotKeeper {
 public:
  explicit SlowStopKeeper(std::chrono::milliseconds stop_time) : stop_time_(stop_time) {}
  void start(const KeeperGeneration&) override {}
  void stop() override {
    if (!stopping.exchange(true)) std::this_thread::sleep_for(stop_time_);
  }
  KeeperRecovery recover(const KeeperGeneration&, const KeeperGeneration&) override { return {}; }
  bool flush(double) override { return true; }
  std::string summary() const override { return ""; }
  std::atomic<bool> stopping{false};

 private:
  std::chrono::milliseconds stop_time_;
};

}  // namespace

// A second stopping signal hurries the SIGKILL also when it arrived before the workers'
// stop began (here while the snapshot keeper stops, after the first signal ended the
// supervision); before, it was not counted, and the workers got their whole grace (10 s).
TEST(LaunchAgent, ASecondSignalBeforeTheStopHurriesIt) {
  const std::string root = "/tmp/trireme-test-agent-hurry-" + std::to_string(::getpid());
  std::filesystem::create_directories(root);
  ::setenv("TRIREME_SNAPSHOT_ROOT", root.c_str(), 1);
  const std::string started = root + "/started";
  MemoryChannel channel;
  CapturedIo io;
  SlowStopKeeper keeper(std::chrono::milliseconds(1500));
  std::atomic<bool> agent_running{true};
  std::atomic<Clock::time_point> first{};
  std::thread signal([&] {
    for (int i = 0; i < 500 && !std::filesystem::exists(started); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    first = Clock::now();
    ::kill(::getpid(), SIGTERM);
    for (int i = 0; i < 500 && !keeper.stopping; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (agent_running) ::kill(::getpid(), SIGTERM);
  });
  LaunchOptions o = sh_options(1, "trap '' TERM; touch " + started + "; exec sleep 30");
  o.stop_grace_s = 10;
  const LaunchResult result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io(), &keeper);
  agent_running = false;
  const double stop_s = seconds_since(first);
  signal.join();
  ::unsetenv("TRIREME_SNAPSHOT_ROOT");
  std::filesystem::remove_all(root);
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.failure;
  EXPECT_LT(stop_s, 6.0) << "the second signal did not hurry the SIGKILL";
}

// A signal that arrives while the agent stops its workers for a restart ends the job
// there (before, the next generation's workers were started first).
TEST(LaunchAgent, ASignalWhileStoppingForARestartEndsBeforeTheNextGeneration) {
  MemoryChannel channel;
  CapturedIo io;
  // Rank 0 says, with files, that it handles SIGTERM and then that the stop for restart 1
  // sent it one (it lives on through the grace); rank 1 fails once the first is there.
  const std::string trapping = "/tmp/trireme-test-agent-trapping-" + std::to_string(::getpid());
  const std::string stopping = "/tmp/trireme-test-agent-stopping-" + std::to_string(::getpid());
  std::atomic<bool> agent_running{true};
  std::thread signal([&] {  // during the grace of the stop for restart 1
    for (int i = 0; i < 1000 && agent_running && !std::filesystem::exists(stopping); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (agent_running) ::kill(::getpid(), SIGINT);
  });
  LaunchOptions o = sh_options(2, "echo gen=$TORCHELASTIC_RESTART_COUNT; "
                                  "if [ $TORCHELASTIC_RESTART_COUNT != 0 ]; then exit 0; fi; "
                                  "if [ $RANK = 1 ]; then while [ ! -e " + trapping +
                                      " ]; do sleep 0.02; done; exit 3; fi; "
                                      "trap 'touch " + stopping + "' TERM; touch " + trapping +
                                      "; while true; do sleep 0.05; done");
  o.max_restarts = 1;
  o.stop_grace_s = 3;
  const LaunchResult result = run_agent(o, channel, {"127.0.0.1", 1234}, io.io());
  agent_running = false;
  signal.join();
  const bool stopped_in_grace = std::filesystem::exists(stopping);
  std::filesystem::remove(trapping);
  std::filesystem::remove(stopping);
  EXPECT_TRUE(stopped_in_grace);
  const std::string out = io.stdout_text();
  EXPECT_EQ(result.exit_code, 128 + SIGINT) << result.failure;
  EXPECT_EQ(result.failure, "received SIGINT while restarting");
  EXPECT_EQ(out.find("gen=1"), std::string::npos) << out;
}

// A snapshot area whose lock another agent holds (a stalled one of the same job and node,
// say, that a replacement is taking over from) is not shared (before, it used the area
// without the lock, and the other agent's cleanup could delete it); the agent says so and
// gives its workers an area of its own, so that every node of the job still has one (a
// node without an area calls other resume collectives than the rest), and removes it at
// the end.
TEST(LaunchAgent, ASnapshotAreaLockedByAnotherAgentIsNotUsed) {
  const std::string root = "/tmp/trireme-test-agent-locked-" + std::to_string(::getpid());
  std::filesystem::create_directories(root);
  ::setenv("TRIREME_SNAPSHOT_ROOT", root.c_str(), 1);
  const std::string held_area = root + "/trireme-abc-node1";
  const int held = ::open((held_area + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
  MemoryChannel channel;
  CapturedIo io;
  channel.set(keys::kRunId, "abc");
  channel.add(keys::kJoined, 1);  // node 0 joined
  LaunchResult result;
  {
    Heartbeat node0(channel, 0);
    // The worker snapshots as a trainer would: into its area, which it creates.
    result = run_agent(two_node_options("echo area=[$TRIREME_SNAPSHOT_DIR]; mkdir -p $TRIREME_SNAPSHOT_DIR/rank-1", 1),
                       channel, {"127.0.0.1", 1234}, io.io());
  }
  ::unsetenv("TRIREME_SNAPSHOT_ROOT");
  ::close(held);
  const bool held_area_made = std::filesystem::exists(held_area);
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(root)) left.push_back(entry.path().filename().string());
  std::filesystem::remove_all(root);
  EXPECT_EQ(result.exit_code, 0) << result.failure;
  const std::string own = held_area + "-pid" + std::to_string(::getpid());
  EXPECT_NE(io.stdout_text().find("area=[" + own + "]"), std::string::npos) << io.stdout_text();
  EXPECT_NE(io.stderr_text().find("is locked by another agent; this one uses " + own), std::string::npos)
      << io.stderr_text();
  EXPECT_FALSE(held_area_made);
  // Only the other agent's lock file is left: this agent removed its own area and lock.
  EXPECT_EQ(left, std::vector<std::string>{"trireme-abc-node1.lock"});
}
