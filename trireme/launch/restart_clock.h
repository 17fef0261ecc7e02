// The moments of a restart as the agents publish them (when the failure was seen, when
// the membership was decided, when the recovery barrier opened), each on the wall clock of
// the machine that wrote it, and how a worker puts them on its own machine's clock. Every
// member's agent also publishes when it saw the barrier open (keys::restart_clock): one
// event seen by all at about the same moment, so the difference of two machines' readings
// of it is their clocks' offset, up to the store's notification latency. Without it, a
// skew between machines would show up whole in the recovery report's phases. Pure.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace trireme::launch {

// A moment, in wall-clock microseconds on node `node`'s clock (-1: unknown node).
struct Stamp {
  double us = 0;
  int node = -1;
};

// "US NODE" as the agents write it (or a bare "US", node -1); nullopt when malformed.
std::optional<Stamp> parse_stamp(const std::string& text);
std::string format_stamp(double us, int node);

// `stamp` on node `own`'s clock, from each node's reading of the barrier's opening
// (`barrier_seen`: node -> wall-clock microseconds on that node): unchanged when it is
// own's already or either reading is missing.
double on_clock_of(int own, const Stamp& stamp, const std::map<int, double>& barrier_seen);

}  // namespace trireme::launch
