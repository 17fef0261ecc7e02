// One monotonic clock for every timestamp Trireme records (timelines, step statistics), in
// microseconds since an arbitrary process-wide origin. Steady, so never goes backwards.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdlib>

namespace trireme::obs {

inline double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

// A test seam: TRIREME_TEST_CLOCK_SKEW_US=D moves this process's wall clock D microseconds
// ahead, as on a machine whose clock is off (agents on one host emulating machines).
inline double test_clock_skew_us() {
  static const double skew = [] {
    const char* text = std::getenv("TRIREME_TEST_CLOCK_SKEW_US");
    return text ? std::strtod(text, nullptr) : 0.0;
  }();
  return skew;
}

// Wall-clock microseconds since the Unix epoch: comparable across processes on one
// machine, used to line up the ranks of a timeline.
inline double wall_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(system_clock::now().time_since_epoch()).count() + test_clock_skew_us();
}

// CPU time this thread has used, in microseconds: what it computed, not what it waited
// for (a blocked wait on a collective costs none).
inline double thread_cpu_us() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

}  // namespace trireme::obs
