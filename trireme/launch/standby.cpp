// The worker's side of the standby handshake; see standby.h.
#include "trireme/launch/standby.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace trireme::launch {

bool awaiting_activation() {
  const char* value = std::getenv(kStandbyEnv);
  return value && std::strcmp(value, "1") == 0;
}

void await_activation() {
  if (!awaiting_activation()) return;
  char go = 0;
  ssize_t n;
  do {
    n = ::read(STDIN_FILENO, &go, 1);
  } while (n < 0 && errno == EINTR);
  if (n != 1) std::_Exit(0);  // EOF: the job ended or restarted without needing us
  ::unsetenv(kStandbyEnv);
}

}  // namespace trireme::launch
