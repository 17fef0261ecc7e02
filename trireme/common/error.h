// Trireme's error hierarchy and check macros.
//
// Library code never prints and never exits: it throws one of these. The CLI turns them
// into a one-line message (what is wrong, and what to do) and a non-zero exit.
//
//   Error             base of everything Trireme throws
//   InvalidArgument   bad flags, layouts, files or values given by the user; not retried
//   CommError         a collective, a peer or the rendezvous failed or timed out;
//                     recoverable: the agent restarts the generation
//   CheckpointCorrupt a snapshot or checkpoint failed verification
//
// TRIREME_CHECK(cond, msg...) throws InvalidArgument with file:line when cond is false;
// TRIREME_CHECK_EQ(a, b, msg...) prints both values. Messages are built from any
// streamable values: TRIREME_CHECK(n > 0, "--steps must be positive, got ", n).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace trireme {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class InvalidArgument : public Error {
 public:
  using Error::Error;
};

class CommError : public Error {
 public:
  using Error::Error;
};

class CheckpointCorrupt : public Error {
 public:
  using Error::Error;
};

// A failure that restarting the workers would only repeat: training diverged (a NaN
// gradient norm), or the ranks disagree on what they train (replicas, corpus). A worker of
// `trireme run` ends with launch::kExitNoRestart on it, and the job is not restarted.
class Unrecoverable : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

}  // namespace trireme

#define TRIREME_THROW(Type, ...) throw ::trireme::Type(::trireme::detail::concat(__VA_ARGS__))

#define TRIREME_CHECK(cond, ...)                                  \
  do {                                                            \
    if (!(cond)) TRIREME_THROW(InvalidArgument, __VA_ARGS__);     \
  } while (0)

// For internal invariants: names the file and line, since a failure is a Trireme bug.
#define TRIREME_ENFORCE_EQ(a, b, ...)                                                    \
  do {                                                                                   \
    const auto& trireme_a_ = (a);                                                        \
    const auto& trireme_b_ = (b);                                                        \
    if (!(trireme_a_ == trireme_b_))                                                     \
      TRIREME_THROW(Error, __FILE__, ":", __LINE__, ": expected ", #a, " == ", #b, " (", \
                    trireme_a_, " vs ", trireme_b_, ") ", ##__VA_ARGS__);                \
  } while (0)
