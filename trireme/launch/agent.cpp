// The node agent's protocol and supervision loop: see agent.h for the steps.
//
// One thread does everything but write the agent's output (launch::OutputWriter, a
// thread of its own, so a slow reader cannot stall it): a poll() over the signal
// self-pipe and every worker's stdout/stderr pipe, with a timeout that brings it back
// every 200 ms to look at the store's failure key. Each wake-up forwards at most one read
// per pipe, so a worker that writes without pause does not hold the loop. Workers that
// ended are found after every wake-up (SIGCHLD wakes the poll; child_ended, which leaves
// them zombies until their process group has been signalled: see stop_workers), and an
// ended worker's pipes are drained before they close, so no output it wrote is lost.
#include "trireme/launch/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "trireme/common/error.h"
#include "trireme/launch/exit_status.h"
#include "trireme/launch/membership.h"
#include "trireme/launch/group_guard.h"
#include "trireme/launch/output.h"
#include "trireme/launch/process.h"
#include "trireme/launch/restart_clock.h"
#include "trireme/launch/standby.h"
#include "trireme/launch/worker_env.h"
#include "trireme/obs/clock.h"

extern char** environ;

namespace trireme::launch {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How often an agent looks for another agent's failure: bounds how late a node notices.
constexpr milliseconds kFailurePollInterval{200};
// Store waits (join, exit barrier) are cut into slices this long so signals are noticed.
constexpr milliseconds kWaitSlice{200};
// After SIGKILL, how long to wait for the kernel to reap a worker before giving up on it.
constexpr milliseconds kKillReapLimit{10000};
// How long a generation runs before the agent starts its standby workers (standby.h):
// long enough that their start does not compete with the generation's own.
constexpr milliseconds kStandbyDelay{1000};
// How often an agent raises its heartbeat in the store (--node-timeout is many of these).
constexpr milliseconds kBeatInterval{200};
// How many members each agent watches while the workers run (watch_nodes): each member is
// watched by as many, so one agent that is slow to look does not hide a loss.
constexpr int kWatchedMembers = 2;
// How often the leader of a restart looks at the members it waits for.
constexpr milliseconds kMembershipPoll{50};
// A worker's output is read kReadSize at a time, one read per stream per wake-up: a worker
// that writes without pause (`yes`) then cannot keep the agent from its signals, heartbeat
// and failure checks. An exited worker's pipes are drained with up to kDrainReads reads:
// 1 MiB, the most a pipe holds (/proc/sys/fs/pipe-max-size); more can come only from a
// child it left behind that goes on writing, which must not hold the agent either.
constexpr int kReadSize = 65536;
constexpr int kDrainReads = 16;

// The wall-clock time (microseconds since the epoch) of a moment of the steady clock:
// what other processes, and machines with synchronised clocks, can compare.
int64_t wall_us(Clock::time_point when) {
  const auto ago = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - when);
  return static_cast<int64_t>(obs::wall_us()) - ago.count();  // (obs's: its test skew too)
}

std::string join_ids(const std::vector<int>& ids) {
  std::string out;
  for (int id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
  return out;
}

std::vector<int> parse_ids(const std::string& text) {
  std::vector<int> ids;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) ids.push_back(std::stoi(item));
  return ids;
}

// keys::restart_members: "IDS;LEADER". The leader's id makes each agent's decision a value
// of its own, so that the compare-and-set that publishes it tells the first from the rest.
std::string members_value(const std::vector<int>& ids, int leader) {
  return join_ids(ids) + ";" + std::to_string(leader);
}

std::vector<int> member_ids(const std::string& value) { return parse_ids(value.substr(0, value.find(';'))); }

bool contains(const std::vector<int>& ids, int id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); }

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

int poll_timeout_ms(Clock::duration d) {
  if (d <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<milliseconds>(d).count();
  return static_cast<int>(std::min<long long>(ms, 60000));
}

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
  return env;
}

std::string new_run_id() {
  std::random_device device;
  std::mt19937_64 rng((static_cast<uint64_t>(device()) << 32) ^ device() ^
                      static_cast<uint64_t>(::getpid()));
  static const char* kHex = "0123456789abcdef";
  std::string id;
  for (uint64_t v = rng(), i = 0; i < 12; ++i, v >>= 4) id += kHex[v & 15];
  return id;
}

// kNodeLost: another member stopped its heartbeat or left; kNodeJoin: a node asks to
// join an elastic job. Both start a new generation like a failed worker does.
enum class Ending {
  kAllExited, kWorkerFailed, kRemoteFailure, kRemoteRestart, kSignal, kStoreLost, kNodeLost, kNodeJoin
};

struct Event {
  Ending ending;
  std::string what;  // the failure, for every ending but kAllExited
  int signal = 0;
  bool silent = false;  // kNodeLost: the member's heartbeat stopped (not a preemption notice)
  bool final = false;   // kWorkerFailed: the worker exited with kExitNoRestart
};

// How long workers get to finish their step when a restart is for a member whose heartbeat
// stopped: their collectives with that machine wait for their own time-out, so the full
// --stop-grace would only delay the restart.
constexpr double kSilentLossGrace = 0.5;

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;  // -1 once reaped (after it ended, in stop_workers)
  int fds[2] = {-1, -1};  // stdout, stderr read ends
  std::optional<LinePrefixer> lines[2];
  bool running = false;
  int go_fd = -1;                         // a standby's activation pipe (standby.h)
  int generation = 0;                     // the generation it was started for
  std::string heartbeat;                  // last value seen ("" before the first)
  Clock::time_point heartbeat_changed{};  // when it last changed
};

class Agent {
 public:
  Agent(const LaunchOptions& options, AgentChannel& channel, const StoreAddress& store,
        const AgentIo& io, SnapshotKeeper* keeper)
      : options_(options), channel_(channel), store_(store), io_(io), out_(output_, io.stdout_fd),
        err_(output_, io.stderr_fd),
        keeper_(keeper) {}
  ~Agent();

  LaunchResult run();

 private:
  // Whether this agent's process hosts the store (node 0, unless it runs apart).
  bool is_host() const { return options_.node_rank == 0 && !options_.external_store; }
  std::string node() const { return "node " + std::to_string(options_.node_rank); }
  std::string rdzv() const { return store_.host + ":" + std::to_string(store_.port); }
  std::string worker_name(const Worker& w) const;
  int global_rank(int local) const { return position_ * options_.nproc_per_node + local; }

  std::optional<LaunchResult> join();
  std::optional<LaunchResult> join_running();
  LaunchResult withdraw(LaunchResult result, bool counted);
  Worker start_worker(int local, int generation, bool standby);
  std::optional<Event> spawn_workers(int restart);
  void spawn_standby(int generation);
  void end_standby();
  void leave_behind(pid_t pid, const std::string& who, const std::string& then);
  void stop_protecting();
  void forget_and_reap(pid_t pid);
  std::optional<LaunchResult> restart_generation(int generation, const Event& cause);
  std::optional<LaunchResult> signalled_in_restart();
  std::optional<LaunchResult> decide_members(int generation, const std::vector<int>& lost_leaders = {});
  std::optional<LaunchResult> await_members(int generation);
  // The longest a member may take to stop its workers and flush its snapshots before it
  // checks in to a restart: the workers' grace, SIGKILL's reap limit and, with a snapshot
  // keeper, a leaver's flush.
  double stopping_allowance_s() const {
    return options_.stop_grace_s + (keeper_ ? options_.preemption_grace_s : 0.0) +
           std::chrono::duration<double>(kKillReapLimit).count();
  }
  // How long a restart's leader waits for the members to check in: --join-timeout after
  // stopping_allowance_s() (its followers wait that much longer for its decision).
  double restart_wait_s() const { return options_.join_timeout_s + stopping_allowance_s(); }
  std::optional<LaunchResult> take_members(int generation, const std::string& members);
  std::optional<LaunchResult> await_recovery(int generation);
  void enter(int generation, const std::vector<int>& members);
  LaunchResult leave(const Event& event);
  void await_leavers_flush();
  KeeperGeneration keeper_generation() const;
  void make_snapshot_dir();
  void remove_snapshot_dir();
  Event supervise();
  std::optional<Event> watch_nodes();
  Event finished_or_restarted();
  LaunchResult finish(const Event& event);
  LaunchResult finish_success();

  void stop_workers(double grace_s);
  void check_heartbeats();
  void report_restart();
  void remove_old_rank_dirs();
  void beat();
  bool stale(int node, Clock::time_point now);
  // Node `node`'s incarnation (keys::left): how often it was dropped from the job so far.
  int64_t incarnation(int node) { return channel_.add(keys::lost(node), 0); }
  // Publishes `what` as the job's failure unless one came first (the first stands: the
  // cause, not its consequences); returns the job's failure, `what` when the store is gone.
  std::string publish_failure(const std::string& what);
  std::string published_job_failure();
  LaunchResult signalled_while_restarting();
  void mark_done();
  // Whether the job's failure is published (the job ends for every agent).
  bool job_failed();
  // On the node hosting the store (after mark_done): keeps the store up while the other
  // agents read why the job ended and stop their workers, until all are done (bounded), or
  // a second stopping signal.
  void hold_store();
  // Waits for key until deadline while noticing signals and, with watch_failure, a
  // failure published meanwhile (kept in published_failure_).
  enum class WaitEnd { kSet, kTimeout, kSignal, kFailure };
  WaitEnd wait_key(const std::string& key, Clock::time_point deadline, bool watch_failure);
  // The end of a restart's wait by a signal, or by another node's failure (kSignal, kFailure).
  LaunchResult stopped_while_restarting(WaitEnd end);

