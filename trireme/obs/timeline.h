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
//   timeline.tsv   every rank's events as text (serialize_ranks), read back by
//                  `trireme report` (parse_ranks)
// Timestamps are wall-clock microseconds so that the ranks line up (a job across machines
// records them on rank 0's clock: the trainer's ClockMap).
//
// Text form of one event (serialize/parse), one line, seven tab-separated fields:
//   lane  start_us  duration_us  category  name  args_json  label
//   0     1712.250  50.000       pipeline  F m3 c0  {"micro": 3, "chunk": 0, "step": 2}  3
// lane is 0 (compute) or 1 (comm); args_json and label may be empty; |start_us| and
// duration_us are at most 1e17 (about 3,000 years). Tabs and newlines inside a field are
// written as spaces.
//
// timeline.tsv (serialize_ranks/parse_ranks): a header naming the format and the number
// of ranks, then each rank's block (possibly empty) after a `# rank N` line, in rank order:
//   # trireme timeline v1 ranks=2
//   # rank 0
//   <rank 0's events, one per line>
//   # rank 1
//   <rank 1's events>
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

  // One event per line (the text form above); parse() is its inverse. parse() also reads
  // lines without the label or the args field, and throws InvalidArgument naming the line
  // number of a malformed line.
  std::string serialize() const;
  static std::vector<TraceEvent> parse(const std::string& text);

 private:
  int rank_;
  mutable std::mutex mutex_;
  std::vector<TraceEvent> events_;
};

// The events of every rank, index = rank.
using RankEvents = std::vector<std::vector<TraceEvent>>;

// Every rank's events as the timeline.tsv text above; parse_ranks() is its inverse
// (ranks without events included) and throws InvalidArgument naming the line number of a
// missing or wrong header, an out-of-order `# rank` line, a malformed event, or a rank count
// that does not match the header (a truncated file).
std::string serialize_ranks(const RankEvents& ranks);
RankEvents parse_ranks(const std::string& text);

// Chrome trace JSON of all ranks.
std::string chrome_trace_json(const RankEvents& ranks);
// An SVG Gantt chart: per row a compute lane and a thin comm lane, time in milliseconds
// from the first event. Rows are labelled "rank N" (index = rank), or by row_names
// (one per row, e.g. "stage 1 (rank 3)").
std::string timeline_svg(const std::string& title, const RankEvents& ranks);
std::string timeline_svg(const std::string& title, const RankEvents& rows,
                         const std::vector<std::string>& row_names);

}  // namespace trireme::obs
