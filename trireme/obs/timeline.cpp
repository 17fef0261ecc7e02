// Timelines as Chrome traces and SVG pictures; see obs/timeline.h.
#include "trireme/obs/timeline.h"

#include <algorithm>
#include <cstdio>
#include <map>
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

std::string lane_name(Lane lane) { return lane == Lane::kComm ? "comm" : "compute"; }

std::string fixed(double v, int digits = 1) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// Colours by what the span is, so a step reads at a glance.
// Pipeline instructions are named "F m3 c0", "B m3 c0", "Bi ...", "W ...".
const char* color_of(const TraceEvent& e) {
  auto starts = [&](const char* prefix) { return e.name.rfind(prefix, 0) == 0; };
  if (e.lane == Lane::kComm) return "#9467bd";
  if (e.name == "forward" || starts("F ")) return "#1f77b4";
  if (e.name == "backward" || starts("B ") || starts("Bi ")) return "#ff7f0e";
  if (starts("W ")) return "#17becf";
  if (e.name == "optimizer") return "#2ca02c";
  return "#7f7f7f";
}

}  // namespace

void Timeline::add(TraceEvent event) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back(std::move(event));
}

std::vector<TraceEvent> Timeline::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

std::string Timeline::serialize() const {
  std::ostringstream out;
  for (const auto& e : events())
    out << static_cast<int>(e.lane) << '\t' << microseconds(e.start_us) << '\t'
        << microseconds(e.duration_us) << '\t' << e.category << '\t' << e.name << '\t'
        << e.args_json << '\n';
  return out.str();
}

std::vector<TraceEvent> Timeline::parse(const std::string& text) {
  std::vector<TraceEvent> events;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    std::vector<std::string> fields;
    std::istringstream cols(line);
    for (std::string field; std::getline(cols, field, '\t');) fields.push_back(field);
    if (fields.size() == 5) fields.emplace_back();  // empty args
    TRIREME_CHECK(fields.size() == 6, "malformed timeline line: '", line, "'");
    TraceEvent e;
    e.lane = fields[0] == "1" ? Lane::kComm : Lane::kCompute;
    e.start_us = std::stod(fields[1]);
    e.duration_us = std::stod(fields[2]);
    e.category = fields[3];
    e.name = fields[4];
    e.args_json = fields[5];
    events.push_back(std::move(e));
  }
  return events;
}

std::string chrome_trace_json(const RankEvents& ranks) {
  std::ostringstream out;
  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  auto emit = [&](const std::string& json) {
    out << (first ? "" : ",\n") << json;
    first = false;
  };
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    const int pid = static_cast<int>(rank);
    emit(JsonObject().add("ph", "M").add("name", "process_name").add("pid", pid).add("tid", 0)
             .add_raw("args", JsonObject().add("name", "rank " + std::to_string(rank)).str()).str());
    for (Lane lane : {Lane::kCompute, Lane::kComm})
      emit(JsonObject().add("ph", "M").add("name", "thread_name").add("pid", pid)
               .add("tid", static_cast<int>(lane))
               .add_raw("args", JsonObject().add("name", lane_name(lane)).str()).str());
    for (const auto& e : ranks[rank]) {
      JsonObject obj;
      obj.add("ph", "X").add("name", e.name).add("cat", e.category).add("pid", pid)
          .add("tid", static_cast<int>(e.lane))
          .add_raw("ts", microseconds(e.start_us))
          .add_raw("dur", microseconds(e.duration_us));
      if (!e.args_json.empty()) obj.add_raw("args", e.args_json);
      emit(obj.str());
    }
  }
  out << "\n]}\n";
  return out.str();
}

std::string timeline_svg(const std::string& title, const RankEvents& ranks) {
  constexpr double kLabel = 110, kRow = 22, kGap = 8, kTop = 44, kWidth = 1100, kRight = 20;
  double t0 = 1e300, t1 = -1e300;
  for (const auto& events : ranks)
    for (const auto& e : events) {
      t0 = std::min(t0, e.start_us);
      t1 = std::max(t1, e.start_us + e.duration_us);
    }
  if (t0 > t1) t0 = 0, t1 = 1;
  const double span = std::max(t1 - t0, 1.0);
  const double plot = kWidth - kLabel - kRight;
  const double height = kTop + ranks.size() * (2 * kRow + kGap) + 40;
  auto x = [&](double us) { return kLabel + (us - t0) / span * plot; };

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << kWidth / 2 << "\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">";
  svg << xml_escape(title) << "</text>\n";
  // Legend.
  const std::vector<std::pair<const char*, const char*>> legend = {
      {"forward", "#1f77b4"}, {"backward (input)", "#ff7f0e"}, {"backward (weights)", "#17becf"},
      {"optimizer", "#2ca02c"}, {"communication", "#9467bd"}};
  for (size_t i = 0; i < legend.size(); ++i)
    svg << "<rect x=\"" << kLabel + i * 140 << "\" y=\"26\" width=\"10\" height=\"10\" fill=\""
        << legend[i].second << "\"/><text x=\"" << kLabel + i * 140 + 14 << "\" y=\"35\">"
        << legend[i].first << "</text>\n";
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    const double base = kTop + rank * (2 * kRow + kGap);
    for (int lane = 0; lane < 2; ++lane) {
      const double y = base + lane * kRow;
      svg << "<text x=\"6\" y=\"" << y + 15 << "\">rank " << rank << " "
          << lane_name(static_cast<Lane>(lane)) << "</text>\n"
          << "<rect x=\"" << kLabel << "\" y=\"" << y + 2 << "\" width=\"" << plot
          << "\" height=\"" << kRow - 4 << "\" fill=\"#f4f4f4\"/>\n";
    }
    for (const auto& e : ranks[rank]) {
      const double y = base + static_cast<int>(e.lane) * kRow;
      svg << "<rect x=\"" << fixed(x(e.start_us), 2) << "\" y=\"" << y + 3 << "\" width=\""
          << fixed(std::max(0.5, e.duration_us / span * plot), 2) << "\" height=\"" << kRow - 6
          << "\" fill=\"" << color_of(e) << "\" stroke=\"white\" stroke-width=\"0.3\"><title>"
          << xml_escape(e.name) << ": " << fixed(e.duration_us / 1e3, 2) << " ms</title></rect>\n";
      const double width = e.duration_us / span * plot;
      if (!e.label.empty() && width >= 7.0 * e.label.size())
        svg << "<text x=\"" << fixed(x(e.start_us) + width / 2, 2) << "\" y=\"" << y + 15
            << "\" text-anchor=\"middle\" fill=\"white\" font-size=\"10\">" << xml_escape(e.label) << "</text>\n";
    }
  }
  // Time axis in milliseconds.
  const double axis_y = kTop + ranks.size() * (2 * kRow + kGap) + 4;
  for (int t = 0; t <= 10; ++t) {
    const double us = t0 + span * t / 10;
    svg << "<line x1=\"" << x(us) << "\" x2=\"" << x(us) << "\" y1=\"" << axis_y << "\" y2=\""
        << axis_y + 5 << "\" stroke=\"#444\"/><text x=\"" << x(us) << "\" y=\"" << axis_y + 17
        << "\" text-anchor=\"middle\">" << fixed((us - t0) / 1e3) << "</text>\n";
  }
  svg << "<text x=\"" << kLabel + plot / 2 << "\" y=\"" << axis_y + 32
      << "\" text-anchor=\"middle\">milliseconds</text>\n</svg>\n";
  return svg.str();
}

}  // namespace trireme::obs