  void pump(Clock::duration timeout);
  // Runs fn on a thread of its own while this one goes on pumping (heartbeat, output,
  // signals): the keeper's calls may wait on other machines for seconds.
  void while_pumping(const std::function<void()>& fn);
  void take_signals();
  // Forwards what `stream` of w holds, at most max_reads reads of kReadSize (stopping early
  // when the pipe is empty); closes the stream at its end.
  void forward(Worker& w, int stream, int max_reads);
  void close_stream(Worker& w, int stream);
  void reap();
  bool any_running() const;

  const LaunchOptions& options_;
  AgentChannel& channel_;
  StoreAddress store_;
  AgentIo io_;
  OutputWriter output_;          // io_'s streams, written on a thread of its own
  OutputStream out_, err_;
  GroupGuard guard_;             // kills the workers' process groups if this agent is killed
  std::vector<pid_t> left_behind_;  // workers of earlier generations that SIGKILL did not end
  SnapshotKeeper* keeper_;       // machine-level snapshot redundancy, or null
  SignalPipe signals_;
  std::vector<Worker> workers_;
  std::vector<Worker> standby_;  // the next generation's workers, loaded and waiting
  std::vector<int> standby_members_;  // the membership the standbys were started for
  Clock::time_point generation_start_{};
  std::string run_id_ = "none";
  int generation_ = 0;        // restarts so far: TORCHELASTIC_RESTART_COUNT of the workers
  std::vector<int> members_;  // node ids of this generation, ascending
  int position_ = 0;          // this node's index in members_
  int64_t beats_ = 0;         // this agent's heartbeat counter
  Clock::time_point next_beat_{};
  // Other agents' heartbeats: the last value seen and when it last changed.
  std::map<int, std::pair<std::string, Clock::time_point>> peer_beats_;
  std::map<int, int64_t> incarnations_;  // the watched members' incarnations (watch_nodes)
  int64_t pending_seen_ = 0;  // join requests already acted on
  // The last restart's timeline, reported once its first step is done (report_restart).
  Clock::time_point failure_seen_{}, members_decided_{}, recovered_{};
  bool restart_unreported_ = false;
  // After a change of membership: the rank directories of the old numbering in the
  // snapshot area are removed once this generation's workers have loaded (stepped).
  bool old_rank_dirs_ = false;
  std::string snapshot_dir_;  // TRIREME_SNAPSHOT_DIR, empty when none could be made
  int area_lock_fd_ = -1;     // holds a lock on snapshot_dir_ + ".lock" while this agent lives
  bool protecting_ = false;   // keeper_ started for the current generation, not yet stopped
  std::thread sweeper_;       // removes dead agents' snapshot areas (make_snapshot_dir)
  int first_signal_ = 0;     // the first stopping signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT), 0 if none
  int signal_count_ = 0;     // all stopping signals received
  std::string first_failure_;  // the first worker that failed on its own
  bool first_failure_final_ = false;  // it exited with kExitNoRestart
  bool stopping_ = false;      // workers dying now are ones we are stopping
  std::string published_failure_;  // what kFailure held when we last looked
  // A member lost at the recovery barrier of the last restart (await_recovery): run()
  // restarts again without it instead of starting workers.
  std::optional<Event> lost_at_barrier_;
};

Agent::~Agent() {
  end_standby();
  for (auto& w : workers_) {
    if (w.running) {
      signal_process_group(w.pid, SIGKILL);
      // Never block here: a worker stuck in the kernel is left to init to reap.
      int status = 0;
      if (child_ended(w.pid, &status)) forget_and_reap(w.pid);
    } else if (w.pid > 0) {
      forget_and_reap(w.pid);  // it ended; reap() left it a zombie
    }
    close_stream(w, 0);
    close_stream(w, 1);
  }
  remove_snapshot_dir();  // (again, after run() did: also when an exception ends it)
  if (sweeper_.joinable()) sweeper_.join();
}

std::string Agent::worker_name(const Worker& w) const {
  std::string role;
  try {
    role = channel_.try_get(keys::role(w.rank)).value_or("");
  } catch (const Error&) {
    // The store is gone; the name without the role still identifies the worker.
  }
  return "rank " + std::to_string(w.rank) + " (" + node() + ", local " +
         std::to_string(w.local_rank) + (role.empty() ? "" : ", " + role) + ")";
}

LaunchResult Agent::run() {
  if (auto refused = join()) return *refused;
  make_snapshot_dir();
  while (true) {
    // A member lost at the last restart's recovery barrier: restart again without it, as
    // for a member lost while the workers run (or end the job when no restart is left).
    const std::optional<Event> lost = std::exchange(lost_at_barrier_, std::nullopt);
    std::optional<Event> failed;
    if (!lost) {
      if (keeper_ && !snapshot_dir_.empty()) {
        keeper_->start(keeper_generation());
        protecting_ = true;
      }
      failed = spawn_workers(generation_);
    }
    Event event = lost ? *lost : failed ? *failed : supervise();
    if (event.ending == Ending::kSignal && event.signal == SIGTERM && elastic(options_) && !is_host()) {
      end_standby();
      LaunchResult result = leave(event);
      remove_snapshot_dir();
      return result;
    }
    if (event.ending == Ending::kAllExited && elastic(options_)) event = finished_or_restarted();
    await_leavers_flush();
    stop_protecting();
    const bool restartable = (event.ending == Ending::kWorkerFailed && !failed && !event.final) ||
                             event.ending == Ending::kRemoteRestart || event.ending == Ending::kNodeLost ||
                             event.ending == Ending::kNodeJoin;
    if (restartable && generation_ < options_.max_restarts) {
      std::optional<LaunchResult> refused;
      try {
        refused = restart_generation(generation_ + 1, event);
      } catch (const CommError& e) {  // the store went away in the middle of the restart
        refused = LaunchResult{1, "lost the rendezvous store at " + rdzv() + " while restarting (" + e.what() +
                                      "): the job ended on another node, or the machine hosting the store was lost"};
      }
      if (refused) {
        end_standby();
        // The job ended (a node dropped from it, or leaving, publishes no failure): as in
        // finish(), node 0 keeps the store up while the others read why.
        if (job_failed()) {
          mark_done();
          hold_store();
        }
        remove_snapshot_dir();
        return *refused;
      }
      continue;
    }
    if (failed && options_.max_restarts > 0)  // (a restart would start it the same way)
      event.what += "; the worker could not be started, so the job was not restarted";
    else if (event.final && options_.max_restarts > 0)
      event.what += " (kExitNoRestart: a restart would repeat it), so the job was not restarted";
    else if (event.ending == Ending::kWorkerFailed && options_.max_restarts > 0)
      event.what += "; gave up after " + std::to_string(generation_) + " restart" + (generation_ == 1 ? "" : "s") +
                    " (--max-restarts " + std::to_string(options_.max_restarts) + ")";
    if (event.ending == Ending::kRemoteRestart) event.ending = Ending::kRemoteFailure;
    if (event.ending == Ending::kNodeLost) event.ending = Ending::kWorkerFailed;  // published as the job's failure
    end_standby();
    if (keeper_ && !keeper_->summary().empty())
      err_.write("trireme run: " + node() + ": " + keeper_->summary() + "\n");
    LaunchResult result = finish(event);
    remove_snapshot_dir();
    return result;
  }
}

// This node's workers all finished. Another agent may have begun to restart the generation
// for a joiner a moment before (they could not see it yet): the first agent to finish
// decides from the claims made before it (keys::generation_end) and publishes that; claims
// after it are ignored by their makers. So no agent waits for a finish while another waits
// for a restart for a join. (Not arbitrated: a restart for a failure or a lost member. A
// node whose workers finished marks itself done and exits; one still running does not
// count it lost, and a restart it leads ends the job naming it finished.)
Event Agent::finished_or_restarted() {
  const Event finished{Ending::kAllExited, ""};
  const Event restarted{Ending::kRemoteRestart, "a node asks to join (seen on another node before the workers here "
                                                "finished)"};
  try {
    const int64_t v = channel_.add(keys::generation_end(generation_), keys::kFinished);
    const std::string decision_key = keys::generation_end(generation_) + "/decision";
    if (v / keys::kFinished == 1) {  // the first to finish
      const bool restart = v % keys::kFinished != 0;
      channel_.set(decision_key, restart ? "restart" : "finish");
      return restart ? restarted : finished;
    }
    if (wait_key(decision_key, Clock::now() + seconds(options_.join_timeout_s), false) != WaitEnd::kSet)
      return finished;
    return channel_.try_get(decision_key) == "restart" ? restarted : finished;
  } catch (const Error&) {
    return finished;  // the store is gone: the job is over
  }
}

// A member leaving on a preemption notice flushes its last snapshot step into the
// redundancy first (leave()), which needs every keeper's rounds: keep ours running until it
// says it is done, it goes silent, or its grace period is over.
void Agent::await_leavers_flush() {
  if (!keeper_) return;
  const auto deadline = Clock::now() + seconds(options_.preemption_grace_s);
  for (int id : members_) {
    if (id == options_.node_rank) continue;
    try {
      const int64_t its = incarnation(id);
      if (!channel_.try_get(keys::left(id, its))) continue;
      while (!channel_.try_get(keys::flushed(id, its)) && !stale(id, Clock::now()) && Clock::now() < deadline)
        pump(kMembershipPoll);
    } catch (const Error&) {
      return;  // the store is gone: nothing to wait for
    }
  }
}

KeeperGeneration Agent::keeper_generation() const {
  KeeperGeneration g;
  g.generation = generation_;
  g.members = members_;
  g.position = position_;
  for (int local = 0; local < options_.nproc_per_node; ++local) g.local_ranks.push_back(global_rank(local));
  g.area = snapshot_dir_;
  g.store_host = store_.host;
  g.store_port = store_.port;
  return g;
}

