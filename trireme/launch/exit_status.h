// Words for how a worker ended, from its waitpid() status:
//   "exited with code 3", "was killed by signal 9 (SIGKILL)".
#pragma once

#include <string>

namespace trireme::launch {

// "SIGKILL" for 9; "signal 64" style text for numbers without a common name.
std::string signal_name(int signal);

// Describes a waitpid() status as a phrase that follows "rank 1 ".
std::string describe_wait_status(int status);

// True when the status is a normal exit with code 0.
bool exited_cleanly(int status);

}  // namespace trireme::launch
