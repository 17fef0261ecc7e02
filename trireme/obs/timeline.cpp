// Chrome-trace writing; see obs/timeline.h for the format and lanes.
#include "trireme/obs/timeline.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "trireme/common/error.h"
#include "trireme/obs/json.h"

namespace trireme::obs {
namespace {

// Wall-clock microseconds need 16 significant digits; keep nanosecond resolution.
std::string microseconds(double us) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.3f", us);
  return buf;
}

}  // namespace

void Timeline::add(TraceEvent event) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back(std::move(event));
}

bool Timeline::empty() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.empty();
}

size_t Timeline::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

std::string Timeline::events_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream out;
  auto meta = [&](const char* what, int tid, const std::string& name) {
    out << JsonObject()
               .add("ph", "M")
               .add("name", what)
               .add("pid", rank_)
               .add("tid", tid)
               .add_raw("args", JsonObject().add("name", name).str())
               .str();
  };
  meta("process_name", 0, "rank " + std::to_string(rank_));
  out << ",\n";
  meta("thread_name", 0, "compute");
  out << ",\n";
  meta("thread_name", 1, "comm");
  for (const auto& e : events_) {
    JsonObject obj;
    obj.add("ph", "X")
        .add("name", e.name)
        .add("cat", e.category)
        .add("pid", rank_)
        .add("tid", static_cast<int>(e.lane))
        .add_raw("ts", microseconds(e.start_us))
        .add_raw("dur", microseconds(e.duration_us));
    if (!e.args_json.empty()) obj.add_raw("args", e.args_json);
    out << ",\n" << obj.str();
  }
  return out.str();
}

void Timeline::write(const std::string& path) const {
  std::ofstream out(path);
  TRIREME_CHECK(out.good(), "cannot write trace file ", path);
  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n" << events_json() << "\n]}\n";
  TRIREME_CHECK(out.good(), "failed writing trace file ", path);
}

int merge_trace_parts(const std::vector<std::string>& part_paths, const std::string& out_path) {
  const std::string head = "\"traceEvents\": [\n";
  std::ostringstream body;
  int merged = 0;
  for (const auto& path : part_paths) {
    std::ifstream in(path);
    if (!in.good()) continue;
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    const auto begin = s.find(head);
    const auto end = s.rfind("\n]}");
    if (begin == std::string::npos || end == std::string::npos) continue;
    body << (merged ? ",\n" : "") << s.substr(begin + head.size(), end - begin - head.size());
    ++merged;
  }
  std::ofstream out(out_path);
  TRIREME_CHECK(out.good(), "cannot write trace file ", out_path);
  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n" << body.str() << "\n]}\n";
  return merged;
}

}  // namespace trireme::obs
