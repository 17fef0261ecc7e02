// Timeline: complete events ("X" phase) in the Chrome trace / Perfetto JSON format, one
// process row (pid) per rank and one thread row (tid) per activity lane:
//   tid 0 "compute"   forward, backward, optimizer
//   tid 1 "comm"      each bucket's all-reduce, from launch to completion
// Open DIR/trace.json in https://ui.perfetto.dev or chrome://tracing to see it.
//
// Each rank records into its own Timeline and writes a part file; rank 0 merges the parts
// (merge_trace_parts) into one trace. Timestamps are wall-clock microseconds so the ranks
// line up.
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace trireme::obs {

enum class Lane { kCompute = 0, kComm = 1 };

struct TraceEvent {
  std::string name;
  std::string category;
  Lane lane = Lane::kCompute;
  double start_us = 0;  // wall clock
  double duration_us = 0;
  std::string args_json;  // optional JSON object of extra fields, e.g. {"bytes": 1024}
};

class Timeline {
 public:
  explicit Timeline(int rank) : rank_(rank) {}

  // Thread-safe: communication completions are recorded from backend threads.
  void add(TraceEvent event);
  bool empty() const;
  size_t size() const;

  // The events as a JSON array body (no brackets), with process/thread name metadata.
  std::string events_json() const;
  // Writes a complete trace file of this rank alone.
  void write(const std::string& path) const;

 private:
  int rank_;
  mutable std::mutex mutex_;
  std::vector<TraceEvent> events_;
};

// Concatenates part files written with Timeline::write into one trace at `out_path`;
// parts that do not exist are skipped. Returns the number of parts merged.
int merge_trace_parts(const std::vector<std::string>& part_paths, const std::string& out_path);

}  // namespace trireme::obs
