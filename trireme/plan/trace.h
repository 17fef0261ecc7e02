// Spot availability traces: the number of live nodes as a step function of time, read from
// the files other projects recorded (beside the source tree in ../shared/traces, see its
// README.md) or drawn from a synthetic preemption model. simulate.h replays them.
//
// Terms:
//   point          (t, n): from t seconds on, n nodes are live, until the next point's t.
//                  Points are strictly ascending in t, the first is at t = 0, and no two
//                  neighbours carry the same n (only changes are kept)
//   collapse       several rows at the same t make one point: the last row's count wins.
//                  The event formats replay an instant with both removes and adds to two
//                  points, the count after the removes at t and the final count at t + 1 ms,
//                  so a preempted node replaced at once is still a loss
//   preemptions    nodes lost: the sum of the drops of the step function (a drop of 3 at
//                  one instant is 3 preemptions and 1 loss instant); additions likewise.
//                  The count at t = 0 is the starting level, neither
//   duration       end of the trace; the last point may lie on it (its count lasts 0 s)
//
// Formats (`format` argument; "auto" detects all but the two-number ones):
//   events        `t_ms,add|remove,node`, one node event per row, replayed to counts
//                 (count 0 before the first row). A node is added while live, or removed
//                 while not live, is an error. Duration: the last row's t
//   count         `t_ms,count`: the count after each event. Duration: the last row's t
//   gcp           `YYYY-MM-DD, HH:MM:SS, count`, a poll log. Where the time goes back
//                 (v100x1-east1c.txt holds re-polled, overlapping logs), the later rows
//                 replace the earlier ones from that time on. t = 0 at the first time
//   asg           `timestamp,count` with an ISO time (`2021-07-26T18:42:00Z` or
//                 `2021-09-17 04:00:00`), optional header `timestamp|time,count`, counts
//                 may be written `12.0`; times must ascend. t = 0 at the first time
//   step-seconds  `x,y` step plot, x seconds since the start, y the count; a vertical
//   step-hours    segment is two rows at the same x. step-hours: x in hours
//   json-events   one JSON array a row: `[t_ms, "add"|"remove"|"no-op"|"other"|"DONE",
//                 {"nodes": [names], "duration": ms, ...}]`, replayed like events; other
//                 keys are ignored. Duration: the DONE row's t, else the largest
//                 t + "duration", else the last t
// Two plain numbers a row (count, step-seconds, step-hours) cannot be told apart, so
// "auto" asks for the format to be named.
//
// Files in ../shared/traces (trace_format_of gives the format by relative path):
//   bamboo/aws-2021-12/{p3,g4dn}-trace.csv                    events
//   bamboo/gcp-2021-12/{a100x1-east1b,v100x1-east1c}.txt      gcp
//   bamboo/aws-asg-2021/full-64-node-trace.csv                asg
//   bamboo/aws-asg-2021/preempt-trace-...-Group*Instances.csv asg (only InService is
//                                                             live nodes)
//   bamboo/aws-2020-11/...-p2-xlarge-2020-11-20-to-2020-11-23.csv   step-hours
//   bamboo/aws-2020-11/ (the other, per-zone files)           step-seconds
//   parcae/p3-count.csv                                       count
//   parcae/segments-32node/*.txt, spotserve/segments/*.txt    json-events
//   oobleck/scaled/*.csv, oobleck/synthetic/*.csv             events
// Not count series (per-time numbers of nodes added, terminated or found preempted), so
// not read: bamboo/aws-asg-2021/full-64-{additions,terminate}-trace.csv and
// full-64-found-preemptions.csv.
//
// Errors: InvalidArgument naming the file, the line number and what the line should be.
// Pure: no libtorch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trireme::plan {

struct Availability {
  std::string name;                            // the path read, or "synthetic(...)"
  std::vector<std::pair<double, int>> points;  // (t seconds, live nodes from t on)
  double duration_s = 0;                       // end of the trace

  int peak() const;                // most nodes live at once
  int live_at(double t_s) const;   // live nodes at t (the last point at or before t)
  int final_live() const;          // live nodes at the end
};

struct TraceSummary {
  double duration_s = 0;
  double node_hours = 0;   // integral of the live count over [0, duration]
  double mean_live = 0;    // node_hours / duration (the count at 0 when duration is 0)
  int min_live = 0;
  int max_live = 0;
  int final_live = 0;
  int preemptions = 0;     // nodes lost, summed over drops
  int loss_instants = 0;   // points where the count drops
  int additions = 0;       // nodes added, summed over rises
};

TraceSummary summarize(const Availability& trace);

// format: "auto" | "events" | "count" | "gcp" | "asg" | "step-seconds" | "step-hours" |
// "json-events". Reads CRLF or LF files; blank lines are skipped.
Availability read_trace(const std::string& path, const std::string& format = "auto");

// The format of a file of ../shared/traces by its path relative to that folder
// ("bamboo/aws-2021-12/p3-trace.csv" -> "events"); "" for files that are not count series.
std::string trace_format_of(const std::string& relative_path);

// Where the third-party traces are: $TRIREME_TRACES when set and non-empty, else
// <source_root>/../shared/traces. The folder may not exist (it lives outside the repository).
std::string default_trace_dir(const std::string& source_root);

// `nodes` slots start live at t = 0; a live slot is preempted after an exponential time of
// rate preemptions_per_node_hour, a preempted one refilled after an exponential delay of
// mean mean_replacement_s (0: at once, so the pair collapses and leaves no trace). Draws
// are inverse-CDF from std::mt19937_64 (same numbers on every standard library), slot by
// slot, so a seed gives the same trace everywhere. Expect about
// preemptions_per_node_hour * node_hours preemptions.
Availability synthetic_trace(int nodes, double preemptions_per_node_hour, double mean_replacement_s,
                             double duration_s, uint64_t seed);

}  // namespace trireme::plan