// A new generation: every agent stops its workers (a worker failed here, another agent
// asked, a member was lost or left, a node asks to join) and checks in; the first to
// check in leads: it waits until each member of the old generation has checked in, left
// or gone silent for --node-timeout, adds the nodes waiting to join (up to --nnodes MAX),
// and publishes the new membership. (A leader that goes silent itself is replaced: see
// await_members.) Survivors then rebuild what the lost machines held
// (SnapshotKeeper::recover), all meet at a barrier, and start their workers, which
// resume from their snapshots (TORCHELASTIC_RESTART_COUNT tells them it is a restart).
// Returns the job's result when that fails (a signal, a failure, too few nodes, time-out).
std::optional<LaunchResult> Agent::restart_generation(int generation, const Event& cause) {
  failure_seen_ = Clock::now();
  bool silent = cause.silent;
  try {
    if (silent) channel_.set(keys::restart_silent(generation), "1");
    // The first agent to claim the restart (an atomic add: two may see failures at once)
    // names its cause and when it saw it. A later one still announces the restart when
    // it is not announced yet: the first may have died between its claim and its set.
    if (cause.ending != Ending::kRemoteRestart) {
      if (channel_.add(keys::restart_claimed(generation), 1) == 1) {
        channel_.set(keys::restart_seen(generation), format_stamp(wall_us(failure_seen_), options_.node_rank));
        channel_.set(keys::restart(generation), cause.what);
      } else if (!channel_.try_get(keys::restart(generation))) {
        channel_.set(keys::restart(generation), cause.what);
      }
    }
    silent = silent || channel_.try_get(keys::restart_silent(generation)).has_value();
  } catch (const Error& e) {
    stop_workers(options_.stop_grace_s);
    return LaunchResult{1, "lost the rendezvous store at " + rdzv() + " (" + e.what() + ")"};
  }
  stop_workers(silent ? std::min(options_.stop_grace_s, kSilentLossGrace) : options_.stop_grace_s);
  reap();
  if (auto stopped = signalled_in_restart()) return stopped;
  const auto ready = std::count_if(standby_.begin(), standby_.end(),
                                   [&](const Worker& w) { return w.running && w.generation == generation; });
  err_.write("trireme run: " + cause.what + "; restarting the workers (restart " +
             std::to_string(generation) + " of " + std::to_string(options_.max_restarts) + ")" +
             (ready ? ", " + std::to_string(ready) + " from standby" : std::string()) + "\n");
  for (auto& w : workers_) {
    close_stream(w, 0);
    close_stream(w, 1);
    // One that SIGKILL did not end (stuck in the kernel) starts beside the next generation.
    if (w.running)
      leave_behind(w.pid, worker_name(w) + " (pid " + std::to_string(w.pid) + ")", "the restart goes on beside it");
  }
  workers_.clear();
  first_failure_.clear();
  first_failure_final_ = false;
  stopping_ = false;
  try {
    channel_.set(keys::restart_in(generation, options_.node_rank), "1");
    if (channel_.add(keys::restart_stopped(generation), 1) == 1) {
      channel_.set(keys::restart_lead(generation, 0), std::to_string(options_.node_rank));
      if (auto refused = decide_members(generation)) return refused;
    }
  } catch (const Error& e) {
    return LaunchResult{1, "lost the rendezvous store at " + rdzv() + " (" + e.what() + ")"};
  }
  if (auto refused = await_members(generation)) return refused;
  // (A signal that came while the keys its waits looked for were already set.)
  return signalled_in_restart();
}

// A stopping signal received during a restart ends it here, not once the next generation's
// workers have started: SIGTERM to an agent of an elastic job is a preemption notice (it
// leaves, as it does while the workers run); any other signal ends the job. This holds
// before the agent checks in and once it has taken the new membership; a signal between
// the two (the leader deciding, a follower waiting for the decision) ends the job whatever
// it is: see signalled_while_restarting.
std::optional<LaunchResult> Agent::signalled_in_restart() {
  pump(Clock::duration::zero());
  if (!first_signal_) return std::nullopt;
  if (first_signal_ == SIGTERM && elastic(options_) && !is_host()) return leave({Ending::kSignal, "", SIGTERM});
  return signalled_while_restarting();
}

// Waits for the membership of restart `generation` (bounded by --join-timeout), then
// enters it. The agent leading the decision can die with its machine in the middle of the
// restart (two spot machines reclaimed seconds apart): when its heartbeat has not changed
// for --node-timeout, the first waiting member to claim the next attempt
// (keys::restart_lead) leads instead, counting the leaders before it lost. An attempt
// claimed but not yet named (its claimer died between the two) gets as long, from when
// this agent first saw the claim.
std::optional<LaunchResult> Agent::await_members(int generation) {
  // As long as the leader waits for the members to check in, counted from when the leader
  // may begin (it may itself take the stopping allowance to check in): a member slower to
  // stop than --join-timeout (3 nodes or more) does not make this one give up first and
  // end the job. A leader that takes over starts its wait anew, and so does the deadline.
  const double wait_s = restart_wait_s() + stopping_allowance_s();
  auto deadline = Clock::now() + seconds(wait_s);
  int attempt = 0;  // the attempt at deciding that this agent follows
  auto followed_since = Clock::now();
  while (true) {
    const WaitEnd end = wait_key(keys::restart_members(generation),
                                 std::min(deadline, Clock::now() + kFailurePollInterval), /*watch_failure=*/true);
    switch (end) {
      case WaitEnd::kSet:
        return take_members(generation, channel_.try_get(keys::restart_members(generation)).value_or(""));
      case WaitEnd::kSignal:
      case WaitEnd::kFailure:
        return stopped_while_restarting(end);
      case WaitEnd::kTimeout:
        break;
    }
    if (Clock::now() >= deadline) {
      const std::string failure = "timed out waiting for the membership of restart " + std::to_string(generation) +
                                  " (" + seconds_text(wait_s) + " s after its " +
                                  (attempt > 0 ? "last leader took over)" : "leader began)");
      publish_failure(failure);
      return LaunchResult{1, failure};
    }
    // Another member has claimed a later attempt (its leader went silent too): follow that.
    for (; channel_.add(keys::restart_lead_claimed(generation, attempt + 1), 0) > 0; ++attempt) {
      followed_since = Clock::now();
      deadline = std::max(deadline, followed_since + seconds(wait_s));
    }
    const std::optional<std::string> named = channel_.try_get(keys::restart_lead(generation, attempt));
    const int leader = named ? std::stoi(*named) : -1;
    const bool silent = named ? leader != options_.node_rank && stale(leader, Clock::now())
                              : Clock::now() - followed_since >= seconds(options_.node_timeout_s);
    if (!silent || channel_.add(keys::restart_lead_claimed(generation, attempt + 1), 1) != 1) continue;
    channel_.set(keys::restart_lead(generation, attempt + 1), std::to_string(options_.node_rank));
    std::vector<int> lost_leaders;
    for (int a = 0; a <= attempt; ++a) {
      const int id = std::stoi(channel_.try_get(keys::restart_lead(generation, a)).value_or("-1"));
      if (id >= 0 && id != options_.node_rank && !contains(lost_leaders, id)) lost_leaders.push_back(id);
    }
    err_.write("trireme run: " +
               (named ? "node " + *named + ", leading restart " + std::to_string(generation) + ","
                      : "the agent leading restart " + std::to_string(generation)) +
               " went silent; " + node() + " decides the membership instead\n");
    if (auto refused = decide_members(generation, lost_leaders)) return refused;
  }
}

