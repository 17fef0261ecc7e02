// Availability traces (plan/trace.h): each format on a small inline sample, the errors a
// bad line gives, the synthetic model, and the third-party traces in ../shared/traces
// (skipped when that folder is absent) against the facts their README states.
#include "trireme/plan/trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>

#include "trireme/common/error.h"
#include "trireme/plan/simulate.h"

using trireme::InvalidArgument;
using trireme::plan::Availability;
using trireme::plan::read_trace;
using trireme::plan::summarize;
using trireme::plan::synthetic_trace;
using trireme::plan::trace_format_of;
using Points = std::vector<std::pair<double, int>>;

namespace {

// A temporary file holding `text`, removed when it goes out of scope.
class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    char name[] = "/tmp/trireme-trace-XXXXXX";
    const int fd = ::mkstemp(name);
    EXPECT_GE(fd, 0);
    path_ = name;
    EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
  }
  ~TempFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Availability read_text(const std::string& text, const std::string& format = "auto") {
  TempFile f(text);
  return read_trace(f.path(), format);
}

// The message of the InvalidArgument that reading `text` throws ("" if none).
std::string read_error(const std::string& text, const std::string& format, std::string* path = nullptr) {
  TempFile f(text);
  if (path != nullptr) *path = f.path();
  try {
    read_trace(f.path(), format);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// The traces folder beside this source tree (or $TRIREME_TRACES); "" when absent.
std::string trace_dir() {
  std::string root = __FILE__;
  const auto cut = root.rfind("tests/unit/");
  root = cut == std::string::npos ? "." : root.substr(0, cut);
  const auto dir = trireme::plan::default_trace_dir(root);
  return std::filesystem::is_directory(dir) ? dir : "";
}

}  // namespace

TEST(TraceFormats, EventsReplayToCountsAndSplitAnInstantOfRemovesAndAdds) {
  // CRLF endings; the count is 0 before 30 s. At t = 60 s a is removed and c added: their
  // net count would not change, so the loss of a would vanish (no detection, no restart, no
  // rollback in a replay). The instant is two points: 1 after the remove at 60 s, 2 after
  // the add 1 ms later. Rows of one kind at one instant still collapse (the two adds at 30 s).
  const auto a = read_text("30000,add,a\r\n30000,add,b\r\n60000,add,c\r\n60000,remove,a\r\n\r\n90000,remove,b\r\n");
  EXPECT_EQ(a.points, (Points{{0, 0}, {30, 2}, {60, 1}, {60 + 0.001, 2}, {90, 1}}));
  EXPECT_DOUBLE_EQ(a.duration_s, 90);
  EXPECT_EQ(a.peak(), 2);
  EXPECT_EQ(a.final_live(), 1);
  EXPECT_EQ(a.live_at(29.9), 0);
  EXPECT_EQ(a.live_at(30), 2);
  const auto s = summarize(a);
  EXPECT_EQ(s.preemptions, 2);
  EXPECT_EQ(s.additions, 3);
}

TEST(TraceFormats, ARemoveAndAnAddAtOneInstantAreALossAndAnAddition) {
  const auto a = read_text("0,add,a\n0,add,b\n60000,remove,a\n60000,add,c\n120000,remove,b\n");
  EXPECT_EQ(a.points, (Points{{0, 2}, {60, 1}, {60 + 0.001, 2}, {120, 1}}));
  EXPECT_EQ(summarize(a).preemptions, 2);
  // A replay sees both losses: restarts at 60 s, again at the add 1 ms later, and at 120 s.
  trireme::plan::ReplayOptions o;
  o.fixed_samples_per_s = {0, 10, 20};
  EXPECT_EQ(trireme::plan::replay(a, o, trireme::plan::Policy::kMemory).restarts, 3);
  // A node added and removed within one instant is neither; the replaced node b still counts.
  const auto b = read_text("0,add,a\n0,add,b\n60000,add,c\n60000,remove,c\n60000,remove,b\n60000,add,d\n");
  EXPECT_EQ(b.points, (Points{{0, 2}, {60, 1}, {60 + 0.001, 2}}));
  // json-events replay the same way.
  const auto j = read_text("[0, \"add\", {\"nodes\": [\"a\", \"b\"]}]\n[60000, \"remove\", {\"nodes\": [\"a\"]}]\n"
                           "[60000, \"add\", {\"nodes\": [\"c\"]}]\n");
  EXPECT_EQ(summarize(j).preemptions, 1);
}

TEST(TraceFormats, CountRowsAreMillisecondsAndTheLastOfAnInstantWins) {
  const auto a = read_text("0,1\n0,2\n0,3\n120000,2\n180000,2\n240000,4\n", "count");
  EXPECT_EQ(a.points, (Points{{0, 3}, {120, 2}, {240, 4}}));
  EXPECT_DOUBLE_EQ(a.duration_s, 240);
}

TEST(TraceFormats, GcpRowsBackInTimeReplaceTheRowsFromThatTimeOn) {
  const auto a = read_text(
      "2021-12-10, 13:07:45, 80\n2021-12-10, 13:08:45, 80\n2021-12-10, 13:09:45, 80\n"
      "2021-12-10, 13:08:45, 70\n2021-12-10, 13:09:45, 70\n2021-12-10, 13:10:45, 70\n"
      "2021-12-11, 00:00:05, 75\n");
  // t = 0 at 13:07:45; the re-polled log says 70 from 13:08:45 on; midnight is crossed.
  EXPECT_EQ(a.points, (Points{{0, 80}, {60, 70}, {10 * 3600 + 52 * 60 + 20, 75}}));
  EXPECT_DOUBLE_EQ(a.duration_s, 10 * 3600 + 52 * 60 + 20);
}

TEST(TraceFormats, AsgTakesIsoTimesAHeaderAndDecimalCounts) {
  const auto iso = read_text("timestamp,count\n2021-07-26T23:58:00Z,8\n2021-07-27T00:03:00Z,11\n");
  EXPECT_EQ(iso.points, (Points{{0, 8}, {300, 11}}));
  const auto metric = read_text("time,count\n2020-02-28 23:59:00,0.0\n2020-02-29 00:01:00,64.0\n2020-03-01 00:01:00,64.0\n");
  EXPECT_EQ(metric.points, (Points{{0, 0}, {120, 64}}));
  EXPECT_DOUBLE_EQ(metric.duration_s, 120 + 86400);  // 2020 is a leap year
}

TEST(TraceFormats, StepPlotsInSecondsOrHours) {
  const std::string plot = "0,0\r\n21529,0\r\n21529,4\r\n88194,8\r\n88194,7\r\n";
  EXPECT_EQ(read_text(plot, "step-seconds").points, (Points{{0, 0}, {21529, 4}, {88194, 7}}));
  const auto hours = read_text("0.000,0\r\n0.030,0\r\n0.030,9\r\n2.5,16\r\n", "step-hours");
  ASSERT_EQ(hours.points.size(), 3u);
  EXPECT_DOUBLE_EQ(hours.points[1].first, 108);
  EXPECT_EQ(hours.points[1].second, 9);
  EXPECT_DOUBLE_EQ(hours.duration_s, 9000);
}

TEST(TraceFormats, JsonEventsEndAtDoneOrAfterTheLastDuration) {
  const auto done = read_text(
      "[0, \"add\", {\"nodes\": [\"node-0\", \"node-1\", \"node-2\"]}]\n"
      "[60000, \"remove\", {\"nodes\": [\"node-1\"], \"required_tpt\": 0.6}]\n"
      "[90000, \"other\", {\"nodes\": []}]\n[120000, \"DONE\", {\"nodes\": []}]\n");
  EXPECT_EQ(done.points, (Points{{0, 3}, {60, 2}}));
  EXPECT_DOUBLE_EQ(done.duration_s, 120);
  const auto timed = read_text(
      "[0, \"add\", {\"nodes\": [\"a\", \"b\"], \"duration\": 60000, \"x\": [4, 8]}]\n"
      "[60000, \"no-op\", {\"nodes\": [], \"duration\": 60000}]\n");
  EXPECT_EQ(timed.points, (Points{{0, 2}}));
  EXPECT_DOUBLE_EQ(timed.duration_s, 120);
}

TEST(TraceFormats, AutoDetectsAllButPlainNumberPairs) {
  EXPECT_EQ(read_text("0,add,a\n").peak(), 1);
  EXPECT_EQ(read_text("2021-12-10, 13:07:45, 80\n").peak(), 80);
  EXPECT_EQ(read_text("2021-07-26T18:42:00Z,8\n").peak(), 8);
  EXPECT_EQ(read_text("[0, \"add\", {\"nodes\": [\"a\"]}]\n").peak(), 1);
  const auto msg = read_error("0,8\n", "auto");
  EXPECT_NE(msg.find("name the format: count, step-seconds or step-hours"), std::string::npos) << msg;
}

TEST(TraceErrors, ABadLineNamesTheFileTheLineAndTheExpectedForm) {
  std::string path;
  const auto msg = read_error("0,add,a\n\n60000,ad,b\n", "events", &path);
  EXPECT_EQ(msg.find(path + ":3: expected `t_ms,add|remove,node` (events format), got `60000,ad,b`"), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  EXPECT_NE(read_error("0,add,a\n60000,remove,b\n", "events").find(":2: expected a remove of a live node (`b` is not live)"),
            std::string::npos);
  EXPECT_NE(read_error("60000,3\n0,4\n", "count").find(":2: expected a time no earlier than the row before"),
            std::string::npos);
  EXPECT_NE(read_error("timestamp,number\n2021-07-26T18:47:00Z,1\n", "asg").find(":1: expected header `timestamp,count`"),
            std::string::npos);
  EXPECT_NE(read_error("2021-12-10, 25:00:00, 80\n", "gcp").find(":1: expected `YYYY-MM-DD, HH:MM:SS, count`"),
            std::string::npos);
  // Signed fields and days a month does not have (read before as 18:55 and as March 3rd).
  for (const char* row : {"2021-07-26T19:-5:00Z,8", "2021-07-26T-1:00:00Z,8", "2021-07-26T19:00:-3Z,8",
                          "2021-02-31T00:00:00Z,8", "2021-02-29T00:00:00Z,8", "2021-04-31T00:00:00Z,8"})
    EXPECT_NE(read_error(std::string("timestamp,count\n") + row + "\n", "asg").find(":2: expected"),
              std::string::npos)
        << row;
  EXPECT_EQ(read_text("timestamp,count\n2024-02-29T00:00:00Z,8\n2024-03-31T00:00:00Z,9\n", "asg").duration_s,
            31 * 86400.0);  // a leap day, and a month's 31st
  EXPECT_NE(read_error("[0, \"join\", {\"nodes\": []}]\n", "json-events").find(":1: expected `[t_ms"), std::string::npos);
  EXPECT_NE(read_error("0,2\n", "csv").find("unknown trace format `csv`; use one of: auto, events"), std::string::npos);
  EXPECT_NE(read_error("", "count").find("has no rows"), std::string::npos);
  EXPECT_THROW(read_trace("/nonexistent/trace.csv"), InvalidArgument);
}

// A replay steps through the trace's time: an infinite or absurd time would never end
// (`trireme simulate` hung on these).
TEST(TraceErrors, TimesThatAreNotFiniteOrBeyondTenYearsAreRefused) {
  const auto msg = read_error("[0, \"add\", {\"nodes\": [\"a\"]}]\n[1e999, \"DONE\", {\"nodes\": []}]\n", "json-events");
  EXPECT_NE(msg.find("beyond ten years or not finite; check the file's time unit and format"), std::string::npos) << msg;
  EXPECT_NE(read_error("0,1\n1e300,2\n", "count").find("beyond ten years"), std::string::npos);
  EXPECT_NE(read_error("0,1\n1e12,2\n", "step-hours").find("beyond ten years"), std::string::npos);
  EXPECT_EQ(read_error("0,1\n3600,2\n", "step-hours"), "");  // 150 days
}

TEST(TraceSynthetic, ATraceTooLargeToHoldIsRefused) {
  try {
    synthetic_trace(64, 1e6, 600, 3600, 1);
    FAIL() << "expected a refusal";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("lower the preemption rate or the duration (--hours)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(synthetic_trace(8, 0.5, 600, 1e12, 1), InvalidArgument);
  EXPECT_THROW(synthetic_trace(8, 0.5, std::numeric_limits<double>::infinity(), 3600, 1), InvalidArgument);
}

TEST(TraceSummary, CountsDropsRisesAndNodeHours) {
  const Availability a{"hand", {{0, 4}, {900, 1}, {1800, 3}, {2700, 2}}, 3600};
  const auto s = summarize(a);
  EXPECT_EQ(s.preemptions, 4);  // 3 at 900 s, 1 at 2700 s
  EXPECT_EQ(s.loss_instants, 2);
  EXPECT_EQ(s.additions, 2);
  EXPECT_EQ(s.min_live, 1);
  EXPECT_EQ(s.max_live, 4);
  EXPECT_EQ(s.final_live, 2);
  EXPECT_DOUBLE_EQ(s.node_hours, (4 + 1 + 3 + 2) * 0.25);
  EXPECT_DOUBLE_EQ(s.mean_live, 2.5);
}

TEST(TraceSynthetic, SameSeedSameTraceAndPreemptionsNearRateTimesNodeHours) {
  const double hours = 1000;
  const auto a = synthetic_trace(32, 0.5, 600, hours * 3600, 7);
  const auto b = synthetic_trace(32, 0.5, 600, hours * 3600, 7);
  EXPECT_EQ(a.points, b.points);
  EXPECT_NE(a.points, synthetic_trace(32, 0.5, 600, hours * 3600, 8).points);
  const auto s = summarize(a);
  EXPECT_EQ(a.points.front(), (std::pair<double, int>{0, 32}));
  EXPECT_LE(s.max_live, 32);
  EXPECT_GE(s.min_live, 0);
  // About 14,800 preemptions (sd about 120): a 5% bound is many deviations wide.
  EXPECT_NEAR(s.preemptions, 0.5 * s.node_hours, 0.05 * 0.5 * s.node_hours);
  // A slot is up 2 h and down 10 min on average: 32 * 120 / 130 nodes live.
  EXPECT_NEAR(s.mean_live, 32.0 * 120 / 130, 0.3);
}

TEST(TraceSynthetic, NoPreemptionRateGivesAConstantTrace) {
  const auto a = synthetic_trace(8, 0, 600, 3600, 1);
  EXPECT_EQ(a.points, (Points{{0, 8}}));
  EXPECT_DOUBLE_EQ(a.duration_s, 3600);
  EXPECT_THROW(synthetic_trace(8, -1, 600, 3600, 1), InvalidArgument);
}

TEST(TraceDir, EnvironmentOverridesTheFolderBesideTheSources) {
  const char* saved = std::getenv("TRIREME_TRACES");
  const std::string keep = saved == nullptr ? "" : saved;
  ::unsetenv("TRIREME_TRACES");
  EXPECT_EQ(trireme::plan::default_trace_dir("/src/trireme"), "/src/trireme/../shared/traces");
  ::setenv("TRIREME_TRACES", "/data/traces", 1);
  EXPECT_EQ(trireme::plan::default_trace_dir("/src/trireme"), "/data/traces");
  if (saved == nullptr) {
    ::unsetenv("TRIREME_TRACES");
  } else {
    ::setenv("TRIREME_TRACES", keep.c_str(), 1);
  }
}

TEST(TraceReal, EveryCountSeriesParsesAndTheOthersAreNamed) {
  const auto dir = trace_dir();
  if (dir.empty()) GTEST_SKIP() << "no ../shared/traces (set TRIREME_TRACES)";
  int read = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const auto rel = std::filesystem::relative(entry.path(), dir).string();
    const auto format = trace_format_of(rel);
    const auto name = entry.path().filename().string();
    if (format.empty()) {
      const bool known = name == "LICENSE" || name == "README.md" || name == "full-64-additions-trace.csv" ||
                         name == "full-64-terminate-trace.csv" || name == "full-64-found-preemptions.csv";
      EXPECT_TRUE(known) << rel << " has no format";
      continue;
    }
    try {
      const auto a = read_trace(entry.path().string(), format);
      EXPECT_GT(a.peak(), 0) << rel;
      // Auto-detection agrees, except where two plain numbers a row need the format named.
      if (format != "count" && format.rfind("step-", 0) != 0) {
        EXPECT_EQ(read_trace(entry.path().string()).points, a.points) << rel;
      }
      ++read;
    } catch (const InvalidArgument& e) {
      ADD_FAILURE() << rel << " (" << format << "): " << e.what();
    }
  }
  EXPECT_GE(read, 48);  // the 48 count series of the README
}

TEST(TraceReal, FactsTheReadmeStates) {
  const auto dir = trace_dir();
  if (dir.empty()) GTEST_SKIP() << "no ../shared/traces (set TRIREME_TRACES)";
  const auto load = [&](const std::string& rel) { return read_trace(dir + "/" + rel, trace_format_of(rel)); };

  const auto p3 = load("bamboo/aws-2021-12/p3-trace.csv");
  const auto p3s = summarize(p3);
  EXPECT_EQ(p3.peak(), 32);
  EXPECT_EQ(p3.final_live(), 10);
  EXPECT_NEAR(p3.duration_s / 3600, 11.37, 0.005);
  EXPECT_EQ(p3s.preemptions, 167);
  EXPECT_EQ(p3s.additions + p3.points.front().second, 177);  // adds at t = 0 are the start
  EXPECT_EQ(load("parcae/p3-count.csv").points, p3.points);

  const auto g4dn = load("bamboo/aws-2021-12/g4dn-trace.csv");
  EXPECT_EQ(g4dn.peak(), 24);
  EXPECT_EQ(g4dn.final_live(), 5);
  EXPECT_EQ(summarize(g4dn).preemptions, 74);
  EXPECT_EQ(summarize(g4dn).additions, 79);
  EXPECT_NEAR(g4dn.duration_s / 3600, 10.77, 0.005);

  const auto a100 = summarize(load("bamboo/gcp-2021-12/a100x1-east1b.txt"));
  EXPECT_EQ(a100.min_live, 17);
  EXPECT_EQ(a100.max_live, 64);
  EXPECT_NEAR(a100.duration_s / 3600, 27, 0.1);
  const auto v100 = summarize(load("bamboo/gcp-2021-12/v100x1-east1c.txt"));
  EXPECT_EQ(v100.min_live, 30);
  EXPECT_EQ(v100.max_live, 80);

  const auto asg = load("bamboo/aws-asg-2021/full-64-node-trace.csv");
  EXPECT_EQ(asg.peak(), 75);
  EXPECT_EQ(asg.final_live(), 0);
  EXPECT_DOUBLE_EQ(asg.duration_s, (5 * 60 + 55) * 60);  // 18:42 to 00:37
  EXPECT_EQ(load("bamboo/aws-asg-2021/preempt-trace-2021-09-17-GroupInServiceInstances.csv").peak(), 64);
  EXPECT_EQ(load("bamboo/aws-asg-2021/preempt-trace-2021-09-17-GroupTotalInstances.csv").peak(), 72);
  EXPECT_NEAR(load("bamboo/aws-2020-11/aws-spot-instances-p2-xlarge-2020-11-20-to-2020-11-23.csv").duration_s / 86400,
              3.7, 0.05);

  // Parcae's 1-hour windows: counts range and nodes removed as stated, and each equals
  // the p3 trace from its start hour on, minute by minute.
  struct Window { const char* file; double start_h; int lo, hi, removed; };
  for (const Window w : {Window{"trace_hh_55_65.txt", 5.5, 20, 32, 19}, Window{"trace_hl_15_25.txt", 1.5, 23, 32, 11},
                         Window{"trace_lh_80_90.txt", 8.0, 11, 24, 18}, Window{"trace_ll_10_11.txt", 10, 14, 18, 4}}) {
    SCOPED_TRACE(w.file);
    const auto seg = load(std::string("parcae/segments-32node/") + w.file);
    const auto s = summarize(seg);
    EXPECT_EQ(s.min_live, w.lo);
    EXPECT_EQ(s.max_live, w.hi);
    EXPECT_EQ(s.preemptions, w.removed);
    EXPECT_DOUBLE_EQ(seg.duration_s, 3600);
    for (int minute = 0; minute < 60; ++minute)
      EXPECT_EQ(seg.live_at(60.0 * minute), p3.live_at(w.start_h * 3600 + 60.0 * minute)) << minute;
  }

  // Oobleck's synthetic lists: 30 nodes at t = 0, then 15 removals.
  const auto five = summarize(load("oobleck/synthetic/5m.csv"));
  EXPECT_EQ(five.max_live, 30);
  EXPECT_EQ(five.preemptions, 15);
  EXPECT_EQ(five.final_live, 15);
  // The net count stays within 15-30 as the README says; at instants where a node is removed
  // at 15 and another added, the replay dips to 14 for 1 ms.
  const auto scaled = summarize(load("oobleck/scaled/scale_p3-trace.csv"));
  EXPECT_EQ(scaled.min_live, 14);
  EXPECT_EQ(scaled.max_live, 30);
  // gcp: 72 remove rows, 24 of them at an instant with an add.
  EXPECT_EQ(summarize(load("oobleck/scaled/scale_gcp-trace.csv")).preemptions, 72);
}
