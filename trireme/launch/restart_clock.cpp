// Restart moments across machines' clocks; see restart_clock.h.
#include "trireme/launch/restart_clock.h"

#include <cstdio>
#include <sstream>

namespace trireme::launch {

std::optional<Stamp> parse_stamp(const std::string& text) {
  std::istringstream in(text);
  Stamp stamp;
  if (!(in >> stamp.us)) return std::nullopt;
  if (!(in >> stamp.node)) {
    if (!in.eof()) return std::nullopt;
    stamp.node = -1;
  }
  std::string rest;
  if (in >> rest) return std::nullopt;
  return stamp;
}

std::string format_stamp(double us, int node) {
  char text[64];
  std::snprintf(text, sizeof text, "%.0f %d", us, node);
  return text;
}

double on_clock_of(int own, const Stamp& stamp, const std::map<int, double>& barrier_seen) {
  if (stamp.node == own) return stamp.us;
  const auto mine = barrier_seen.find(own), theirs = barrier_seen.find(stamp.node);
  if (mine == barrier_seen.end() || theirs == barrier_seen.end()) return stamp.us;
  return stamp.us + (mine->second - theirs->second);
}

}  // namespace trireme::launch