// The leader's part of a restart (see restart_generation). lost_leaders: agents that led
// the decision before this one and went silent (await_members); they are lost although
// they checked in.
std::optional<LaunchResult> Agent::decide_members(int generation, const std::vector<int>& lost_leaders) {
  std::map<int, NodeState> states;
  std::vector<int> waiting;  // old members not yet checked in, left or lost
  for (int id : members_) {
    if (contains(lost_leaders, id))
      states[id] = NodeState::kLost;
    else
      waiting.push_back(id);
  }
  std::vector<int> ended;  // old members whose agent is ending (keys::done)
  const auto now = Clock::now();
  for (int id = 0; id < options_.nnodes; ++id) {  // nodes asking to join (or admitted by a leader before this one)
    const std::string request = channel_.try_get(keys::pending(id)).value_or("");
    if (!contains(members_, id) && (request == run_id_ || request == keys::admitted(generation))) waiting.push_back(id);
  }
  // (A member's heartbeat keeps the age supervise() saw: its silence counts from then.)
  for (int id : waiting) peer_beats_.emplace(id, std::make_pair(channel_.try_get(keys::alive(id)).value_or(""), now));
  // A member that beats on but never checks in (its agent stuck) is waited for as long as
  // the followers wait for the decision (restart_wait_s).
  const double stopping_s = stopping_allowance_s();
  const auto deadline = now + seconds(restart_wait_s());
  while (!waiting.empty()) {
    for (auto it = waiting.begin(); it != waiting.end();) {
      const int id = *it;
      const bool joiner = !contains(members_, id);
      if (!joiner && channel_.try_get(keys::restart_in(generation, id))) {
        states[id] = NodeState::kCheckedIn;
      } else if (!joiner && channel_.try_get(keys::left(id, incarnation(id)))) {
        states[id] = NodeState::kLeft;
      } else if (!joiner && channel_.try_get(keys::done(id))) {
        // It will not check in: it beats on (node 0 keeps the store up) or, finished, exited.
        ended.push_back(id);
      } else if (stale(id, Clock::now())) {
        states[id] = NodeState::kLost;
      } else if (joiner && peer_beats_[id].second > now) {
        states[id] = NodeState::kJoining;  // its heartbeat went on: alive and waiting
      } else {
        ++it;
        continue;
      }
      it = waiting.erase(it);
    }
    if (waiting.empty()) break;
    pump(kMembershipPoll);
    if (first_signal_)
      return signalled_while_restarting();
    if (auto failure = channel_.try_get(keys::kFailure)) {  // a follower gave up, or a worker failed
      published_failure_ = *failure;
      return stopped_while_restarting(WaitEnd::kFailure);
    }
    if (Clock::now() >= deadline) {
      const std::string failure = "node" + std::string(waiting.size() > 1 ? "s " : " ") + join_ids(waiting) +
                                  " did not check in to restart " + std::to_string(generation) + " within " +
                                  seconds_text(stopping_s) + " s of stopping and --join-timeout " +
                                  std::to_string(options_.join_timeout_s) + " s (alive, but not stopping its workers)";
      publish_failure(failure);
      return LaunchResult{1, failure};
    }
  }
  // A leader taken for lost meanwhile (a stall longer than --node-timeout, not a death)
  // decides too. The decision is published in one compare-and-set, so the first stands and
  // the others follow it (await_members); a leader dying before it leaves nothing behind
  // that would hold the next one back.
  const auto publish = [&](const std::vector<int>& ids) {
    const std::string mine = members_value(ids, options_.node_rank);
    return channel_.compare_set(keys::restart_members(generation), "", mine) == mine;
  };
  if (!ended.empty()) {
    const std::string failure =
        channel_.try_get(keys::kFailure)
            .value_or(channel_.try_get(keys::restart(generation)).value_or("a worker failed") + "; node" +
                      (ended.size() > 1 ? "s " : " ") + join_ids(ended) +
                      " had already finished (its workers exited), so the job cannot restart");
    if (!publish({})) return std::nullopt;
    publish_failure(failure);
    return LaunchResult{1, failure};
  }
  // A joiner is admitted by one compare-and-set of its request, which its giving up
  // (join_running) races: whichever comes first stands, so a node that gave up is never a
  // member, and one admitted keeps its --node-rank (it is lost at the recovery barrier if it
  // went anyway). Leaders deciding the same generation admit with the same value.
  const std::string admitted = keys::admitted(generation);
  for (auto it = states.begin(); it != states.end();) {
    if (it->second == NodeState::kJoining &&
        channel_.compare_set(keys::pending(it->first), run_id_, admitted) != admitted)
      it = states.erase(it);  // withdrawn
    else
      ++it;
  }
  const MembershipDecision d = decide_membership(members_, states, min_nodes(options_), options_.nnodes,
                                                 elastic(options_), options_.node_timeout_s);
  if (!d.failure.empty()) {
    if (!publish({})) return std::nullopt;
    for (int id : d.dropped) channel_.add(keys::lost(id), 1);
    publish_failure(d.failure);
    return LaunchResult{1, d.failure};
  }
  const int64_t decided_us = wall_us(Clock::now());
  if (!publish(d.members)) return std::nullopt;
  // Only the published decision's leader: read by workers after the recovery barrier,
  // which this agent reaches after these, and by joiners, which step past a generation
  // whose membership leaves them out. (The dropped nodes' lost/N: take_members.)
  channel_.set(keys::kGeneration, std::to_string(generation));
  channel_.set(keys::restart_decided(generation), format_stamp(decided_us, options_.node_rank));
  if (!d.why_dropped.empty())
    err_.write("trireme run: " + d.why_dropped + "; going on with nodes " + join_ids(d.members) + "\n");
  return std::nullopt;
}

// Enters generation `generation` with the published membership: survivors rebuild what
// lost machines held, then everyone waits for the others at the recovery barrier.
std::optional<LaunchResult> Agent::take_members(int generation, const std::string& published) {
  members_decided_ = Clock::now();
  const std::vector<int> next = member_ids(published);
  if (next.empty()) return LaunchResult{1, published_job_failure()};
  if (!contains(next, options_.node_rank)) {
    return LaunchResult{1, node() + " was dropped from the job at restart " + std::to_string(generation) +
                               " (its heartbeat stalled for --node-timeout " + seconds_text(options_.node_timeout_s) +
                               " s); raise --node-timeout on a loaded machine"};
  }
  // A dropped member's lost/N is raised once per restart, by whichever agent taking the
  // membership gets there first: the leader may die right after publishing it, and a
  // replacement under that --node-rank is admitted only once lost/N is raised.
  for (int id : members_)
    if (!contains(next, id) &&
        channel_.compare_set(keys::restart_dropped(generation, id), "", node()) == node())
      channel_.add(keys::lost(id), 1);
  const KeeperGeneration previous = keeper_generation();
  const bool changed = next != members_;
  enter(generation, next);
  old_rank_dirs_ = changed && !snapshot_dir_.empty();
  if (changed && keeper_ && !snapshot_dir_.empty()) {
    KeeperRecovery recovery;
    while_pumping([&] { recovery = keeper_->recover(previous, keeper_generation()); });
    if (!recovery.message.empty()) err_.write("trireme run: " + recovery.message + "\n");
  }
  return await_recovery(generation);
}

// Becomes a member of generation `generation` (which includes this node).
void Agent::enter(int generation, const std::vector<int>& members) {
  generation_ = generation;
  members_ = members;
  position_ = static_cast<int>(std::find(members.begin(), members.end(), options_.node_rank) - members.begin());
  peer_beats_.clear();
  incarnations_.clear();
}

// The recovery barrier of restart `generation`. A member that dies before it gets there
// (the leader, say, right after deciding) would hold the others until --join-timeout:
// once its heartbeat has not changed for --node-timeout, this agent leaves the barrier
// with lost_at_barrier_ set, and run() restarts again without it.
std::optional<LaunchResult> Agent::await_recovery(int generation) {
  if (channel_.add(keys::restart_recovered(generation), 1) == static_cast<int64_t>(members_.size()))
    channel_.set(keys::restart_resume(generation), format_stamp(wall_us(Clock::now()), options_.node_rank));
  const auto deadline = Clock::now() + std::chrono::seconds(options_.join_timeout_s);
  while (true) {
    const WaitEnd end = wait_key(keys::restart_resume(generation),
                                 std::min(deadline, Clock::now() + kFailurePollInterval), /*watch_failure=*/true);
    switch (end) {
      case WaitEnd::kSet:
        recovered_ = Clock::now();
        // This machine's clock at the opening, for the workers' report (restart_clock.h).
        channel_.set(keys::restart_clock(generation, options_.node_rank), std::to_string(wall_us(recovered_)));
        restart_unreported_ = position_ == 0 && failure_seen_ != Clock::time_point{};
        return std::nullopt;
      case WaitEnd::kSignal:
      case WaitEnd::kFailure:
        return stopped_while_restarting(end);
      case WaitEnd::kTimeout:
        break;
    }
    if (Clock::now() >= deadline) break;
    for (int id : members_)
      if (id != options_.node_rank && stale(id, Clock::now())) {  // (also one that arrived, then died)
        lost_at_barrier_ = Event{Ending::kNodeLost,
                                 lost_node(id, options_.node_timeout_s) + " before restart " +
                                     std::to_string(generation) + " had recovered",
                                 0, true};
        return std::nullopt;
      }
  }
  const std::string failure = "timed out after " + std::to_string(options_.join_timeout_s) +
                              " s waiting for the other agents to recover their snapshots for restart " +
                              std::to_string(generation);
  publish_failure(failure);
  return LaunchResult{1, failure};
}

// SIGTERM to an agent of an elastic job: a spot preemption notice. Announce the leave
// first (the others re-form without waiting for --node-timeout), give the workers
// --grace-seconds to finish their step and commit its snapshot, flush that step into the
// redundancy (SnapshotKeeper::flush: a shard only this machine held is then rebuilt by
// the others), and go.
LaunchResult Agent::leave(const Event& event) {
  err_.write("trireme run: " + node() + " received " + signal_name(event.signal) +
             " (preemption notice): stopping its workers and leaving the job\n");
  int64_t its = 0;
  try {
    its = incarnation(options_.node_rank);
    channel_.set(keys::left(options_.node_rank, its), "1");
  } catch (const Error&) {
    // The store is gone: the others notice that by themselves.
  }
  const auto start = Clock::now();
  stop_workers(options_.preemption_grace_s);
  // The workers committed their last step: have it protected before this machine goes
  // (a step whose state only this machine held would otherwise be lost).
  if (protecting_) {
    const double left_s = options_.preemption_grace_s - std::chrono::duration<double>(Clock::now() - start).count();
    bool flushed = false;
    while_pumping([&] { flushed = keeper_->flush(std::max(0.0, left_s)); });
    if (!flushed) err_.write("trireme run: " + node() + ": its last snapshot step could not be "
                             "protected within --grace-seconds; the others resume from an older one\n");
    stop_protecting();
  } else if (keeper_ && !snapshot_dir_.empty()) {  // (a notice in the middle of a restart, which stopped it)
    err_.write("trireme run: " + node() + ": the restart had stopped the snapshots' protection; the others resume "
               "from the last step it protected\n");
  }
  try {
    channel_.set(keys::flushed(options_.node_rank, its), "1");
  } catch (const Error&) {
  }
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  char line[160];
  std::snprintf(line, sizeof line, "%s left the job %.1f s after the notice (grace %g s)", node().c_str(), took,
                options_.preemption_grace_s);
  err_.write("trireme run: " + std::string(line) + "\n");
  return {0, ""};
}

