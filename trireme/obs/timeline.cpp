// Timelines as Chrome traces and SVG pictures; see obs/timeline.h.
#include "trireme/obs/timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "trireme/common/error.h"
#include "trireme/obs/json.h"

#include <nlohmann/json.hpp>

namespace trireme::obs {
namespace {

// Room for any double in %.3f: a sign, 309 digits, the point and 3 decimals.
constexpr size_t kFixedChars = 320;

// Larger times in timeline.tsv are refused: 10^17 us is about 3,000 years, past any wall
// clock, and keeps sums and differences of times finite in the pictures.
constexpr double kMaxMicroseconds = 1e17;

// Wall-clock microseconds need 16 significant digits; keep nanosecond resolution.
std::string microseconds(double us) {
  char buf[kFixedChars];
  std::snprintf(buf, sizeof(buf), "%.3f", us);
  return buf;
}

std::string lane_name(Lane lane) { return lane == Lane::kComm ? "comm" : "compute"; }

std::string fixed(double v, int digits = 1) {
  char buf[kFixedChars];
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

constexpr const char* kTsvHeader = "# trireme timeline v1 ranks=";
constexpr const char* kRankLine = "# rank ";

// A field of the text form: the separators (tab, newline) become spaces.
std::string field(const std::string& text) {
  std::string out = text;
  for (char& c : out)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return out;
}

std::string event_line(const TraceEvent& e) {
  return std::to_string(static_cast<int>(e.lane)) + '\t' + microseconds(e.start_us) + '\t' +
         microseconds(e.duration_us) + '\t' + field(e.category) + '\t' + field(e.name) + '\t' +
         field(e.args_json) + '\t' + field(e.label) + '\n';
}

// A line as quoted in error messages: long lines are cut.
std::string quote_line(const std::string& line) {
  return "'" + (line.size() > 80 ? line.substr(0, 77) + "..." : line) + "'";
}

// A plain decimal number: no leading space or sign of '+', no hex, no "inf" or "nan".
bool parse_number(const std::string& text, double* out) {
  if (text.empty() || text.find_first_not_of("0123456789.-eE") != std::string::npos) return false;
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return *end == '\0' && std::isfinite(*out);
}

bool parse_count(const std::string& text, int* out) {
  if (text.empty() || text.size() > 9 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  *out = std::stoi(text);
  return true;
}

// One line of the text form (5, 6 or 7 fields: args and label may be left off).
TraceEvent parse_event(const std::string& line, size_t line_no) {
  std::vector<std::string> fields(1);
  for (char c : line) {
    if (c == '\t')
      fields.emplace_back();
    else
      fields.back() += c;
  }
  TRIREME_CHECK(fields.size() >= 5 && fields.size() <= 7, "line ", line_no,
                ": expected 7 tab-separated fields (lane, start_us, duration_us, category, name, "
                "args_json, label), got ", fields.size(), ": ", quote_line(line));
  fields.resize(7);
  TraceEvent e;
  TRIREME_CHECK(fields[0] == "0" || fields[0] == "1", "line ", line_no,
                ": lane must be 0 (compute) or 1 (comm), got ", quote_line(fields[0]));
  e.lane = fields[0] == "1" ? Lane::kComm : Lane::kCompute;
  TRIREME_CHECK(parse_number(fields[1], &e.start_us), "line ", line_no,
                ": start_us must be a number, got ", quote_line(fields[1]));
  TRIREME_CHECK(parse_number(fields[2], &e.duration_us) && e.duration_us >= 0, "line ", line_no,
                ": duration_us must be a number >= 0, got ", quote_line(fields[2]));
  TRIREME_CHECK(std::abs(e.start_us) <= kMaxMicroseconds && e.duration_us <= kMaxMicroseconds,
                "line ", line_no, ": start_us and duration_us must be at most 1e17 in magnitude, got ",
                quote_line(fields[1]), " and ", quote_line(fields[2]));
  e.category = fields[3];
  e.name = fields[4];
  // The args go into trace.json as they are, so they must be a JSON object (or none).
  TRIREME_CHECK(fields[5].empty() || (fields[5].front() == '{' && nlohmann::json::accept(fields[5])), "line ",
                line_no, ": args_json must be a JSON object or empty, got ", quote_line(fields[5]));
  e.args_json = fields[5];
  e.label = fields[6];
  return e;
}

std::vector<TraceEvent> parse_events(const std::string& text) {
  std::vector<TraceEvent> events;
  std::istringstream in(text);
  size_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (!line.empty()) events.push_back(parse_event(line, line_no));
  }
  return events;
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
  std::string out;
  for (const auto& e : events()) out += event_line(e);
  return out;
}

std::vector<TraceEvent> Timeline::parse(const std::string& text) { return parse_events(text); }

std::string serialize_ranks(const RankEvents& ranks) {
  std::string out = kTsvHeader + std::to_string(ranks.size()) + "\n";
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    out += kRankLine + std::to_string(rank) + "\n";
    for (const auto& e : ranks[rank]) out += event_line(e);
  }
  return out;
}

RankEvents parse_ranks(const std::string& text) {
  RankEvents ranks;
  int declared = -1;
  std::istringstream in(text);
  size_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // a file saved with CRLF endings
    if (line.empty()) continue;
    auto after = [&](const std::string& prefix) {
      return line.rfind(prefix, 0) == 0 ? line.substr(prefix.size()) : std::string("-");
    };
    if (declared < 0) {
      TRIREME_CHECK(parse_count(after(kTsvHeader), &declared), "line ", line_no,
                    ": expected the header '", kTsvHeader, "N', got ", quote_line(line));
      continue;
    }
    if (line.rfind(kRankLine, 0) == 0) {
      int rank = -1;
      TRIREME_CHECK(parse_count(after(kRankLine), &rank) && rank == static_cast<int>(ranks.size()),
                    "line ", line_no, ": expected '", kRankLine, ranks.size(), "', got ",
                    quote_line(line));
      TRIREME_CHECK(rank < declared, "line ", line_no, ": ", quote_line(line),
                    " but the header declares ", declared, " ranks");
      ranks.emplace_back();
      continue;
    }
    TRIREME_CHECK(!ranks.empty(), "line ", line_no, ": expected '", kRankLine,
                  "0' before the first event, got ", quote_line(line));
    ranks.back().push_back(parse_event(line, line_no));
  }
  TRIREME_CHECK(declared >= 0, "no header line '", kTsvHeader, "N' (empty file)");
  TRIREME_CHECK(static_cast<int>(ranks.size()) == declared, "the header declares ", declared,
                " ranks but ", ranks.size(), " follow (truncated file?)");
  return ranks;
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
  std::vector<std::string> names;
  for (size_t rank = 0; rank < ranks.size(); ++rank)
    names.push_back("rank " + std::to_string(rank));
  return timeline_svg(title, ranks, names);
}

std::string timeline_svg(const std::string& title, const RankEvents& rows,
                         const std::vector<std::string>& row_names) {
  TRIREME_ENFORCE_EQ(rows.size(), row_names.size(), "(one name per timeline row)");
  // Per row: a compute lane, a thinner comm lane below it, then a gap.
  constexpr double kRow = 22, kCommRow = 14, kGap = 8, kTop = 44, kWidth = 1100, kRight = 20;
  constexpr double kPitch = kRow + kCommRow + kGap;
  size_t longest = 0;
  for (const auto& name : row_names) longest = std::max(longest, name.size());
  // Room for "<name> compute" at about 6 px per character of 11 px sans-serif.
  const double label_width = std::max(110.0, 6.0 * (longest + 8) + 12);
  double t0 = 1e300, t1 = -1e300;
  for (const auto& events : rows)
    for (const auto& e : events) {
      t0 = std::min(t0, e.start_us);
      t1 = std::max(t1, e.start_us + e.duration_us);
    }
  if (t0 > t1) t0 = 0, t1 = 1;
  const double span = std::max(t1 - t0, 1.0);
  const double plot = kWidth - label_width - kRight;
  const double height = kTop + rows.size() * kPitch + 40;
  auto x = [&](double us) { return label_width + (us - t0) / span * plot; };

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
    svg << "<rect x=\"" << label_width + i * 140 << "\" y=\"26\" width=\"10\" height=\"10\" fill=\""
        << legend[i].second << "\"/><text x=\"" << label_width + i * 140 + 14 << "\" y=\"35\">"
        << legend[i].first << "</text>\n";
  for (size_t row = 0; row < rows.size(); ++row) {
    const double base = kTop + row * kPitch;
    const double lane_y[2] = {base, base + kRow};
    const double lane_height[2] = {kRow, kCommRow};
    for (int lane = 0; lane < 2; ++lane)
      svg << "<text x=\"6\" y=\"" << lane_y[lane] + lane_height[lane] - 6 << "\""
          << (lane == 1 ? " font-size=\"9\" fill=\"#555\"" : "") << ">"
          << xml_escape(row_names[row]) << " " << lane_name(static_cast<Lane>(lane)) << "</text>\n"
          << "<rect x=\"" << label_width << "\" y=\"" << lane_y[lane] + 2 << "\" width=\"" << plot
          << "\" height=\"" << lane_height[lane] - 4 << "\" fill=\"#f4f4f4\"/>\n";
    for (const auto& e : rows[row]) {
      const int lane = static_cast<int>(e.lane);
      const double y = lane_y[lane], width = e.duration_us / span * plot;
      svg << "<rect x=\"" << fixed(x(e.start_us), 2) << "\" y=\"" << y + 3 << "\" width=\""
          << fixed(std::max(0.5, width), 2) << "\" height=\"" << lane_height[lane] - 6
          << "\" fill=\"" << color_of(e) << "\" stroke=\"white\" stroke-width=\"0.3\"><title>"
          << xml_escape(e.name) << ": " << fixed(e.duration_us / 1e3, 2) << " ms</title></rect>\n";
      if (e.lane == Lane::kCompute && !e.label.empty() && width >= 7.0 * e.label.size())
        svg << "<text x=\"" << fixed(x(e.start_us) + width / 2, 2) << "\" y=\"" << y + 15
            << "\" text-anchor=\"middle\" fill=\"white\" font-size=\"10\">" << xml_escape(e.label) << "</text>\n";
    }
  }
  // Time axis in milliseconds.
  const double axis_y = kTop + rows.size() * kPitch + 4;
  for (int t = 0; t <= 10; ++t) {
    const double us = t0 + span * t / 10;
    svg << "<line x1=\"" << x(us) << "\" x2=\"" << x(us) << "\" y1=\"" << axis_y << "\" y2=\""
        << axis_y + 5 << "\" stroke=\"#444\"/><text x=\"" << x(us) << "\" y=\"" << axis_y + 17
        << "\" text-anchor=\"middle\">" << fixed((us - t0) / 1e3) << "</text>\n";
  }
  svg << "<text x=\"" << label_width + plot / 2 << "\" y=\"" << axis_y + 32
      << "\" text-anchor=\"middle\">milliseconds</text>\n</svg>\n";
  return svg.str();
}

}  // namespace trireme::obs
