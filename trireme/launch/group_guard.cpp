// GroupGuard: see group_guard.h.
#include "trireme/launch/group_guard.h"

#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <initializer_list>

namespace trireme::launch {
namespace {

// One record on the socket: 8 bytes, sent whole (only the agent's one thread sends).
struct Record {
  int32_t op;
  int32_t group;
};
constexpr int32_t kWatch = 1, kForget = 2, kFarewell = 3;
// More than any machine's workers and standbys; beyond it, groups go unguarded.
constexpr int kMaxGroups = 4096;

// The guard's life, in the forked child: async-signal-safe calls only.
[[noreturn]] void guard(int read_fd) {
  // A process group of its own: a signal or a kill -9 to the agent's group (a terminal's
  // Ctrl-C, a scheduler's) does not end the guard before it has done its part.
  ::setpgid(0, 0);
  // Only the socket stays open: the agent's sockets and pipes must close when it dies.
  if (read_fd != 0) {
    ::dup2(read_fd, 0);
    ::close(read_fd);
  }
  if (::syscall(SYS_close_range, 1u, ~0u, 0u) != 0)
    for (int fd = 1; fd < 65536; ++fd) ::close(fd);
  // The terminal's signals reach the agent's process group, the guard with it: the agent
  // stops the workers for those, and the guard waits for its farewell.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2, SIGCHLD})
    ::sigaction(sig, &ignore, nullptr);
  pid_t groups[kMaxGroups];
  int count = 0;
  Record r{};
  while (true) {
    char* at = reinterpret_cast<char*>(&r);
    size_t got = 0;
    while (got < sizeof(r)) {
      const ssize_t n = ::read(0, at + got, sizeof(r) - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {  // the agent died without a farewell: its groups go with it
        for (int i = 0; i < count; ++i) ::kill(-groups[i], SIGKILL);
        ::_exit(0);
      }
      got += static_cast<size_t>(n);
    }
    if (r.op == kFarewell) ::_exit(0);
    if (r.op == kWatch && count < kMaxGroups && r.group > 1) groups[count++] = r.group;
    if (r.op == kForget)
      for (int i = 0; i < count; ++i)
        if (groups[i] == r.group) {
          groups[i] = groups[--count];
          break;
        }
  }
}

}  // namespace

GroupGuard::GroupGuard() {
  int fds[2];  // a socket pair rather than a pipe: a send to a dead guard raises no SIGPIPE
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[1]);
    guard(fds[0]);
  }
  ::close(fds[0]);
  if (pid < 0) {
    ::close(fds[1]);
    return;
  }
  pid_ = pid;
  fd_ = fds[1];
}

GroupGuard::~GroupGuard() {
  if (fd_ < 0) return;
  send(kFarewell, 0);
  ::close(fd_);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

void GroupGuard::watch(pid_t group) { send(kWatch, group); }

void GroupGuard::forget(pid_t group) { send(kForget, group); }

void GroupGuard::send(int op, pid_t group) {
  if (fd_ < 0) return;
  const Record r{op, static_cast<int32_t>(group)};
  ssize_t n;
  do {
    n = ::send(fd_, &r, sizeof(r), MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  // (A guard that died: the groups are no longer guarded; best effort.)
}

}  // namespace trireme::launch