namespace {

// Opens and locks `lock_path` (flock, exclusive); the descriptor, or -1 when another
// process holds the lock for a second (or the file cannot be opened).
int lock_area(const std::string& lock_path) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    struct stat held {}, named {};
    // (A sweeper may hold it for a moment, and unlink it: then lock the new file.)
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &held) == 0 && ::stat(lock_path.c_str(), &named) == 0 &&
        held.st_ino == named.st_ino && held.st_dev == named.st_dev)
      return fd;
    ::close(fd);
    std::this_thread::sleep_for(milliseconds(10));
  }
  return -1;
}

}  // namespace

// The node's snapshot area: a directory in shared memory (tmpfs), owned by this agent so
// that it outlives the workers, removed when the job ends; and the areas of agents that
// died without removing theirs are removed here.
void Agent::make_snapshot_dir() {
  const char* root = std::getenv("TRIREME_SNAPSHOT_ROOT");  // where the areas go; tests isolate them
  const std::string base = root && *root ? root : std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
  // Named here, created by the first worker that snapshots: an agent killed before any
  // snapshot (kill -9 leaves it no chance to clean up) leaves nothing behind.
  snapshot_dir_ = base + "/trireme-" + run_id_ + "-node" + std::to_string(options_.node_rank);
  if (::access(base.c_str(), W_OK) != 0) {
    snapshot_dir_.clear();  // workers fall back to disk
    return;
  }
  // An agent killed with -9 (or by the OOM killer) cannot remove its area, and the areas of
  // such agents would fill shared memory job after job. Each agent holds a lock on
  // AREA.lock while it lives; one starting removes the areas whose lock nobody holds.
  std::string lock_path = snapshot_dir_ + ".lock";
  area_lock_fd_ = lock_area(lock_path);
  if (area_lock_fd_ < 0) {
    // Another agent holds it (a stalled one of this node that a replacement took over
    // from): sharing the area, its cleanup (remove_snapshot_dir) would delete this one's
    // snapshots. An area of this agent's own (empty, as a replacement's is) keeps every
    // node of the job with an area, which the workers' resume collectives and the keepers'
    // exchange take for granted: a node without one would call other collectives.
    const std::string own = snapshot_dir_ + "-pid" + std::to_string(::getpid());
    area_lock_fd_ = lock_area(own + ".lock");
    err_.write("trireme run: " + node() + ": the snapshot area " + snapshot_dir_ + " is locked by another agent; " +
               (area_lock_fd_ >= 0 ? "this one uses " + own : "and " + own + " cannot be locked: the workers snapshot to disk") +
               "\n");
    snapshot_dir_ = area_lock_fd_ >= 0 ? own : "";
    lock_path = own + ".lock";
  }
  // On a thread of its own: removing a dead job's hundreds of GB takes longer than a
  // heartbeat may wait.
  if (sweeper_.joinable()) sweeper_.join();
  sweeper_ = std::thread([base, lock_path] {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(base, ec)) {
      const std::string path = entry.path().string(), name = entry.path().filename().string();
      if (name.rfind("trireme-", 0) != 0 || name.size() < 5 || name.compare(name.size() - 5, 5, ".lock") != 0 ||
          path == lock_path)
        continue;
      const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) continue;
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {  // its agent is gone
        std::error_code ignored;
        std::filesystem::remove_all(path.substr(0, path.size() - 5), ignored);
        ::unlink(path.c_str());
      }
      ::close(fd);
    }
  });
}

void Agent::remove_snapshot_dir() {
  std::error_code ec;
  if (!snapshot_dir_.empty()) std::filesystem::remove_all(snapshot_dir_, ec);
  if (area_lock_fd_ >= 0) {
    ::unlink((snapshot_dir_ + ".lock").c_str());
    ::close(area_lock_fd_);
    area_lock_fd_ = -1;
  }
}

// ---- step 1: join ------------------------------------------------------------------------

std::optional<LaunchResult> Agent::join() {
  // A `trireme store` serves one job: the keys of a job that ended (its failure, the agents
  // done, its run id and node slots) would mislead the next. (A job whose agents were all
  // killed leaves neither of the first two: its node slots refuse the next job's agents.)
  if (options_.external_store && (channel_.try_get(keys::kFailure) || channel_.add(keys::kDone, 0) > 0))
    return LaunchResult{1, "the rendezvous store at " + rdzv() + " already served a job, which has ended; start a "
                               "fresh `trireme store` for each job"};
  if (is_host() || (options_.external_store && channel_.add(keys::kRunIdClaim, 1) == 1)) {
    run_id_ = new_run_id();
    channel_.set(keys::kRunId, run_id_);
  }
  // A --node-rank is taken once per time that node was dropped from the job: a replacement
  // for a lost (or preempted) machine joins under its id.
  if (channel_.add(keys::node(options_.node_rank), 1) > incarnation(options_.node_rank) + 1)
    return withdraw({1, "another agent already joined the rendezvous at " + rdzv() + " as --node-rank " +
                            std::to_string(options_.node_rank) +
                            "; give every node its own --node-rank (a replacement may take a lost node's once the "
                            "job has dropped it, after --node-timeout)" +
                            (options_.external_store ? ", or start a fresh `trireme store` if it served an earlier job"
                                                     : "")},
                    /*counted=*/false);
  // Every place taken already: the job runs, and this node is a replacement or came back.
  if (!is_host() && channel_.add(keys::kJoined, 0) >= options_.nnodes) return join_running();
  if (options_.before_founding) {
    try {
      options_.before_founding();
    } catch (...) {
      withdraw({}, /*counted=*/false);
      throw;
    }
  }
  const int64_t joined = channel_.add(keys::kJoined, 1);
  if (joined == options_.nnodes) channel_.set(keys::kReady, "1");
  const auto deadline = Clock::now() + std::chrono::seconds(options_.join_timeout_s);
  switch (wait_key(keys::kReady, deadline, /*watch_failure=*/true)) {
    case WaitEnd::kSet:
      break;
    case WaitEnd::kSignal:
      return withdraw({128 + first_signal_, "received " + signal_name(first_signal_) +
                                                " while waiting for the other agents to join"},
                      /*counted=*/true);
    case WaitEnd::kFailure:
      return withdraw({1, published_failure_ + "; " + node() + " did not start its workers"}, /*counted=*/true);
    case WaitEnd::kTimeout:
      return withdraw({1, "timed out after " + std::to_string(options_.join_timeout_s) +
                              " s waiting for the other agents: " + std::to_string(channel_.add(keys::kJoined, 0)) +
                              " of " + std::to_string(options_.nnodes) + " joined the rendezvous at " + rdzv() +
                              "; start 'trireme run --nnodes " + std::to_string(options_.nnodes) +
                              " --node-rank R --rdzv " + rdzv() +
                              " ...' on the missing nodes, or raise --join-timeout"},
                      /*counted=*/true);
  }
  if (run_id_ == "none") {
    // With a store of its own the agent that claimed the run id may not have set it yet.
    if (options_.external_store) channel_.wait_for(keys::kRunId, std::chrono::seconds(options_.join_timeout_s));
    run_id_ = channel_.try_get(keys::kRunId).value_or("none");
  }
  for (int id = 0; id < options_.nnodes; ++id) members_.push_back(id);
  position_ = options_.node_rank;
  return std::nullopt;
}

// An agent that ends before it is a member gives back what join() took: its --node-rank
// (a retry under it would be refused for ever) and, with `counted`, its place in `joined`
// while the job has not formed (a retry would be counted twice, and the job would start
// without a node). Once `ready` is set the others count this node in, and lose it after
// --node-timeout; the last join can still cross this check, which ends the same way.
LaunchResult Agent::withdraw(LaunchResult result, bool counted) {
  try {
    channel_.add(keys::node(options_.node_rank), -1);
    if (counted && !channel_.try_get(keys::kReady)) channel_.add(keys::kJoined, -1);
  } catch (const Error&) {
    // The store is gone: there is no job left to join.
  }
  return result;
}

