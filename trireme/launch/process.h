// Starting and signalling worker processes, and the agent's signal self-pipe.
//
// A worker runs in its own process group (so a signal reaches it and anything it
// started), with stdin from /dev/null (or the standby handshake pipe), stdout and stderr
// on pipes read by the agent, and PR_SET_PDEATHSIG=SIGKILL so that a killed agent
// (kill -9) leaves no orphan behind. (That reaches the worker alone; the processes it
// starts are killed with its group by the agent's guard, launch/group_guard.h.)
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace trireme::launch {

struct SpawnedProcess {
  pid_t pid = -1;     // also the id of its process group
  int stdout_fd = -1; // read ends, non-blocking, close-on-exec; the caller closes them
  int stderr_fd = -1;
  int stdin_fd = -1;  // with stdin_pipe: the write end of the child's stdin (close-on-exec)
};

// The path execve() should run for `program`: itself when it contains '/', else the
// first executable match in the ':'-separated search_path. "" when there is none.
std::string find_executable(const std::string& program, const std::string& search_path);

// Starts command (command[0] already resolved by find_executable) with exactly env, and
// stdin from /dev/null, or with stdin_pipe from a pipe the caller writes (launch/standby.h).
// Throws Error naming the program when it cannot be executed.
SpawnedProcess spawn_process(const std::string& executable,
                             const std::vector<std::string>& command,
                             const std::vector<std::string>& env, bool stdin_pipe = false);

// Sends signal to the process group of a spawned process (ignores ones already gone).
void signal_process_group(pid_t pid, int signal);

// Whether child `pid` has ended, without reaping it (waitid with WNOWAIT); *status gets
// its waitpid() status. Until the caller reaps it (waitpid), its zombie keeps the pid, and
// so the id of the process group it leads, from being given to another process: the
// group can still be signalled safely (what it left behind in it).
bool child_ended(pid_t pid, int* status);

// Waits at most `limit` for child `pid` to end and reaps it; true when it was reaped.
// A child stuck in the kernel (uninterruptible sleep) outlives even SIGKILL: the caller
// then leaves it behind instead of blocking for ever. Waits on a pidfd, no polling.
bool reap_within(pid_t pid, std::chrono::milliseconds limit);

// SignalPipe turns SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGCHLD into bytes (the signal
// number) on a pipe that the agent polls together with the worker pipes (the self-pipe
// trick), and ignores SIGPIPE. The write end lives in the only mutable global of the
// launcher, because a signal handler can reach nothing else; at most one SignalPipe exists
// at a time. The previous handlers come back when it is destroyed.
class SignalPipe {
 public:
  SignalPipe();
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int fd() const { return read_fd_; }
  // The signals received since the last call, in order (empties the pipe).
  std::vector<int> drain();

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
  struct Saved;
  Saved* saved_ = nullptr;
};

}  // namespace trireme::launch
