// GroupGuard: the workers' process groups die with the agent, whatever kills it.
//
// PR_SET_PDEATHSIG (launch/process.h) kills a worker when its agent dies, but only the
// worker itself: the setting is cleared in the processes it starts (a shell's command, a
// launcher's children), which would outlive a kill -9 of the agent, holding their ports
// and GPUs. So the agent forks, as it starts, a small guard process (in a process group
// of its own) that holds one end of a socket pair; the agent tells it of each process
// group it starts and of each it has stopped and reaped. When the socket ends without the
// agent's farewell (the agent died),
// the guard SIGKILLs every group it was told of and exits; after the farewell it exits
// killing nothing.
//
// The guard is forked from a process that may have threads: until it exits it makes only
// async-signal-safe calls (read, kill, close, sigaction, _exit) on memory of its own stack.
#pragma once

#include <sys/types.h>

namespace trireme::launch {

class GroupGuard {
 public:
  // Forks the guard. Without one (fork failed) the groups are not guarded: best effort.
  GroupGuard();
  // The farewell: the guard exits killing nothing, and is reaped.
  ~GroupGuard();
  GroupGuard(const GroupGuard&) = delete;
  GroupGuard& operator=(const GroupGuard&) = delete;

  // Group `group` (a worker's pid) is to be killed if the agent dies.
  void watch(pid_t group);
  // Group `group` is stopped and its leader reaped: its id may be given to another
  // process, which the guard must then leave alone.
  void forget(pid_t group);

  pid_t pid() const { return pid_; }

 private:
  void send(int op, pid_t group);

  pid_t pid_ = -1;
  int fd_ = -1;  // the agent's end of the guard's socket pair (close-on-exec)
};

}  // namespace trireme::launch