// A node that arrives while the job runs (a replacement, or one that came back) asks to
// join and waits for a generation that takes it: the running agents start one as soon as
// they see the request, while the job has fewer than --nnodes MAX nodes.
std::optional<LaunchResult> Agent::join_running() {
  if (!elastic(options_))
    return withdraw({1, "the job at " + rdzv() + " is already running with its " + std::to_string(options_.nnodes) +
                            " nodes; a node can join a running job only when it was started with --nnodes MIN:MAX"},
                    /*counted=*/false);
  run_id_ = channel_.try_get(keys::kRunId).value_or("none");
  const std::string request = keys::pending(options_.node_rank);
  channel_.set(request, run_id_);
  channel_.add(keys::kPending, 1);
  err_.write("trireme run: " + node() + " asks to join the running job at " + rdzv() + "\n");
  int generation = std::stoi(channel_.try_get(keys::kGeneration).value_or("0")) + 1;
  auto deadline = Clock::now() + std::chrono::seconds(options_.join_timeout_s);
  // A node that gives up withdraws its request (a later restart's leader would otherwise
  // wait for it as a joiner until --node-timeout), by compare-and-set, which a leader's
  // admission races (decide_members). True when withdrawn; false when a leader admitted it
  // and the published membership takes it, or (unless `final`) is still to come. An
  // admission whose membership left it out (another leader's decision stood) or, when
  // `final`, never came is withdrawn from.
  const auto withdraw_request = [&](bool final) {
    try {
      std::string expected = run_id_;
      for (int attempt = 0; attempt < 8; ++attempt) {
        const std::string now = channel_.compare_set(request, expected, "");
        if (now.empty()) return true;
        if (const int at = keys::admitted_at(now)) {
          const auto published = channel_.try_get(keys::restart_members(at));
          if (published ? contains(member_ids(*published), options_.node_rank) : !final) return false;
        }
        expected = now;
      }
      return true;
    } catch (const Error&) {
      return true;  // the store is gone: there is no job to join
    }
  };
  // ... and its --node-rank, unless a membership takes it: the job then counts it a member,
  // finds it lost at the recovery barrier, and a replacement may take the --node-rank then.
  const auto give_up = [&](LaunchResult result) {
    if (!withdraw_request(/*final=*/true)) return result;
    return withdraw(std::move(result), /*counted=*/false);
  };
  bool waited_for_admission = false;
  while (true) {
    WaitEnd end;
    try {
      end = wait_key(keys::restart_members(generation), deadline, /*watch_failure=*/true);
    } catch (const CommError&) {
      return LaunchResult{1, "the rendezvous store at " + rdzv() + " went away while " + node() +
                                 " waited to join: the job has finished, or the machine hosting the store was "
                                 "lost; " + node() + " did not join"};
    }
    switch (end) {
      case WaitEnd::kSet:
        break;
      case WaitEnd::kSignal:
        return give_up({128 + first_signal_, "received " + signal_name(first_signal_) + " while waiting to join"});
      case WaitEnd::kFailure:
        return give_up({1, published_failure_ + "; " + node() + " did not join"});
      case WaitEnd::kTimeout:
        // Admitted just now: the membership that takes it follows (within one more
        // --join-timeout, or the leader died and no other took over).
        if (!withdraw_request(/*final=*/waited_for_admission)) {
          waited_for_admission = true;
          deadline = Clock::now() + std::chrono::seconds(options_.join_timeout_s);
          continue;
        }
        return withdraw({1, "timed out after " + std::to_string(options_.join_timeout_s) +
                               " s waiting for the running job to take " + node() +
                               " (it has --nnodes MAX nodes already, has no --max-restarts left, or it "
                               "finished)"},
                        /*counted=*/false);
    }
    const std::vector<int> members = member_ids(channel_.try_get(keys::restart_members(generation)).value_or(""));
    if (members.empty()) return give_up({1, published_job_failure() + "; " + node() + " did not join"});
    // Admitted by a leader whose decision did not stand: ask again.
    if (!contains(members, options_.node_rank) && channel_.try_get(request) == keys::admitted(generation) &&
        channel_.compare_set(request, keys::admitted(generation), run_id_) == run_id_)
      channel_.add(keys::kPending, 1);
    if (contains(members, options_.node_rank)) {
      channel_.set(request, "");
      enter(generation, members);
      if (auto refused = await_recovery(generation)) return refused;
      if (lost_at_barrier_) return std::nullopt;  // a member: run() restarts without the lost one
      err_.write("trireme run: " + node() + " joined the job at restart " + std::to_string(generation) +
                 " (nodes " + join_ids(members) + ")\n");
      return std::nullopt;
    }
    ++generation;
  }
}

// ---- step 2: spawn -----------------------------------------------------------------------

// Starts local worker `local` of generation `generation` (a standby when `standby`: it
// waits in await_activation() for one byte on its stdin). Throws Error naming the
// program when it cannot be executed.
Worker Agent::start_worker(int local, int generation, bool standby) {
  const char* path = std::getenv("PATH");
  const std::string& program = options_.command.front();
  const std::string executable = find_executable(program, path ? path : "/usr/bin:/bin");
  TRIREME_CHECK(!executable.empty(), "cannot execute '", program, "': no such executable file (or not on PATH)");
  JobInfo job{store_.host, store_.port, run_id_, generation, ::isatty(io_.stderr_fd) == 1, snapshot_dir_};
  job.node_position = position_;
  job.nodes = static_cast<int>(members_.size());
  std::vector<std::string> env = worker_environment(current_environment(), options_, local, job);
  if (standby) env.push_back(std::string(kStandbyEnv) + "=1");
  const SpawnedProcess p = spawn_process(executable, options_.command, env, /*stdin_pipe=*/standby);
  guard_.watch(p.pid);
  Worker w;
  w.local_rank = local;
  w.rank = global_rank(local);
  w.generation = generation;
  w.pid = p.pid;
  w.fds[0] = p.stdout_fd;
  w.fds[1] = p.stderr_fd;
  w.go_fd = p.stdin_fd;
  w.lines[0].emplace(rank_prefix(w.rank));
  w.lines[1].emplace(rank_prefix(w.rank));
  w.running = true;
  return w;
}

std::optional<Event> Agent::spawn_workers(int restart) {
  generation_start_ = Clock::now();
  for (int local = 0; local < options_.nproc_per_node; ++local) {
    // A standby started for this generation becomes the worker: one byte on its stdin.
    // (Only when the membership is the one it was started for: its rank depends on it.)
    auto ready = std::find_if(standby_.begin(), standby_.end(), [&](const Worker& s) {
      return s.running && s.local_rank == local && s.generation == restart && standby_members_ == members_;
    });
    if (ready != standby_.end()) {
      const char go = 1;
      if (::write(ready->go_fd, &go, 1) == 1) {
        ::close(ready->go_fd);
        ready->go_fd = -1;
        workers_.push_back(std::move(*ready));
        standby_.erase(ready);
        continue;
      }
    }
    try {
      workers_.push_back(start_worker(local, restart, /*standby=*/false));
    } catch (const Error& e) {
      Worker named;  // worker_name() needs only the ranks
      named.local_rank = local;
      named.rank = global_rank(local);
      return Event{Ending::kWorkerFailed, worker_name(named) + ": " + e.what()};
    }
  }
  end_standby();  // any left over were for another generation
  return std::nullopt;
}

// Starts generation `generation`'s workers ahead of time, waiting in await_activation().
// Best effort: a standby that cannot start leaves that worker to be started on restart.
void Agent::spawn_standby(int generation) {
  standby_members_ = members_;
  for (int local = 0; local < options_.nproc_per_node; ++local) {
    try {
      standby_.push_back(start_worker(local, generation, /*standby=*/true));
    } catch (const Error&) {
      // started fresh on restart instead, where a failure is reported
    }
  }
}

// Closes the standby workers' activation pipes, kills them and reaps them, with what they
// wrote last: all against one kKillReapLimit, the heartbeat going on meanwhile. (Taken out
// of standby_ first: reap() would report them as dying before they were needed.)
void Agent::end_standby() {
  std::vector<Worker> ending = std::exchange(standby_, {});
  for (auto& w : ending) {
    if (w.go_fd >= 0) ::close(w.go_fd);
    w.go_fd = -1;
    for (int s = 0; s < 2; ++s) forward(w, s, kDrainReads);
    if (w.running) signal_process_group(w.pid, SIGKILL);
  }
  const auto kill_end = Clock::now() + kKillReapLimit;
  while (true) {
    for (auto& w : ending) {
      int status = 0;
      if (!w.running || !child_ended(w.pid, &status)) continue;
      forget_and_reap(w.pid);
      w.running = false;
    }
    const bool all_ended = std::none_of(ending.begin(), ending.end(), [](const Worker& w) { return w.running; });
    if (all_ended || Clock::now() >= kill_end) break;
    pump(kMembershipPoll);
  }
  for (auto& w : ending) {
    for (int s = 0; s < 2; ++s) {
      forward(w, s, kDrainReads);
      close_stream(w, s);
    }
    if (w.running) leave_behind(w.pid, node() + ": standby worker " + std::to_string(w.pid), "left behind");
  }
}

// ---- step 3: supervise -------------------------------------------------------------------

Event Agent::supervise() {
  auto next_check = Clock::now();
  while (true) {
    pump(next_check - Clock::now());
    if (first_signal_) return {Ending::kSignal, "", first_signal_};
    if (!first_failure_.empty()) return {Ending::kWorkerFailed, first_failure_, 0, false, first_failure_final_};
    if (!any_running()) return {Ending::kAllExited, ""};
    if (Clock::now() < next_check) continue;
    next_check = Clock::now() + kFailurePollInterval;
    if (options_.standby && standby_.empty() && generation_ < options_.max_restarts &&
        Clock::now() - generation_start_ >= kStandbyDelay)
      spawn_standby(generation_ + 1);
    try {
      if (auto failure = channel_.try_get(keys::kFailure))
        return {Ending::kRemoteFailure, *failure};
      if (options_.max_restarts > generation_)
        if (auto cause = channel_.try_get(keys::restart(generation_ + 1)))
          return {Ending::kRemoteRestart, *cause + " (on another node)"};
      if (options_.heartbeat_timeout_s > 0) check_heartbeats();
      if (restart_unreported_) report_restart();
      if (old_rank_dirs_) remove_old_rank_dirs();
      if (auto event = watch_nodes()) return *event;
    } catch (const Error& e) {
      return {Ending::kStoreLost, e.what()};
    }
  }
}

