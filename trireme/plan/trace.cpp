// Trace readers and the synthetic preemption model (trace.h).
#include "trireme/plan/trace.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <set>

#include "trireme/common/error.h"

namespace trireme::plan {
namespace {

using Samples = std::vector<std::pair<double, int>>;

// Bounds of what a trace may hold: ten years of time, ten million synthetic changes.
constexpr double kMaxTraceSeconds = 10 * 365.25 * 24 * 3600;
constexpr double kMaxSyntheticChanges = 1e7;

const char* const kFormats = "auto, events, count, gcp, asg, step-seconds, step-hours, json-events";

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::vector<std::string> split_commas(const std::string& line) {
  std::vector<std::string> fields;
  size_t start = 0;
  for (;;) {
    const auto comma = line.find(',', start);
    fields.push_back(trim(line.substr(start, comma - start)));
    if (comma == std::string::npos) return fields;
    start = comma + 1;
  }
}

bool to_double(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  *out = std::strtod(s.c_str(), &end);
  return errno == 0 && end == s.c_str() + s.size() && std::isfinite(*out);
}

// A count written as an integer or as "12.0".
bool to_count(const std::string& s, int* out) {
  double v = 0;
  if (!to_double(s, &v) || v < 0 || v != std::floor(v) || v > std::numeric_limits<int>::max()) return false;
  *out = static_cast<int>(v);
  return true;
}

// Days since 0001-01-01 in the proleptic Gregorian calendar; only differences are used.
int64_t day_number(int y, int m, int d) {
  static const int kBefore[12] = {0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
  const int64_t yy = y - 1;
  int64_t days = yy * 365 + yy / 4 - yy / 100 + yy / 400 + kBefore[m - 1] + (d - 1);
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  if (leap && m > 2) ++days;
  return days;
}

// "YYYY-MM-DD HH:MM:SS" or "YYYY-MM-DDTHH:MM:SS[Z]" to seconds on a fixed origin.
bool to_datetime(const std::string& s, double* out) {
  int y, mo, d, h, mi, sec, used = 0;
  char sep;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2d%c%2d:%2d:%2d%n", &y, &mo, &d, &sep, &h, &mi, &sec, &used) != 7) return false;
  const std::string rest = s.substr(static_cast<size_t>(used));
  if ((sep != ' ' && sep != 'T') || !(rest.empty() || rest == "Z")) return false;
  static const int kDays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  if (y < 1 || mo < 1 || mo > 12 || d < 1 || d > kDays[mo - 1] || (mo == 2 && d == 29 && !leap)) return false;
  // (%2d reads a sign: "19:-5:00" is not 18:55.)
  if (h < 0 || h > 23 || mi < 0 || mi > 59 || sec < 0 || sec > 60) return false;
  *out = static_cast<double>(day_number(y, mo, d)) * 86400.0 + h * 3600.0 + mi * 60.0 + sec;
  return true;
}

// Reads a file line by line and names the line in errors.
class LineReader {
 public:
  explicit LineReader(const std::string& path) : path_(path), in_(path) {
    TRIREME_CHECK(in_.good(), "cannot read trace ", path, ": ", std::strerror(errno),
                  "; check the path (traces live in $TRIREME_TRACES or ../shared/traces)");
  }
  // The next non-blank line, trimmed; false at the end.
  bool next(std::string* line) {
    std::string raw;
    while (std::getline(in_, raw)) {
      ++number_;
      *line = trim(raw);
      if (!line->empty()) return true;
    }
    return false;
  }
  [[noreturn]] void fail(const std::string& line, const std::string& expected) const {
    TRIREME_THROW(InvalidArgument, path_, ":", number_, ": expected ", expected, ", got `", line.substr(0, 60),
                  "`; fix that line, or read the file in its right format");
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ifstream in_;
  int number_ = 0;
};

// Live node names, for the event-list formats, and the samples they replay to. The rows at
// one time are one instant. An instant with removes and adds makes two samples: the count
// after its removes at t, the count after its adds 1 ms later. A net count alone would let
// a remove and an add cancel, and a replay would see no loss where a node was preempted.
// A node added and removed within one instant counts as neither.
class NodeSet {
 public:
  static constexpr double kAddsAfterRemovesS = 0.001;  // one unit of the formats' ms times

  // Opens the instant at t (rows must not go back in time), closing the one before.
  void at(const LineReader& r, const std::string& line, double t, Samples* s) {
    if (open_ && t < t_) r.fail(line, "a time no earlier than the row before");
    if (open_ && t == t_) return;
    flush(s);
    open_ = true;
    t_ = t;
    start_ = size();
    removed_ = 0;
    added_now_.clear();
  }
  void apply(const LineReader& r, const std::string& line, const std::string& kind, const std::string& node) {
    if (kind == "add") {
      if (!live_.insert(node).second) r.fail(line, "an add of a node not live (`" + node + "` is live already)");
      added_now_.insert(node);
    } else if (live_.erase(node) == 0) {
      r.fail(line, "a remove of a live node (`" + node + "` is not live)");
    } else if (added_now_.erase(node) == 0) {
      ++removed_;
    }
  }
  // Closes the open instant: its samples go to s.
  void flush(Samples* s) {
    if (!open_) return;
    open_ = false;
    const int after_removes = start_ - removed_;
    if (removed_ > 0 && !added_now_.empty()) {
      s->emplace_back(t_, after_removes);
      s->emplace_back(t_ + kAddsAfterRemovesS, size());
    } else {
      s->emplace_back(t_, size());
    }
  }
  int size() const { return static_cast<int>(live_.size()); }

 private:
  std::set<std::string> live_;
  std::set<std::string> added_now_;  // added in the open instant and still live
  bool open_ = false;
  double t_ = 0;
  int start_ = 0;    // live when the open instant began
  int removed_ = 0;  // of those, removed in it
};

void check_time_ascends(const LineReader& r, const std::string& line, const Samples& s, double t) {
  if (!s.empty() && t < s.back().first) r.fail(line, "a time no earlier than the row before");
}

// Samples (ascending t, possibly repeated) to an Availability: t shifted by -origin, the
// count before the first sample 0 when it starts after t = 0, rows at one t collapsed.
Availability make_availability(const std::string& name, const Samples& samples, double origin, double end) {
  Availability a;
  a.name = name;
  TRIREME_CHECK(!samples.empty(), "trace ", name, " has no rows; give a file with at least one count");
  // A replay steps through the trace: an infinite or absurd time would never end.
  const auto check_time = [&](double t) {
    TRIREME_CHECK(std::isfinite(t) && std::abs(t) <= kMaxTraceSeconds, "trace ", name, " has a time ", t,
                  " s from its start, beyond ten years or not finite; check the file's time unit and format");
  };
  check_time(end - origin);
  for (const auto& [t_abs, n] : samples) {
    const double t = t_abs - origin;
    check_time(t);
    if (a.points.empty() && t > 0) a.points.emplace_back(0.0, 0);
    if (!a.points.empty() && a.points.back().first == t) {
      a.points.back().second = n;
    } else {
      a.points.emplace_back(t, n);
    }
    // Drop a point that repeats its predecessor's count (also after a collapse).
    if (a.points.size() >= 2 && a.points[a.points.size() - 2].second == a.points.back().second) a.points.pop_back();
  }
  a.duration_s = std::max(end - origin, a.points.back().first);
  return a;
}

Availability read_events(LineReader& r) {
  Samples s;
  NodeSet live;
  std::string line;
  while (r.next(&line)) {
    const auto f = split_commas(line);
    double t_ms = 0;
    if (f.size() != 3 || !to_double(f[0], &t_ms) || t_ms < 0 || (f[1] != "add" && f[1] != "remove") || f[2].empty())
      r.fail(line, "`t_ms,add|remove,node` (events format)");
    live.at(r, line, t_ms / 1000, &s);
    live.apply(r, line, f[1], f[2]);
  }
  live.flush(&s);
  return make_availability(r.path(), s, 0, s.empty() ? 0 : s.back().first);
}

// count and the step plots: two numbers a row; x * per / div is the time in seconds.
Availability read_pairs(LineReader& r, double per, double div, const char* expected) {
  Samples s;
  std::string line;
  while (r.next(&line)) {
    const auto f = split_commas(line);
    double x = 0;
    int n = 0;
    if (f.size() != 2 || !to_double(f[0], &x) || x < 0 || !to_count(f[1], &n)) r.fail(line, expected);
    check_time_ascends(r, line, s, x * per / div);
    s.emplace_back(x * per / div, n);
  }
  return make_availability(r.path(), s, 0, s.empty() ? 0 : s.back().first);
}

Availability read_gcp(LineReader& r) {
  Samples s;
  std::string line;
  while (r.next(&line)) {
    const auto f = split_commas(line);
    double t = 0;
    int n = 0;
    if (f.size() != 3 || !to_datetime(f[0] + " " + f[1], &t) || !to_count(f[2], &n))
      r.fail(line, "`YYYY-MM-DD, HH:MM:SS, count` (gcp format)");
    // A row back in time starts a re-polled log: it replaces the rows from its time on.
    while (!s.empty() && s.back().first >= t) s.pop_back();
    s.emplace_back(t, n);
  }
  TRIREME_CHECK(!s.empty(), "trace ", r.path(), " has no rows; give a file with at least one count");
  return make_availability(r.path(), s, s.front().first, s.back().first);
}

Availability read_asg(LineReader& r) {
  Samples s;
  std::string line;
  while (r.next(&line)) {
    const auto f = split_commas(line);
    double t = 0;
    int n = 0;
    if (s.empty() && f.size() == 2 && (f[0] == "timestamp" || f[0] == "time")) {
      if (f[1] != "count") r.fail(line, "header `timestamp,count` (a count series, not per-time deltas)");
      continue;
    }
    if (f.size() != 2 || !to_datetime(f[0], &t) || !to_count(f[1], &n))
      r.fail(line, "`YYYY-MM-DDTHH:MM:SSZ,count` (asg format)");
    check_time_ascends(r, line, s, t);
    s.emplace_back(t, n);
  }
  TRIREME_CHECK(!s.empty(), "trace ", r.path(), " has no rows; give a file with at least one count");
  return make_availability(r.path(), s, s.front().first, s.back().first);
}

// The subset of JSON the segment files use: `[number, "kind", {..."nodes": [strings]...}]`.
Availability read_json_events(LineReader& r) {
  const char* expected = "`[t_ms, \"add|remove|no-op|other|DONE\", {\"nodes\": [...]}]` (json-events format)";
  Samples s;
  NodeSet live;
  double end = 0;
  bool done = false;
  std::string line;
  while (r.next(&line)) {
    if (done) r.fail(line, "nothing after the DONE row");
    const char* p = line.c_str();
    char* after = nullptr;
    if (*p != '[') r.fail(line, expected);
    const double t_ms = std::strtod(p + 1, &after);
    const auto q1 = line.find('"', static_cast<size_t>(after - p));
    const auto q2 = q1 == std::string::npos ? q1 : line.find('"', q1 + 1);
    const auto key = line.find("\"nodes\"");
    const auto open = key == std::string::npos ? key : line.find('[', key);
    const auto close = open == std::string::npos ? open : line.find(']', open);
    if (after == p + 1 || !(t_ms >= 0) || q2 == std::string::npos || close == std::string::npos) r.fail(line, expected);
    const std::string kind = line.substr(q1 + 1, q2 - q1 - 1);
    if (kind != "add" && kind != "remove" && kind != "no-op" && kind != "other" && kind != "DONE")
      r.fail(line, expected);
    const double t = t_ms / 1000;
    live.at(r, line, t, &s);
    for (size_t a = line.find('"', open); a < close; a = line.find('"', a + 1)) {
      const size_t b = line.find('"', a + 1);
      if (b > close) r.fail(line, expected);
      if (kind == "add" || kind == "remove") live.apply(r, line, kind, line.substr(a + 1, b - a - 1));
      a = b;
    }
    end = std::max(end, t);
    const auto dur = line.find("\"duration\"");
    if (dur != std::string::npos) {
      const auto colon = line.find(':', dur);
      const auto stop = colon == std::string::npos ? colon : line.find_first_of(",}", colon);
      double ms = 0;
      if (stop == std::string::npos || !to_double(trim(line.substr(colon + 1, stop - colon - 1)), &ms))
        r.fail(line, "a number after \"duration\":");
      end = std::max(end, t + ms / 1000);
    }
    if (kind == "DONE") {
      done = true;
      end = t;
    }
  }
  live.flush(&s);
  return make_availability(r.path(), s, 0, end);
}

// The format of a file from its first non-blank line; throws when it is two numbers.
std::string detect_format(const std::string& path) {
  LineReader r(path);
  std::string line;
  TRIREME_CHECK(r.next(&line), "trace ", path, " is empty; give a file with at least one count");
  if (line[0] == '[') return "json-events";
  const auto f = split_commas(line);
  double t = 0;
  if (f.size() == 3 && (f[1] == "add" || f[1] == "remove")) return "events";
  if (f.size() == 3 && to_datetime(f[0] + " " + f[1], &t)) return "gcp";
  if (f.size() == 2 && (f[0] == "timestamp" || f[0] == "time" || to_datetime(f[0], &t))) return "asg";
  if (f.size() == 2 && to_double(f[0], &t))
    TRIREME_THROW(InvalidArgument, path,
                  ": two numbers a row can be `t_ms,count`, seconds or hours; name the format: count, "
                  "step-seconds or step-hours");
  r.fail(line, std::string("a line of a known trace format (") + kFormats + ")");
}

}  // namespace

int Availability::peak() const {
  int best = 0;
  for (const auto& p : points) best = std::max(best, p.second);
  return best;
}

int Availability::live_at(double t_s) const {
  int n = 0;
  for (const auto& p : points) {
    if (p.first > t_s) break;
    n = p.second;
  }
  return n;
}

int Availability::final_live() const { return points.empty() ? 0 : points.back().second; }

TraceSummary summarize(const Availability& trace) {
  TraceSummary s;
  s.duration_s = trace.duration_s;
  if (trace.points.empty()) return s;
  s.min_live = s.max_live = trace.points.front().second;
  double node_seconds = 0;
  for (size_t i = 0; i < trace.points.size(); ++i) {
    const auto [t, n] = trace.points[i];
    const double next = i + 1 < trace.points.size() ? trace.points[i + 1].first : trace.duration_s;
    node_seconds += n * (next - t);
    s.min_live = std::min(s.min_live, n);
    s.max_live = std::max(s.max_live, n);
    if (i == 0) continue;
    const int change = n - trace.points[i - 1].second;
    if (change < 0) {
      s.preemptions -= change;
      ++s.loss_instants;
    } else {
      s.additions += change;
    }
  }
  s.node_hours = node_seconds / 3600;
  s.mean_live = trace.duration_s > 0 ? node_seconds / trace.duration_s : trace.points.front().second;
  s.final_live = trace.final_live();
  return s;
}

Availability read_trace(const std::string& path, const std::string& format) {
  const std::string f = format == "auto" ? detect_format(path) : format;
  if (f == "events" || f == "count" || f == "gcp" || f == "asg" || f == "step-seconds" || f == "step-hours" ||
      f == "json-events") {
    LineReader r(path);
    if (f == "events") return read_events(r);
    if (f == "count") return read_pairs(r, 1, 1000, "`t_ms,count` (count format)");
    if (f == "step-seconds") return read_pairs(r, 1, 1, "`seconds,count` (step-seconds format)");
    if (f == "step-hours") return read_pairs(r, 3600, 1, "`hours,count` (step-hours format)");
    if (f == "gcp") return read_gcp(r);
    if (f == "asg") return read_asg(r);
    return read_json_events(r);
  }
  TRIREME_THROW(InvalidArgument, "unknown trace format `", format, "`; use one of: ", kFormats);
}

std::string trace_format_of(const std::string& relative_path) {
  const auto starts = [&](const char* prefix) { return relative_path.rfind(prefix, 0) == 0; };
  const auto has = [&](const char* part) { return relative_path.find(part) != std::string::npos; };
  if (has("LICENSE") || has("README")) return "";
  if (starts("bamboo/aws-2021-12/") || starts("oobleck/")) return "events";
  if (starts("bamboo/gcp-2021-12/")) return "gcp";
  if (starts("bamboo/aws-asg-2021/"))
    return has("full-64-node-trace") || has("preempt-trace-") ? "asg" : "";
  if (starts("bamboo/aws-2020-11/")) return has("2020-11-20-to-2020-11-23") ? "step-hours" : "step-seconds";
  if (relative_path == "parcae/p3-count.csv") return "count";
  if (starts("parcae/segments") || starts("spotserve/")) return "json-events";
  return "";
}

std::string default_trace_dir(const std::string& source_root) {
  const char* env = std::getenv("TRIREME_TRACES");
  if (env != nullptr && *env != '\0') return env;
  return source_root + "/../shared/traces";
}

Availability synthetic_trace(int nodes, double preemptions_per_node_hour, double mean_replacement_s,
                             double duration_s, uint64_t seed) {
  TRIREME_CHECK(nodes >= 0, "synthetic trace: nodes must be >= 0, got ", nodes);
  TRIREME_CHECK(preemptions_per_node_hour >= 0 && mean_replacement_s >= 0,
                "synthetic trace: the preemption rate and the replacement delay must be >= 0");
  TRIREME_CHECK(duration_s > 0 && duration_s <= kMaxTraceSeconds, "synthetic trace: duration must be positive and at most ten years, got ",
                duration_s, " s");
  // Each preemption is two changes; the expected count bounds the memory the trace takes.
  const double expected_changes = 2.0 * nodes * preemptions_per_node_hour * duration_s / 3600;
  TRIREME_CHECK(std::isfinite(mean_replacement_s) && expected_changes <= kMaxSyntheticChanges, "synthetic trace: about ",
                expected_changes, " changes (2 x nodes ", nodes, " x ", preemptions_per_node_hour,
                " preemptions per node-hour x ", duration_s / 3600, " hours), more than ", kMaxSyntheticChanges,
                "; lower the preemption rate or the duration (--hours)");
  std::mt19937_64 rng(seed);
  // Exponential draw of the given mean: -mean * ln(1 - u), u uniform in [0, 1) from 53 bits.
  const auto draw = [&rng](double mean) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    return -mean * std::log1p(-u);
  };
  const double mean_up_s = preemptions_per_node_hour > 0 ? 3600 / preemptions_per_node_hour : 0;
  std::vector<std::pair<double, int>> changes;  // (t, +1 | -1)
  for (int slot = 0; slot < nodes && mean_up_s > 0; ++slot) {
    for (double t = draw(mean_up_s); t < duration_s; t += draw(mean_up_s)) {
      changes.emplace_back(t, -1);
      t += draw(mean_replacement_s);
      if (t >= duration_s) break;
      changes.emplace_back(t, +1);
    }
  }
  std::sort(changes.begin(), changes.end());
  Samples s{{0.0, nodes}};
  int live = nodes;
  for (const auto& [t, step] : changes) s.emplace_back(t, live += step);
  char name[160];
  std::snprintf(name, sizeof name, "synthetic(nodes=%d, %g preemptions/node-h, replace %g s, seed %llu)", nodes,
                preemptions_per_node_hour, mean_replacement_s, static_cast<unsigned long long>(seed));
  return make_availability(name, s, 0, duration_s);
}

}  // namespace trireme::plan
