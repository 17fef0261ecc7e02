// Timeline: what each rank did when, for a few steps of a run.
//
// Events are complete spans on one of two activity lanes per rank:
//   lane 0 "compute"   forward, backward, optimizer
//   lane 1 "comm"      each bucket's all-reduce, from launch to completion
// Each rank records into its own Timeline; the ranks' timelines are gathered on rank 0
// (serialize()/parse() carry them through the rendezvous store, so this works across
// machines) and written as:
//   trace.json     Chrome trace / Perfetto JSON ("X" events, pid = rank, tid = lane):
//                  open it in https://ui.perfetto.dev or chrome://tracing
//   timeline.svg   the same spans as a picture, one row per rank and lane
// Timestamps are wall-clock microseconds so that the ranks line up.
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace trireme::obs {

enum class Lane { kCompute = 0, kComm = 1 };

struct TraceEvent {
  std::string name;      // no tabs or newlines
  std::string category;  // "compute" or "comm"
  Lane lane = Lane::kCompute;
  double start_us = 0;  // wall clock
  double duration_us = 0;
  std::string args_json;  // optional JSON object of extra fields, e.g. {"bytes": 1024}
  std::string label;      // optional short text drawn inside the box in timeline.svg
};

class Timeline {
 public:
  explicit Timeline(int rank) : rank_(rank) {}

  // Thread-safe: communication completions may be recorded from backend threads.
  void add(TraceEvent event);
  std::vector<TraceEvent> events() const;
  int rank() const { return rank_; }

  // One event per line, tab-separated; parse() is its inverse. Throws InvalidArgument on a
  // malformed line.
  std::string serialize() const;
  static std::vector<TraceEvent> parse(const std::string& text);

 private:
  int rank_;
  mutable std::mutex mutex_;
  std::vector<TraceEvent> events_;
};

// The events of every rank, index = rank.
using RankEvents = std::vector<std::vector<TraceEvent>>;

// Chrome trace JSON of all ranks.
std::string chrome_trace_json(const RankEvents& ranks);
// An SVG Gantt chart: one row per (rank, lane), time in milliseconds from the first event.
std::string timeline_svg(const std::string& title, const RankEvents& ranks);

}  // namespace trireme::obs