// The watched members' heartbeats and leave notices, and join requests: a member that
// left or went silent for --node-timeout is lost with its machine (its workers may hang
// the others' collectives until their time-out: this does not wait for that).
//
// An agent watches only the kWatchedMembers members after it in the ring of members
// (ascending node ids, wrapping) that have not finished, so the store serves a constant
// number of reads per agent and poll, O(n) for n machines, not O(n^2) as when every agent
// read every member's keys. One watcher's loss restarts the job for all (restart/G, or the
// job's failure when no restart is left). Whatever set of members is lost at once, one of
// them has a live watcher just before it in the ring (unless no member lives), and the
// restart's leader then waits on every old member (decide_members), so the other losses
// are found there.
std::optional<Event> Agent::watch_nodes() {
  const auto now = Clock::now();
  const int n = static_cast<int>(members_.size());
  int watched = 0;
  for (int step = 1; step < n && watched < kWatchedMembers; ++step) {
    const int id = members_[(position_ + step) % n];
    // (A member's incarnation changes only when it is dropped: once per generation.)
    auto its = incarnations_.find(id);
    if (its == incarnations_.end()) its = incarnations_.emplace(id, incarnation(id)).first;
    if (channel_.try_get(keys::left(id, its->second)))
      return Event{Ending::kNodeLost, "node " + std::to_string(id) + " left the job (preemption notice)"};
    // A member whose agent has finished (its workers exited) is done, not lost: it stops
    // its heartbeat when it exits, while the workers here finish (rank 0 may write its
    // traces long after the others are gone), and it watches nobody any more: the next
    // member is watched in its place.
    if (channel_.try_get(keys::done(id))) continue;
    if (stale(id, now)) return Event{Ending::kNodeLost, lost_node(id, options_.node_timeout_s), 0, true};
    ++watched;
  }
  // (Not once a worker has finished: the job is ending, a new generation would redo
  // nothing; nor without a restart left: the joiner waits until its --join-timeout.)
  const bool all_running =
      std::all_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; });
  if (elastic(options_) && static_cast<int>(members_.size()) < options_.nnodes && all_running &&
      generation_ < options_.max_restarts) {
    const int64_t requests = channel_.add(keys::kPending, 0);
    if (requests > pending_seen_) {
      pending_seen_ = requests;
      for (int id = 0; id < options_.nnodes; ++id)
        if (!contains(members_, id) && channel_.try_get(keys::pending(id)).value_or("") == run_id_) {
          // Not when another node's workers have already finished: the job is ending there.
          if (channel_.add(keys::generation_end(generation_), 1) >= keys::kFinished) return std::nullopt;
          return Event{Ending::kNodeJoin, "node " + std::to_string(id) + " asks to join"};
        }
    }
  }
  return std::nullopt;
}

// Whether `node`'s heartbeat has not changed for --node-timeout (first seen: not stale).
bool Agent::stale(int node, Clock::time_point now) {
  const std::string beat = channel_.try_get(keys::alive(node)).value_or("");
  auto it = peer_beats_.find(node);
  if (it == peer_beats_.end() || it->second.first != beat) {
    peer_beats_[node] = {beat, now};
    return false;
  }
  return now - it->second.second >= seconds(options_.node_timeout_s);
}

// Raises this agent's heartbeat, at most every kBeatInterval.
void Agent::beat() {
  const auto now = Clock::now();
  if (now < next_beat_) return;
  next_beat_ = now + kBeatInterval;
  try {
    channel_.set(keys::alive(options_.node_rank), std::to_string(++beats_));
  } catch (const Error&) {
    // The store is gone: supervision notices on its next look.
  }
}

void Agent::while_pumping(const std::function<void()>& fn) {
  std::atomic<bool> done{false};
  std::thread thread([&] {
    fn();
    done = true;
  });
  while (!done) pump(kMembershipPoll);
  thread.join();
}

void Agent::pump(Clock::duration timeout) {
  beat();
  timeout = std::min<Clock::duration>(timeout, kBeatInterval);
  std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
  std::vector<std::pair<Worker*, int>> owners;
  // Standby workers too: one that writes more than its pipe holds while it waits for its
  // activation would block in the write.
  for (auto* group : {&workers_, &standby_})
    for (auto& w : *group) {
      for (int s = 0; s < 2; ++s) {
        if (w.fds[s] < 0) continue;
        fds.push_back({w.fds[s], POLLIN, 0});
        owners.emplace_back(&w, s);
      }
    }
  const int ready = ::poll(fds.data(), fds.size(), poll_timeout_ms(timeout));
  if (ready > 0) {
    if (fds[0].revents) take_signals();
    for (std::size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents) forward(*owners[i - 1].first, owners[i - 1].second, 1);
  }
  reap();
}

void Agent::take_signals() {
  for (const int sig : signals_.drain()) {
    if (sig == SIGCHLD) continue;  // reap() runs after every wake-up
    ++signal_count_;
    if (!first_signal_) first_signal_ = sig;
  }
}

void Agent::forward(Worker& w, int stream, int max_reads) {
  OutputStream& out = stream == 0 ? out_ : err_;
  char buffer[kReadSize];
  for (int reads = 0; w.fds[stream] >= 0 && reads < max_reads;) {
    const ssize_t n = ::read(w.fds[stream], buffer, sizeof(buffer));
    if (n > 0) {
      out.write(w.lines[stream]->feed(std::string_view(buffer, n)));
      ++reads;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return;
    } else {
      close_stream(w, stream);
    }
  }
}

void Agent::close_stream(Worker& w, int stream) {
  if (w.fds[stream] < 0) return;
  (stream == 0 ? out_ : err_).write(w.lines[stream]->finish());
  ::close(w.fds[stream]);
  w.fds[stream] = -1;
}

// A worker (`who`) that SIGKILL did not end within kKillReapLimit (stuck in the kernel):
// said once, with what follows, and reaped by reap() when it ends (its group stays with
// the guard until then).
void Agent::leave_behind(pid_t pid, const std::string& who, const std::string& then) {
  err_.write("trireme run: " + who + " did not end within " + std::to_string(kKillReapLimit.count() / 1000) +
             " s of SIGKILL (stuck in the kernel?); " + then + "\n");
  left_behind_.push_back(pid);
}

// Ends the keeper's rounds for this generation (what they protected stays).
void Agent::stop_protecting() {
  if (keeper_) while_pumping([&] { keeper_->stop(); });
  protecting_ = false;
}

// Reaps an ended child `pid` (seen with child_ended, or its zombie left by reap()), first
// telling the guard to forget its process group: were this agent to die between the two,
// the guard would otherwise kill the group of a pid the kernel may have given another
// process.
void Agent::forget_and_reap(pid_t pid) {
  guard_.forget(pid);
  while (::waitpid(pid, nullptr, WNOHANG) < 0 && errno == EINTR) {
  }
}

void Agent::reap() {
  for (auto it = left_behind_.begin(); it != left_behind_.end();) {
    int status = 0;
    errno = 0;
    if (child_ended(*it, &status)) {
      forget_and_reap(*it);
      it = left_behind_.erase(it);
    } else if (errno == ECHILD) {  // (no longer this agent's child)
      guard_.forget(*it);
      it = left_behind_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& w : standby_) {  // one that died waiting is not used; say why
    int status = 0;
    if (!w.running || !child_ended(w.pid, &status)) continue;
    forget_and_reap(w.pid);
    w.running = false;
    for (int s = 0; s < 2; ++s) {
      forward(w, s, kDrainReads);
      close_stream(w, s);
    }
    err_.write("trireme run: the standby worker for rank " + std::to_string(w.rank) + " " +
               describe_wait_status(status) +
               " before it was needed; a restart will start a new worker\n");
  }
  for (auto& w : workers_) {
    if (!w.running) continue;
    int status = 0;
    if (!child_ended(w.pid, &status)) continue;  // (not reaped: stop_workers does that)
    w.running = false;
    for (int s = 0; s < 2; ++s) {
      forward(w, s, kDrainReads);  // what it wrote before exiting is still in the pipe
      close_stream(w, s);
    }
    if (!stopping_ && !exited_cleanly(status) && first_failure_.empty()) {
      first_failure_ = worker_name(w) + " " + describe_wait_status(status);
      first_failure_final_ = WIFEXITED(status) && WEXITSTATUS(status) == kExitNoRestart;
    }
  }
}

bool Agent::any_running() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; });
}

// A worker whose heartbeat has not changed for --heartbeat-timeout is hung (a deadlock, a
// peer that stopped answering outside any collective): kill it, which makes it the failed
// worker of this generation (and so, with --max-restarts, restarts the job).
void Agent::check_heartbeats() {
  const auto now = Clock::now();
  std::vector<Worker*> stalled;
  const double done_limit_s = std::max(60.0, 10 * options_.heartbeat_timeout_s);
  double limit_s = done_limit_s;  // the shortest limit a stalled worker passed
  for (auto& w : workers_) {
    if (!w.running) continue;
    const auto beat = channel_.try_get(keys::heartbeat(generation_, w.rank));
    if (!beat) continue;  // not watched until its first heartbeat
    // A worker done with its steps writes its results and exits, which makes no progress
    // to beat and may take long on a loaded machine: it gets ten times as long (60 s at
    // least) before it is taken for hung.
    const double limit = *beat == keys::kHeartbeatDone ? done_limit_s : options_.heartbeat_timeout_s;
    if (*beat != w.heartbeat) {
      w.heartbeat = *beat;
      w.heartbeat_changed = now;
    } else if (now - w.heartbeat_changed >= std::chrono::duration<double>(limit)) {
      stalled.push_back(&w);
      limit_s = std::min(limit_s, limit);
    }
  }
  if (stalled.empty() || !first_failure_.empty()) return;
  // A hang stalls its peers too (they wait in a collective): name every stalled worker.
  const std::string after = seconds_text(limit_s);
  std::string names, beats;
  for (const Worker* w : stalled) {
    names += (names.empty() ? "" : "; ") + worker_name(*w);
    beats += (beats.empty() ? "" : ", ") + w->heartbeat;
  }
  first_failure_ = names + (stalled.size() == 1 ? " made" : " all made") + " no progress for " + after +
                   " s (heartbeat" + (stalled.size() == 1 ? "" : "s") + " stuck at " + beats + "); killed as hung";
  for (Worker* w : stalled) signal_process_group(w->pid, SIGKILL);
}

