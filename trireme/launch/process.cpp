// Worker processes and the signal self-pipe: see process.h.
#include "trireme/launch/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "trireme/common/error.h"

namespace trireme::launch {
namespace {

// Write end of the live SignalPipe, or -1. The one piece of global mutable state of the
// launcher: a signal handler has no other way to reach the agent.
volatile sig_atomic_t g_signal_pipe_write_fd = -1;

void on_signal(int signal) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal);
  if (g_signal_pipe_write_fd >= 0) {
    [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe_write_fd, &byte, 1);
  }
  errno = saved_errno;
}

// SIGHUP (the terminal or ssh session went away) and SIGQUIT (Ctrl-\) stop the job like
// SIGINT and SIGTERM: by default they would kill the agent at once, leaving its snapshot
// area in /dev/shm and its workers to PR_SET_PDEATHSIG's SIGKILL, without a grace period.
constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD};

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

void make_pipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0)
    TRIREME_THROW(Error, "cannot create a pipe for a worker: ", std::strerror(errno));
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

constexpr unsigned kCloseRangeCloexec = 1u << 2;  // CLOSE_RANGE_CLOEXEC (linux/close_range.h)
#ifndef SYS_close_range  // (kernel headers before 5.9; the number is the same on every architecture)
#define SYS_close_range 436
#endif

// In the forked child: only async-signal-safe calls until execve. On failure, reports
// errno on report_fd (close-on-exec, so the parent reads EOF on success) and exits 127.
[[noreturn]] void exec_child(pid_t parent, const char* executable, char* const argv[],
                             char* const envp[], int in_fd, int out_fd, int err_fd, int report_fd) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // the agent died before prctl took effect
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (const int sig : kHandledSignals) {  // (one the agent was started ignoring, as under nohup, stays ignored)
    struct sigaction current {};
    ::sigaction(sig, nullptr, &current);
    if (current.sa_handler != SIG_IGN) ::sigaction(sig, &dfl, nullptr);
  }
  ::sigaction(SIGPIPE, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // (/dev/null opened close-on-exec: only its copy as fd 0 reaches the program.)
  const int stdin_fd = in_fd >= 0 ? in_fd : ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (stdin_fd >= 0) ::dup2(stdin_fd, 0);
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  // Nothing else of the agent's reaches the program: a descriptor some library opened
  // without close-on-exec (Gloo's sockets for the snapshot keeper) would otherwise live on
  // in every worker, and standbys live into the next generation.
  if (::syscall(SYS_close_range, 3u, ~0u, kCloseRangeCloexec) != 0) {
    rlimit limit{};
    const rlim_t top = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 ? std::min<rlim_t>(limit.rlim_cur, 1 << 16) : 1024;
    for (int fd = 3; fd < static_cast<int>(top); ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // (before Linux 5.11)
  }
  ::execve(executable, argv, envp);
  const int error = errno;
  [[maybe_unused]] const ssize_t n = ::write(report_fd, &error, sizeof(error));
  ::_exit(127);
}

}  // namespace

std::string find_executable(const std::string& program, const std::string& search_path) {
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos)
    return is_executable_file(program) ? program : "";
  std::size_t start = 0;
  while (start <= search_path.size()) {
    const std::size_t end = std::min(search_path.find(':', start), search_path.size());
    const std::string dir = end > start ? search_path.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + program;
    if (is_executable_file(candidate)) return candidate;
    start = end + 1;
  }
  return "";
}

