// One monotonic clock for every timestamp Trireme records (timelines, step statistics), in
// microseconds since an arbitrary process-wide origin. Steady, so never goes backwards.
#pragma once

#include <chrono>

namespace trireme::obs {

inline double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

// Wall-clock microseconds since the Unix epoch: comparable across processes on one
// machine, used to line up the ranks of a timeline.
inline double wall_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(system_clock::now().time_since_epoch()).count();
}

}  // namespace trireme::obs