// Once the first worker of this node has beaten its heartbeat in a restarted generation
// (it finished a step; a "done" beat does not count), one line: how long the restart took
// from the failure, and where; unless a worker reports it itself (restart/G/reported).
void Agent::report_restart() {
  const auto beat = channel_.try_get(keys::heartbeat(generation_, global_rank(0)));
  if (!beat || *beat == keys::kHeartbeatDone) return;  // no step yet (or none to make)
  restart_unreported_ = false;
  if (channel_.try_get(keys::restart_reported(generation_))) return;  // a worker says it, more exactly
  const auto secs = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  char line[320];
  std::snprintf(line, sizeof line,
                "restart %d: first step done %.2f s after the failure was seen (membership %.2f s, snapshot "
                "recovery %.2f s, workers resuming and their first step %.2f s)",
                generation_, secs(Clock::now() - failure_seen_), secs(members_decided_ - failure_seen_),
                secs(recovered_ - members_decided_), secs(Clock::now() - recovered_));
  err_.write("trireme run: " + std::string(line) + "\n");
}

// Once every local worker of this generation has finished a step (so has loaded its
// state), the snapshot area's rank directories of other numberings go: they hold a
// previous generation's snapshots (three slots each) that nothing reads any more.
void Agent::remove_old_rank_dirs() {
  for (int local = 0; local < options_.nproc_per_node; ++local)
    if (!channel_.try_get(keys::heartbeat(generation_, global_rank(local)))) return;
  old_rank_dirs_ = false;
  std::vector<std::string> mine;
  for (int local = 0; local < options_.nproc_per_node; ++local)
    mine.push_back("rank-" + std::to_string(global_rank(local)));
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(snapshot_dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank-", 0) == 0 && std::find(mine.begin(), mine.end(), name) == mine.end())
      std::filesystem::remove_all(entry.path(), ec);
  }
}

// SIGTERM to every worker's process group; SIGKILL to those left after the grace period,
// or at once when a second stopping signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) has arrived,
// before the stop or during it: the first one, arriving during a stop for a failure (a
// scheduler's scancel, say), leaves the workers their grace.
// A worker that already exited may have left children in its process group (a shell's
// background job, a launcher's child): they get the same signals through the group. That
// is safe because reap() leaves an exited worker a zombie (child_ended): its pid, the
// group's id, cannot be another process's yet. Exited workers are reaped here once their
// groups have been signalled, and never signalled again.
void Agent::stop_workers(double grace_s) {
  stopping_ = true;
  const auto signal_all = [&](int signal) {
    for (auto& w : workers_) signal_process_group(w.pid, signal);  // (ignores pid -1: reaped)
  };
  signal_all(SIGTERM);
  const auto grace_end = Clock::now() + seconds(grace_s);
  const auto hurried = [&] { return signal_count_ >= 2; };
  while (any_running() && Clock::now() < grace_end && !hurried())
    pump(grace_end - Clock::now());
  signal_all(SIGKILL);
  const auto kill_end = Clock::now() + kKillReapLimit;
  while (any_running() && Clock::now() < kill_end) pump(kill_end - Clock::now());
  for (auto& w : workers_) {
    if (w.running || w.pid < 0) continue;
    forget_and_reap(w.pid);
    w.pid = -1;
  }
}

// ---- step 4: finish ----------------------------------------------------------------------

std::string Agent::publish_failure(const std::string& what) {
  try {
    return channel_.compare_set(keys::kFailure, "", what);
  } catch (const Error&) {
    return what;  // The store is gone: the other agents notice that by themselves.
  }
}

// Why the job ends, for an agent that found an empty membership: its leader sets
// keys::kFailure right after publishing it.
std::string Agent::published_job_failure() {
  constexpr milliseconds kLeaderWrites{2000};  // a few store round trips, with room for a loaded machine
  try {
    if (channel_.wait_for(keys::kFailure, kLeaderWrites)) return channel_.try_get(keys::kFailure).value_or("");
  } catch (const Error&) {
    // The store is gone: say what is known.
  }
  return "too few nodes left to restart the job";
}

// A signal in the middle of a restart, after this agent checked in and before it has the
// new membership: the others would count this node in and wait for it at the next barrier
// until --join-timeout; the job ends now, saying why. (A preemption notice in that window
// ends an elastic job instead of re-forming it without this node: rare, and bounded.)
LaunchResult Agent::signalled_while_restarting() {
  publish_failure(node() + "'s agent received " + signal_name(first_signal_) + " while restarting");
  return LaunchResult{128 + first_signal_, "received " + signal_name(first_signal_) + " while restarting"};
}

LaunchResult Agent::stopped_while_restarting(WaitEnd end) {
  if (end == WaitEnd::kSignal) return signalled_while_restarting();
  return LaunchResult{1, published_failure_ + "; " + node() + " did not restart its workers"};
}

void Agent::mark_done() {
  try {
    channel_.set(keys::done(options_.node_rank), "1");
    if (channel_.add(keys::kDone, 1) >= static_cast<int64_t>(members_.size())) channel_.set(keys::kAllDone, "1");
  } catch (const Error&) {
    // The store is gone: nobody waits for us any more.
  }
}

Agent::WaitEnd Agent::wait_key(const std::string& key, Clock::time_point deadline,
                               bool watch_failure) {
  while (true) {
    const auto left = deadline - Clock::now();
    const auto slice = std::min<Clock::duration>(kWaitSlice, std::max(left, Clock::duration{}));
    if (channel_.wait_for(key, std::chrono::duration_cast<milliseconds>(slice)))
      return WaitEnd::kSet;
    pump(Clock::duration::zero());
    if (first_signal_) return WaitEnd::kSignal;
    if (watch_failure) {
      if (auto failure = channel_.try_get(keys::kFailure)) {
        published_failure_ = *failure;
        return WaitEnd::kFailure;
      }
    }
    if (Clock::now() >= deadline) return WaitEnd::kTimeout;
  }
}

LaunchResult Agent::finish(const Event& event) {
  if (event.ending == Ending::kAllExited) return finish_success();
  LaunchResult result{1, ""};
  switch (event.ending) {
    case Ending::kWorkerFailed:
      // A worker here may fail because of another node's failure (its collective lost a
      // peer) before this agent read it: the job's first failure is then named too.
      if (const std::string first = publish_failure(event.what); first != event.what)
        result.failure = event.what + ", after the job's first failure: " + first + "; stopped the other workers";
      else
        result.failure = event.what + "; stopped the other workers";
      break;
    case Ending::kRemoteFailure:
    case Ending::kRemoteRestart:
      result.failure = event.what + "; stopped the workers of " + node();
      break;
    case Ending::kSignal:
      publish_failure(node() + "'s agent received " + signal_name(event.signal));
      result = {128 + event.signal,
                "received " + signal_name(event.signal) + "; stopped the workers of " + node()};
      break;
    case Ending::kStoreLost:
      result.failure = "lost the rendezvous store at " + rdzv() + " (" + event.what +
                       "); stopped the workers of " + node();
      break;
    case Ending::kAllExited:
    case Ending::kNodeLost:  // run() turned it into kWorkerFailed
    case Ending::kNodeJoin:  // raised only while a restart is left (watch_nodes)
      break;
  }
  stop_workers(options_.stop_grace_s);
  if (event.ending == Ending::kStoreLost) return result;
  mark_done();
  hold_store();
  return result;
}

bool Agent::job_failed() {
  try {
    return channel_.try_get(keys::kFailure).has_value();
  } catch (const Error&) {
    return false;  // the store is gone: nobody reads this agent's keys any more
  }
}

void Agent::hold_store() {
  if (!is_host()) return;
  // A first stopping signal (perhaps the one that ended the job) does not cut this short:
  // the others would report a lost store instead of the failure.
  // Nor is a member lost (its heartbeat stopped for --node-timeout) waited for.
  const auto deadline = Clock::now() + seconds(2 * options_.stop_grace_s + 10);
  const auto others_running = [&] {
    for (int id : members_)
      if (id != options_.node_rank && !channel_.try_get(keys::done(id)) && !stale(id, Clock::now())) return true;
    return false;
  };
  try {
    while (!channel_.wait_for(keys::kAllDone, kWaitSlice) && Clock::now() < deadline && signal_count_ < 2 &&
           others_running())
      pump(Clock::duration::zero());
  } catch (const Error&) {
    // Our own store failed: there is nobody left to wait for.
  }
}

LaunchResult Agent::finish_success() {
  mark_done();
  if (!is_host()) return {0, ""};
  const auto deadline = Clock::now() + seconds(options_.exit_barrier_timeout_s);
  switch (wait_key(keys::kAllDone, deadline, /*watch_failure=*/true)) {
    case WaitEnd::kSet:
      return {0, ""};
    case WaitEnd::kSignal:
      return {128 + first_signal_, "received " + signal_name(first_signal_) +
                                       " while waiting for the other agents to finish"};
    case WaitEnd::kFailure:
      return {1, published_failure_ + " (the workers of " + node() + " had finished)"};
    case WaitEnd::kTimeout:
      break;
  }
  int64_t done = 0;
  try {
    done = channel_.add(keys::kDone, 0);
  } catch (const Error&) {
  }
  return {1, "timed out after " + std::to_string(static_cast<int>(options_.exit_barrier_timeout_s)) +
                 " s waiting for the other agents to finish (" + std::to_string(done) + " of " +
                 std::to_string(members_.size()) + " done); closing the rendezvous store"};
}

}  // namespace

LaunchResult run_agent(const LaunchOptions& options, AgentChannel& channel,
                       const StoreAddress& store, const AgentIo& io, SnapshotKeeper* keeper) {
  Agent agent(options, channel, store, io, keeper);
  return agent.run();
}

}  // namespace trireme::launch