SpawnedProcess spawn_process(const std::string& executable,
                             const std::vector<std::string>& command,
                             const std::vector<std::string>& env, bool stdin_pipe) {
  TRIREME_CHECK(!command.empty(), "no program to start");
  std::vector<char*> argv = c_strings(command);
  std::vector<char*> envp = c_strings(env);
  int out[2], err[2], report[2], in[2] = {-1, -1};
  if (stdin_pipe) make_pipe(in);
  make_pipe(out);
  make_pipe(err);
  make_pipe(report);
  const pid_t parent = ::getpid();
  // Block the agent's signals across fork: until the child has reset its handlers, a signal
  // delivered to it would run the agent's handler and write to the agent's self-pipe. The
  // child unblocks everything once its handlers are back to the defaults.
  sigset_t handled, previous;
  sigemptyset(&handled);
  for (const int sig : kHandledSignals) sigaddset(&handled, sig);
  ::sigprocmask(SIG_BLOCK, &handled, &previous);
  const pid_t pid = ::fork();
  if (pid == 0)
    exec_child(parent, executable.c_str(), argv.data(), envp.data(), in[0], out[1], err[1],
               report[1]);
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  close_fd(in[0]);
  close_fd(out[1]);
  close_fd(err[1]);
  close_fd(report[1]);
  if (pid < 0) {
    close_fd(in[1]);
    close_fd(out[0]);
    close_fd(err[0]);
    close_fd(report[0]);
    TRIREME_THROW(Error, "cannot start '", command[0], "': ", std::strerror(fork_errno));
  }
  ::setpgid(pid, pid);  // also here, so signals reach the group even before the child runs
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(report[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  close_fd(report[0]);
  if (n > 0) {
    close_fd(in[1]);
    close_fd(out[0]);
    close_fd(err[0]);
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    TRIREME_THROW(Error, "cannot execute '", command[0], "': ", std::strerror(exec_errno));
  }
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  return {pid, out[0], err[0], in[1]};
}

void signal_process_group(pid_t pid, int signal) {
  if (pid > 0 && ::kill(-pid, signal) != 0) ::kill(pid, signal);
}

bool child_ended(pid_t pid, int* status) {
  siginfo_t info{};  // (si_pid stays 0 when nothing has ended)
  int r;
  do {
    r = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
  } while (r < 0 && errno == EINTR);
  if (r != 0 || info.si_pid != pid) return false;
  if (info.si_code == CLD_EXITED)
    *status = (info.si_status & 0xff) << 8;  // as waitpid() has it: WEXITSTATUS
  else
    *status = info.si_status | (info.si_code == CLD_DUMPED ? 0x80 : 0);  // WTERMSIG, WCOREDUMP
  return true;
}

bool reap_within(pid_t pid, std::chrono::milliseconds limit) {
  auto reaped = [pid] {
    pid_t r;
    do {
      r = ::waitpid(pid, nullptr, WNOHANG);
    } while (r < 0 && errno == EINTR);
    return r == pid || (r < 0 && errno == ECHILD);  // ECHILD: someone reaped it already
  };
  if (reaped()) return true;
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return reaped();  // ESRCH: gone between the two calls
  const auto deadline = std::chrono::steady_clock::now() + limit;
  bool ended = false;
  while (!ended) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() < 0) break;
    pollfd p{pidfd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno != EINTR) break;
    ended = n > 0;
  }
  ::close(pidfd);
  return ended ? reaped() : false;
}

struct SignalPipe::Saved {
  struct sigaction handled[sizeof(kHandledSignals) / sizeof(kHandledSignals[0])];
  struct sigaction pipe;
};

SignalPipe::SignalPipe() {
  TRIREME_ENFORCE_EQ(static_cast<int>(g_signal_pipe_write_fd), -1, "one SignalPipe at a time");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
    TRIREME_THROW(Error, "cannot create the signal pipe: ", std::strerror(errno));
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  g_signal_pipe_write_fd = write_fd_;
  saved_ = new Saved;
  struct sigaction action {};
  action.sa_handler = on_signal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (std::size_t i = 0; i < std::size(kHandledSignals); ++i) {
    const int sig = kHandledSignals[i];
    ::sigaction(sig, &action, &saved_->handled[i]);
    // Started with SIGHUP or SIGQUIT ignored (`nohup trireme ...`): they stay ignored, for the
    // agent and its workers, as the user asked.
    if ((sig == SIGHUP || sig == SIGQUIT) && saved_->handled[i].sa_handler == SIG_IGN)
      ::sigaction(sig, &saved_->handled[i], nullptr);
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &saved_->pipe);
}

SignalPipe::~SignalPipe() {
  for (std::size_t i = 0; i < std::size(kHandledSignals); ++i)
    ::sigaction(kHandledSignals[i], &saved_->handled[i], nullptr);
  ::sigaction(SIGPIPE, &saved_->pipe, nullptr);
  delete saved_;
  g_signal_pipe_write_fd = -1;
  ::close(read_fd_);
  ::close(write_fd_);
}

std::vector<int> SignalPipe::drain() {
  std::vector<int> signals;
  unsigned char buffer[64];
  ssize_t n;
  while ((n = ::read(read_fd_, buffer, sizeof(buffer))) > 0)
    signals.insert(signals.end(), buffer, buffer + n);
  return signals;
}

}  // namespace trireme::launch
